//go:build linux

package boltstore

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// The owner's marker is found only where its owner alone could have put it:
// the rows are what a reaper may find in place of a marker.
func TestJobAuthority(t *testing.T) {
	m := proc.Marker{Pid: 4242, Start: 987654, PidNS: 4026531836}
	me := os.Getuid()
	const other = 4321 // a uid that is not the caller's
	for _, tc := range []struct {
		name  string
		root  bool                                     // needs root (files of another uid)
		setup func(t *testing.T, s *Store, dir string) // dir: the bells directory
		uid   int
		ok    bool
	}{
		{"the owner's marker", false, func(t *testing.T, s *Store, dir string) { mark(t, s, "t1", m) }, me, true},
		{"no marker", false, func(t *testing.T, s *Store, dir string) { mark(t, s, "t2", m) }, me, false},
		{"removed after the release", false, func(t *testing.T, s *Store, dir string) { mark(t, s, "t1", m)() }, me, false},
		{"asked under another uid", false, func(t *testing.T, s *Store, dir string) { mark(t, s, "t1", m) }, other, false},
		{"a symlink to a marker", false, func(t *testing.T, s *Store, dir string) {
			mark(t, s, "t2", m)
			must(t, os.Symlink("t2.job", filepath.Join(dir, strconv.Itoa(me), "t1.job")))
		}, me, false},
		{"a hard link to a marker", false, func(t *testing.T, s *Store, dir string) {
			mark(t, s, "t2", m)
			must(t, os.Link(filepath.Join(dir, strconv.Itoa(me), "t2.job"), filepath.Join(dir, strconv.Itoa(me), "t1.job")))
		}, me, false},
		{"a named pipe", false, func(t *testing.T, s *Store, dir string) {
			mark(t, s, "t2", m)
			must(t, unix.Mkfifo(filepath.Join(dir, strconv.Itoa(me), "t1.job"), 0o600))
		}, me, false},
		{"malformed", false, func(t *testing.T, s *Store, dir string) {
			mark(t, s, "t2", m)
			must(t, os.WriteFile(filepath.Join(dir, strconv.Itoa(me), "t1.job"), []byte("4242:0:1\n"), 0o600))
		}, me, false},
		{"oversized", false, func(t *testing.T, s *Store, dir string) {
			mark(t, s, "t2", m)
			must(t, os.WriteFile(filepath.Join(dir, strconv.Itoa(me), "t1.job"), []byte(m.String()+"\n"+string(make([]byte, 1<<20))), 0o600))
		}, me, false},
		{"another uid's file in the owner's directory", true, func(t *testing.T, s *Store, dir string) {
			mark(t, s, "t1", m)
			must(t, os.Lchown(filepath.Join(dir, strconv.Itoa(me), "t1.job"), other, other))
		}, me, false},
		{"the owner's file in a directory not the owner's", true, func(t *testing.T, s *Store, dir string) {
			mark(t, s, "t1", m)
			must(t, os.Rename(filepath.Join(dir, strconv.Itoa(me)), filepath.Join(dir, strconv.Itoa(other))))
			must(t, os.Lchown(filepath.Join(dir, strconv.Itoa(other), "t1.job"), other, other))
		}, other, false},
		{"another uid's marker in its own directory", true, func(t *testing.T, s *Store, dir string) {
			mark(t, s, "t1", m)
			must(t, os.Rename(filepath.Join(dir, strconv.Itoa(me)), filepath.Join(dir, strconv.Itoa(other))))
			must(t, os.Lchown(filepath.Join(dir, strconv.Itoa(other)), other, other))
			must(t, os.Lchown(filepath.Join(dir, strconv.Itoa(other), "t1.job"), other, other))
		}, other, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && me != 0 {
				t.Skip("needs root to make another uid's files")
			}
			s, _, path := newTestStore(t, Options{})
			tc.setup(t, s, bellDir(path))
			got, ok := s.JobAuthority(tc.uid, "t1")
			if ok != tc.ok || (ok && got != m) {
				t.Errorf("JobAuthority(%d, t1) = %v, %v; want %v", tc.uid, got, ok, tc.ok)
			}
		})
	}
	s, _, _ := newTestStore(t, Options{})
	for _, id := range []string{"", "../t1", "t1.job"} {
		if _, err := s.MarkJob(id, m); err == nil {
			t.Errorf("MarkJob(%q) = nil error, want the id refused", id)
		}
	}
}

func mark(t *testing.T, s *Store, id string, m proc.Marker) func() {
	t.Helper()
	unmark, err := s.MarkJob(id, m)
	if err != nil {
		t.Fatalf("MarkJob(%s): %v", id, err)
	}
	t.Cleanup(unmark)
	return unmark
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Case 6 through the store: a job left a daemon and ended normally (its
// marker removed after the release); a member writes its ticket back with a
// dead supervisor pid and no group. Neither a reap nor an admission into
// the full limit kills the daemon: nothing but the ticket says it is an
// orphan. (Before, both killed it.)
func TestReplayedTicketKillsNobody(t *testing.T) {
	ctx := context.Background()
	s := deathStore(t, nil)
	job := deathJob(t, "h")
	unmark := deathMark(t, s, "h", job.Pid)
	unmark() // the job's supervisor released the ticket and removed its marker
	gone, goneStart := deathEmptyGroup(t)
	deathEnqueue(t, s, "h", "x", 1, deathHolder(gone, goneStart, 0, 0)) // the replayed ticket
	if w := deathEnqueue(t, s, "w", "x", 1, selfHolder(t, 0, 0)); w.State != store.Waiting {
		t.Errorf("w: %s, want waiting behind the replayed ticket (left to its TTL)", w.State)
	}
	if rs, err := s.Reap(ctx, store.ReapOptions{}); err != nil || len(rs) != 0 {
		t.Errorf("Reap = %+v, %v; want nothing", rs, err)
	}
	if n := deathMembers(job.Pid); n != 2 {
		t.Errorf("the daemon of a released job was signalled: %d running members, want 2", n)
	}
}

// A marker goes with its ticket (here its release; a reap and an expiry
// remove tickets the same way), and only its own.
func TestJobMarkerGoesWithItsTicket(t *testing.T) {
	ctx := context.Background()
	s, _, path := newTestStore(t, Options{})
	m := proc.Marker{Pid: 4242, Start: 987654, PidNS: 4026531836}
	a := mustEnqueue(t, s, req("a", "x", 2))
	mark(t, s, "a", m)
	mustEnqueue(t, s, req("b", "x", 2))
	mark(t, s, "b", m)
	if ok, err := s.Release(ctx, a, store.Released); err != nil || !ok {
		t.Fatalf("Release(a) = %v, %v", ok, err)
	}
	if _, ok := s.JobAuthority(os.Getuid(), "a"); ok {
		t.Errorf("a's marker after its release: still there")
	}
	if _, ok := s.JobAuthority(os.Getuid(), "b"); !ok {
		t.Errorf("b's marker went with a's ticket")
	}
	if _, err := os.Lstat(filepath.Join(bellDir(path), strconv.Itoa(os.Getuid()), "b.job")); err != nil {
		t.Errorf("b's marker: %v", err)
	}
}
