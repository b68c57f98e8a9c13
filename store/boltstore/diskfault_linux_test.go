//go:build linux

package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/internal/testkit/diskfault"
	"github.com/slotctl/slotctl/store"
)

// TestDiskFaults: every kind of write whose commit meets a real disk fault
// fails whole. On a full tmpfs the commit's first new page is ENOSPC; on a
// disk whose device fails every write (diskfault.Disk.Break) the commit's
// fsync is EIO. Either way the call returns the store's error
// (store.ErrUnavailable, one line naming the store and the cause, never
// ErrCorrupt), and a fresh open finds the store exactly as it was, key for
// key in every bucket (no ticket without its index, no counter without its
// event), and sound (bbolt's check, the store's own reads). After a broken
// disk, so does a copy of what reached the disk. Once there is room again,
// or the disk works, the same write succeeds and the store works. Each run
// is a child process in a mount namespace of its own (root only).
func TestDiskFaults(t *testing.T) {
	t.Run("ENOSPC", func(t *testing.T) {
		if !diskfault.InNamespace(t) {
			return
		}
		mnt := t.TempDir()
		diskfault.Tmpfs(t, mnt, 1<<20)
		for _, op := range diskOps() {
			t.Run(op.name, func(t *testing.T) {
				dir := filepath.Join(mnt, op.name)
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				defer os.RemoveAll(dir)
				path := filepath.Join(dir, "slots.db")
				clock := newClock()
				st, tk := diskState(t, path, clock)
				before := dumpStore(t, path)
				// Every page the next commit takes must be allocated:
				// bbolt's free pages and the file's slack become holes.
				holeFreePages(t, path)
				free := diskfault.Fill(t, mnt)
				err := op.do(context.Background(), st, clock, tk)
				checkFailedWhole(t, op.name, err, path, "no space left on device", before)
				free()
				checkWriteWorks(t, op, path, clock, tk, before)
			})
		}
		t.Run("first-write", func(t *testing.T) {
			dir := filepath.Join(mnt, "first")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			free := diskfault.Fill(t, mnt)
			checkFirstWrite(t, filepath.Join(dir, "slots.db"), "no space left on device", free)
		})
	})
	t.Run("EIO", func(t *testing.T) {
		if !diskfault.InNamespace(t) {
			return
		}
		diskfault.Ext2(t, t.TempDir(), 4<<20) // or skip all of them here
		mnt := t.TempDir()
		for _, op := range diskOps() {
			t.Run(op.name, func(t *testing.T) {
				disk := diskfault.Ext2(t, mnt, 4<<20)
				path := filepath.Join(mnt, "s", "slots.db")
				if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
					t.Fatal(err)
				}
				clock := newClock()
				st, tk := diskState(t, path, clock)
				before := dumpStore(t, path)
				disk.Break()
				err := op.do(context.Background(), st, clock, tk)
				checkFailedWhole(t, op.name, err, path, "input/output error", before)
				// What reached the disk, on a device that works.
				disk.Reattach()
				checkStore(t, "the disk after the failed write", path, before)
				checkWriteWorks(t, op, path, clock, tk, before)
			})
		}
		t.Run("first-write", func(t *testing.T) {
			disk := diskfault.Ext2(t, mnt, 4<<20)
			path := filepath.Join(mnt, "s", "slots.db")
			if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			disk.Break()
			checkFirstWrite(t, path, "input/output error", disk.Reattach)
		})
	})
}

// checkFirstWrite: the first write of a store, which makes its file, meets
// the fault: the store's error, the file left empty (an empty store) or
// not there; once fixed (fix), the store is empty and works.
func checkFirstWrite(t *testing.T, path, cause string, fix func()) {
	t.Helper()
	s, err := New(path, Options{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Enqueue(context.Background(), req("n", "a", 1))
	switch {
	case err == nil:
		t.Fatal("the first write on a failing disk: no error")
	case !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrCorrupt) ||
		!strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), cause):
		t.Errorf("the first write on a failing disk: %v, want store.ErrUnavailable naming %s and %q", err, path, cause)
	}
	t.Logf("first write: %v", err)
	if fi, err := os.Stat(path); err == nil && fi.Size() != 0 {
		t.Errorf("the first write on a failing disk left a file of %d bytes, want it empty (not half initialised)", fi.Size())
	}
	fix()
	if fi, err := os.Stat(path); err == nil && fi.Size() != 0 {
		t.Errorf("once fixed, the file has %d bytes, want it empty or not there", fi.Size())
	}
	s2, err := New(path, Options{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if snap, err := s2.Snapshot(context.Background()); err != nil || len(snap.Tickets) != 0 {
		t.Errorf("once fixed: snapshot %v, %d tickets; want an empty store", err, len(snap.Tickets))
	}
	if _, err := s2.Enqueue(context.Background(), req("n", "a", 1)); err != nil {
		t.Errorf("once fixed: enqueue: %v", err)
	}
	readsWork(t, "once fixed", path)
}

// A diskOp is one kind of write, on the store diskState makes.
type diskOp struct {
	name string
	do   func(ctx context.Context, s *Store, c *FakeClock, tk map[string]store.Ticket) error
}

func diskOps() []diskOp {
	prio := store.ByPriority
	return []diskOp{
		{"enqueue", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.Enqueue(ctx, req("n", "a", 1)) // waits behind w
			return err
		}},
		{"enqueue-new-limit", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.Enqueue(ctx, req("n", "new", 1)) // makes the limit, admitted
			return err
		}},
		{"enqueue-grows-file", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			r := req("n", "", 1)
			for i := range store.MaxLimits {
				r.Limits = append(r.Limits, fmt.Sprintf("many-%02d-%s", i, strings.Repeat("x", 100)))
			}
			r.Holder.Label = strings.Repeat("l", store.MaxLabel)
			r.Holder.Argv = []string{strings.Repeat("a", store.MaxCommand-1)}
			// Makes the limits and is admitted in each: more new pages than
			// the file has free, so bbolt grows it first (its errors there
			// keep only the errno's text).
			_, err := s.Enqueue(ctx, r)
			return err
		}},
		{"renew", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.Renew(ctx, tk["h"], testTTL)
			return err
		}},
		{"release", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.Release(ctx, tk["h"], store.Released) // admits w
			return err
		}},
		{"cancel", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.Cancel(ctx, tk["w"])
			return err
		}},
		{"set-child", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.SetChild(ctx, tk["h"], 4242, 7)
			return err
		}},
		{"reap", func(ctx context.Context, s *Store, c *FakeClock, _ map[string]store.Ticket) error {
			c.Advance(2 * testTTL) // every lease expires
			_, err := s.Reap(ctx, store.ReapOptions{})
			return err
		}},
		{"resize", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.Resize(ctx, tk["m"], 1) // admits x in b
			return err
		}},
		{"set-limit", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.SetLimit(ctx, "a", 2) // admits w
			return err
		}},
		{"set-policy", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			_, err := s.SetPolicy(ctx, "a", store.PolicyChange{Order: &prio})
			return err
		}},
		{"remove-limit", func(ctx context.Context, s *Store, _ *FakeClock, tk map[string]store.Ticket) error {
			return s.RemoveLimit(ctx, "d", true) // removes e
		}},
	}
}

// diskState makes a store at path, with room: limit a (1 slot) held by h
// with w waiting, m holding both slots of b and of c with x waiting in b,
// and e holding d's.
func diskState(t *testing.T, path string, clock *FakeClock) (*Store, map[string]store.Ticket) {
	t.Helper()
	s, err := New(path, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	for _, l := range []struct {
		name  string
		slots int
	}{{"a", 1}, {"b", 2}, {"c", 2}, {"d", 1}} {
		if _, err := s.SetLimit(ctx, l.name, l.slots); err != nil {
			t.Fatal(err)
		}
	}
	m := req("m", "", 2)
	m.Limits, m.Weight = []string{"b", "c"}, 2
	tk := map[string]store.Ticket{}
	for _, r := range []store.EnqueueRequest{req("h", "a", 1), req("w", "a", 1), m, req("x", "b", 2), req("e", "d", 1)} {
		tk[r.ID] = mustEnqueue(t, s, r)
	}
	return s, tk
}

// checkFailedWhole checks a write that met a disk fault: the store's error,
// and the store as it was.
func checkFailedWhole(t *testing.T, op string, err error, path, cause string, before map[string]string) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("%s on a failing disk: no error", op)
	case !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrCorrupt):
		t.Errorf("%s on a failing disk: %v, want store.ErrUnavailable (the store's, exit 69), not corrupt", op, err)
	case !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), cause) || strings.Contains(err.Error(), "\n"):
		t.Errorf("%s on a failing disk: %q, want one line naming %s and %q", op, err, path, cause)
	}
	t.Logf("%s: %v", op, err)
	checkStore(t, "after the failed "+op, path, before)
}

// checkStore opens the store afresh: bbolt's check passes, the store's
// reads work, and every bucket holds exactly what before says.
func checkStore(t *testing.T, when, path string, before map[string]string) {
	t.Helper()
	if diff := diskfault.Diff(before, dumpStore(t, path)); diff != "" {
		t.Errorf("%s, the store changed:\n%s", when, diff)
	}
	readsWork(t, when, path)
}

// checkWriteWorks: with the fault gone, the same write succeeds on a fresh
// store handle and changes the store, and the store stays sound and usable.
func checkWriteWorks(t *testing.T, op diskOp, path string, clock *FakeClock, tk map[string]store.Ticket, before map[string]string) {
	t.Helper()
	s, err := New(path, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := op.do(ctx, s, clock, tk); err != nil {
		t.Fatalf("%s once the fault is gone: %v", op.name, err)
	}
	if diskfault.Diff(before, dumpStore(t, path)) == "" {
		t.Errorf("%s once the fault is gone: the store did not change", op.name)
	}
	readsWork(t, "after "+op.name+" once the fault is gone", path)
	// And the rest of the protocol on it.
	z := mustEnqueue(t, s, req("z", "z", 1))
	if _, err := s.Renew(ctx, z, testTTL); err != nil {
		t.Errorf("renew once the fault is gone: %v", err)
	}
	if ok, err := s.Release(ctx, z, store.Released); !ok || err != nil {
		t.Errorf("release once the fault is gone: %v, %v", ok, err)
	}
	if _, err := s.Reap(ctx, store.ReapOptions{}); err != nil {
		t.Errorf("reap once the fault is gone: %v", err)
	}
	readsWork(t, "at the end", path)
}

// readsWork: bbolt's own check of the file, and the store's reads (which
// check every record they decode) on a fresh handle.
func readsWork(t *testing.T, when, path string) {
	t.Helper()
	rawView(t, path, func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			t.Errorf("%s: bbolt's check: %v", when, err)
		}
		return nil
	})
	s, err := New(path, Options{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Snapshot(ctx); err != nil {
		t.Errorf("%s: snapshot: %v", when, err)
	}
	if _, err := s.Counts(ctx); err != nil {
		t.Errorf("%s: counts: %v", when, err)
	}
	if _, err := s.Events(ctx, "", 1000); err != nil {
		t.Errorf("%s: events: %v", when, err)
	}
}

// dumpStore is every key of every bucket, nested ones too, with its value.
func dumpStore(t *testing.T, path string) map[string]string {
	t.Helper()
	d, err := diskfault.Dump(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return d
}

// holeFreePages punches holes where the store file holds no live page
// (diskfault.HoleFreePages): on a full tmpfs the next commit fails.
func holeFreePages(t *testing.T, path string) {
	t.Helper()
	n, err := diskfault.HoleFreePages(path)
	if err != nil {
		t.Fatalf("punch holes in %s: %v", path, err)
	}
	if n == 0 {
		t.Log("no free page and no slack: the next commit grows the file")
	}
}
