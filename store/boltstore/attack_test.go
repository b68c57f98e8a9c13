//go:build linux

package boltstore

// The attack suite of SPEC §4.5 for the files of a bbolt store (issue 12,
// items 1, 2, 3, 4, 7 and 9): a member of the store's group (Alice) prepares
// an attack in a 2770 and in a 3770 directory, and a victim uses the store
// through this package's API: root (this test process), and Bob, another
// member (this very test binary, run as Bob in its helper mode). Nothing
// outside the store may be created, changed, chmodded or deleted, an
// operation on a hostile store fails with exit 69 naming the file, and
// nothing hangs.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/internal/attacktest"
	"github.com/slotctl/slotctl/store"
)

// TestMain runs one store operation and exits when the test binary is run
// as a helper (SLOTCTL_ATTACK set): the part of a victim or an attacker
// that runs as another user.
func TestMain(m *testing.M) {
	if v := os.Getenv("SLOTCTL_ATTACK"); v != "" {
		var o attackOp
		if err := json.Unmarshal([]byte(v), &o); err != nil {
			fmt.Fprintf(os.Stderr, "slotctl: helper: %v\n", err)
			os.Exit(2)
		}
		err := o.run()
		if err == nil {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "slotctl: %v\n", err)
		os.Exit(exitCodeOf(err))
	}
	os.Exit(m.Run())
}

func exitCodeOf(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, store.ErrCorrupt):
		return 69
	}
	return 1
}

// attackOp is one operation on a store, run in this process or in a helper.
type attackOp struct {
	Op     string        // enqueue, hold, wait, release, reap, snapshot, forge, race, watch-loop
	Store  string        // the store file
	ID     string        // ticket id
	Limit  string        // limit name
	TTL    time.Duration // ticket ttl (default a minute)
	Ready  string        // wait: a file made once the ticket waits
	Forge  string        // forge: "expired" or "waiting"
	Victim string        // race: what the racer points its symlinks at
	For    time.Duration // race, watch-loop: how long
	N      int           // watch-loop: at most this many rounds
}

func (o attackOp) env() []string {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	return []string{"SLOTCTL_ATTACK=" + string(b)}
}

func (o attackOp) run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if o.TTL == 0 {
		o.TTL = time.Minute
	}
	if o.Limit == "" {
		o.Limit = "x"
	}
	switch o.Op {
	case "race":
		return race(o)
	case "forge":
		return forge(o)
	}
	s, err := New(o.Store, Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	req := store.EnqueueRequest{ID: o.ID, Limit: o.Limit, Slots: 1, TTL: o.TTL, Holder: store.Holder{Host: "h", Pid: os.Getpid()}}
	switch o.Op {
	case "enqueue": // a whole job: watch, enqueue, release
		b, err := s.Watch(ctx, o.ID)
		if err != nil {
			return err
		}
		defer b.Close()
		t, err := s.Enqueue(ctx, req)
		if err != nil {
			return err
		}
		_, err = s.Release(ctx, t, store.Released)
		return err
	case "hold": // a ticket left behind by a job that died
		_, err := s.Enqueue(ctx, req)
		return err
	case "wait": // a waiter that stays
		b, err := s.Watch(ctx, o.ID)
		if err != nil {
			return err
		}
		defer b.Close()
		if _, err := s.Enqueue(ctx, req); err != nil {
			return err
		}
		if err := os.WriteFile(o.Ready, nil, 0o644); err != nil {
			return err
		}
		time.Sleep(time.Minute) // killed by the test
		return nil
	case "release":
		_, err := s.Release(ctx, store.Ticket{ID: o.ID}, store.ForceReleased)
		return err
	case "reap":
		_, err := s.Reap(ctx, false)
		return err
	case "snapshot":
		_, err := s.Snapshot(ctx)
		return err
	case "watch-loop":
		return watchLoop(ctx, s, o)
	}
	return fmt.Errorf("unknown helper op %q", o.Op)
}

// forge writes a ticket with a path for an id straight into the store file,
// as a member who can write the file can: expired (a reap removes it and
// deletes its bell) or waiting for a free slot (a promotion rings it).
func forge(o attackOp) error {
	db, err := bolt.Open(o.Store, 0o660, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	now := SystemClock{}.Now()
	r := ticketRec{V: formatVersion, ID: o.ID, Limit: o.Limit, State: store.Waiting, Fence: 1, Slot: -1, TTL: time.Hour,
		DeadlineBoot: now.Boot, DeadlineMono: now.Mono + time.Hour, Created: now.Wall, Holder: store.Holder{Host: "h", Pid: 1}}
	if o.Forge == "expired" {
		r.DeadlineBoot = "an-earlier-boot"
	}
	return db.Update(func(tx *bolt.Tx) error {
		q, err := tx.Bucket(bucketQueue).CreateBucketIfNotExists([]byte(o.Limit))
		if err != nil {
			return err
		}
		if err := q.Put(u64key(r.Fence), encode(&r)); err != nil {
			return err
		}
		return tx.Bucket(bucketIDs).Put([]byte(r.ID), encode(&idRec{V: formatVersion, Limit: o.Limit, Fence: r.Fence}))
	})
}

// race swaps, for o.For, every new entry of the bells directory (and of
// the directories in it) and the bells directory itself for symlinks to
// o.Victim: the race against a create-then-chmod by path (item 4).
func race(o attackOp) error {
	bells := bellDir(o.Store)
	end := time.Now().Add(o.For)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the directory
		defer wg.Done()
		for time.Now().Before(end) {
			if os.Remove(bells) == nil {
				_ = os.Symlink(o.Victim, bells)
				_ = os.Remove(bells)
			}
		}
	}()
	go func() { // its entries
		defer wg.Done()
		swap := func(p string) {
			if os.Remove(p) == nil {
				_ = os.Symlink(o.Victim, p)
			}
		}
		for time.Now().Before(end) {
			ents, _ := os.ReadDir(bells)
			for _, e := range ents {
				p := filepath.Join(bells, e.Name())
				switch e.Type() {
				case fs.ModeNamedPipe:
					swap(p)
				case fs.ModeDir:
					sub, _ := os.ReadDir(p)
					for _, e := range sub {
						if e.Type() == fs.ModeNamedPipe {
							swap(filepath.Join(p, e.Name()))
						}
					}
					_ = os.Remove(p)
					_ = os.Symlink(o.Victim, p)
				}
			}
		}
	}()
	wg.Wait()
	return nil
}

// watchLoop makes bells and rings them, o.N times or for o.For: the
// victim's side of the race. Failures are expected (the racer breaks the
// bells directory all the time); only what they touch counts.
func watchLoop(ctx context.Context, s *Store, o attackOp) error {
	end := time.Now().Add(o.For)
	for i := 0; i < o.N && time.Now().Before(end); i++ {
		id := fmt.Sprintf("%s-%d", o.ID, i)
		b, err := s.Watch(ctx, id)
		if err != nil {
			continue
		}
		t, err := s.Enqueue(ctx, store.EnqueueRequest{ID: id, Limit: o.Limit, Slots: 1, TTL: time.Minute})
		if err == nil {
			_, _ = s.Release(ctx, t, store.Released)
		}
		b.Close()
	}
	return nil
}

// --- the stage ---

// stage is one attack test's cast and the helper binary they run.
type stage struct {
	*attacktest.Env
	bin string
	n   int
}

func newStage(t *testing.T) *stage {
	e := attacktest.New(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &stage{Env: e, bin: e.Install(exe, "boltstore.test")}
}

// targets makes (or makes again, as they were) the victims of an attack:
// files in root's private directory and in Bob's home.
func (st *stage) targets(t *testing.T) attacktest.Victims {
	t.Helper()
	v := st.Targets(st.Bob)
	for _, p := range v.Missing {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	for _, p := range append(v.Empty, v.Full...) {
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// dir makes a fresh shared directory of mode.
func (st *stage) dir(mode uint32) string {
	st.n++
	return st.SharedDir(fmt.Sprintf("shared-%o-%d", mode, st.n), attacktest.Mode(mode))
}

// outcome is what a victim's operation did.
type outcome struct {
	code int    // exit code: 0, 69, 1; -1 when it hung
	msg  string // its error
}

// as runs o as u (another member) in the helper binary.
func (st *stage) as(t *testing.T, u attacktest.User, o attackOp) outcome {
	t.Helper()
	r := attacktest.Run(t, u.Command(st.Base, o.env(), st.bin, "-test.run=^$"), 20*time.Second)
	if r.TimedOut {
		t.Errorf("%s's %s hung (killed after 20s)", u.Name, o.Op)
		return outcome{code: -1}
	}
	return outcome{code: r.Code, msg: strings.TrimSpace(r.Stderr)}
}

// asRoot runs o in this process, as root.
func asRoot(t *testing.T, o attackOp) outcome {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- o.run() }()
	select {
	case err := <-done:
		if err == nil {
			return outcome{}
		}
		return outcome{code: exitCodeOf(err), msg: err.Error()}
	case <-time.After(20 * time.Second):
		t.Errorf("root's %s hung (still running after 20s)", o.Op)
		return outcome{code: -1}
	}
}

// victims are who fall for an attack: root and Bob.
func (st *stage) victims() []struct {
	name string
	do   func(t *testing.T, o attackOp) outcome
} {
	return []struct {
		name string
		do   func(t *testing.T, o attackOp) outcome
	}{
		{"root", asRoot},
		{"bob", func(t *testing.T, o attackOp) outcome { return st.as(t, st.Bob, o) }},
	}
}

var dirModes = []uint32{0o2770, 0o3770}

// refused checks that an operation failed with exit 69, saying one line that names name.
func refused(t *testing.T, what string, got outcome, name string) {
	t.Helper()
	if got.code != 69 || !strings.Contains(got.msg, name) || strings.Contains(got.msg, "\n") {
		t.Errorf("%s: exit %d, %q; want exit 69 and one line naming %s", what, got.code, got.msg, name)
	}
}

// --- item 1: a symlinked (or hard-linked) store file ---

func TestAttackSymlinkedStoreFile(t *testing.T) {
	st := newStage(t)
	for _, mode := range dirModes {
		for _, v := range st.victims() {
			t.Run(fmt.Sprintf("%o/%s", mode, v.name), func(t *testing.T) {
				targets := st.targets(t)
				for _, target := range targets.All {
					for _, op := range []string{"enqueue", "snapshot", "reap"} {
						dir := st.dir(mode)
						path := filepath.Join(dir, "slots.db")
						st.Alice.Sh(t, dir, "ln -s "+attacktest.Quote(target)+" slots.db")
						st.targets(t)
						snap := attacktest.Take(t, targets.All...)
						got := v.do(t, attackOp{Op: op, Store: path, ID: "t1"})
						refused(t, fmt.Sprintf("%s with slots.db -> %s", op, target), got, path)
						snap.Unchanged(t)
					}
				}
				// A hard link has two names: the other may be anybody's file.
				dir := st.dir(mode)
				path := filepath.Join(dir, "slots.db")
				st.Alice.Sh(t, dir, "touch "+attacktest.Quote(st.Alice.Home)+"/linked && ln "+attacktest.Quote(st.Alice.Home)+"/linked slots.db")
				snap := attacktest.Take(t, filepath.Join(st.Alice.Home, "linked"))
				refused(t, "enqueue with a hard-linked slots.db", v.do(t, attackOp{Op: "enqueue", Store: path, ID: "t1"}), path)
				snap.Unchanged(t)
			})
		}
	}
}

// --- item 7: a named pipe at the store path ---

func TestAttackFIFOStoreFile(t *testing.T) {
	st := newStage(t)
	for _, mode := range dirModes {
		for _, v := range st.victims() {
			t.Run(fmt.Sprintf("%o/%s", mode, v.name), func(t *testing.T) {
				for _, op := range []string{"reap", "snapshot", "enqueue"} {
					dir := st.dir(mode)
					path := filepath.Join(dir, "slots.db")
					st.Alice.Sh(t, dir, "mkfifo -m 660 slots.db")
					start := time.Now()
					got := v.do(t, attackOp{Op: op, Store: path, ID: "t1"})
					refused(t, op+" with a named pipe at slots.db", got, path)
					if d := time.Since(start); d > 5*time.Second {
						t.Errorf("%s took %v on a named pipe, want no wait", op, d)
					}
				}
			})
		}
	}
}

// --- item 9: the lock file and the directory ---

func TestAttackLockFile(t *testing.T) {
	st := newStage(t)
	for _, mode := range dirModes {
		for _, v := range st.victims() {
			t.Run(fmt.Sprintf("%o/%s", mode, v.name), func(t *testing.T) {
				targets := st.targets(t)
				for _, target := range targets.All {
					dir := st.dir(mode)
					path := filepath.Join(dir, "slots.db")
					st.Alice.Sh(t, dir, "ln -s "+attacktest.Quote(target)+" slots.db.lock")
					st.targets(t)
					snap := attacktest.Take(t, targets.All...)
					refused(t, "enqueue with slots.db.lock -> "+target, v.do(t, attackOp{Op: "enqueue", Store: path, ID: "t1"}), path+".lock")
					snap.Unchanged(t)
				}
				dir := st.dir(mode)
				path := filepath.Join(dir, "slots.db")
				st.Alice.Sh(t, dir, "mkfifo -m 660 slots.db.lock")
				refused(t, "enqueue with a named pipe at slots.db.lock", v.do(t, attackOp{Op: "enqueue", Store: path, ID: "t1"}), path+".lock")

				// The store directory named through a symlink a member made.
				dir = st.dir(mode)
				st.Alice.Sh(t, dir, "ln -s "+attacktest.Quote(filepath.Dir(targets.Full[0]))+" store")
				path = filepath.Join(dir, "store", "slots.db")
				snap := attacktest.Take(t, path, path+".lock", path+".bells")
				refused(t, "enqueue in a symlinked store directory", v.do(t, attackOp{Op: "enqueue", Store: path, ID: "t1"}), filepath.Join(dir, "store"))
				snap.Unchanged(t)
			})
		}
	}
}

// A store directory anyone may write to, without the sticky bit, is refused
// with one line naming it; with the sticky bit it is used.
func TestAttackWorldWritableDirectory(t *testing.T) {
	st := newStage(t)
	for _, v := range st.victims() {
		t.Run(v.name, func(t *testing.T) {
			for _, mode := range []uint32{0o777, 0o2777, 0o1777} {
				dir := st.dir(mode)
				path := filepath.Join(dir, "slots.db")
				got := v.do(t, attackOp{Op: "enqueue", Store: path, ID: "t1"})
				if mode&0o1000 != 0 {
					if got.code != 0 {
						t.Errorf("enqueue in a %o directory: exit %d, %s; want it used", mode, got.code, got.msg)
					}
					continue
				}
				refused(t, fmt.Sprintf("enqueue in a %o directory", mode), got, dir)
				if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("a refused %o directory got a store file (%v)", mode, err)
				}
			}
		})
	}
}

// --- item 2: ids from the store used as paths ---

func TestAttackRecordIDPaths(t *testing.T) {
	st := newStage(t)
	for _, mode := range dirModes {
		for _, v := range st.victims() {
			t.Run(fmt.Sprintf("%o/%s", mode, v.name), func(t *testing.T) {
				targets := st.targets(t)
				for _, target := range append(targets.Empty, targets.Full...) {
					for _, how := range []struct{ forge, op string }{{"expired", "reap"}, {"waiting", "enqueue"}} {
						dir := st.dir(mode)
						path := filepath.Join(dir, "slots.db")
						if r := st.as(t, st.Alice, attackOp{Op: "enqueue", Store: path, ID: "a1"}); r.code != 0 {
							t.Fatalf("alice's enqueue: %+v", r)
						}
						// Today's bells are <dir>/slots.db.bells/<id>: up two is the base.
						id := "../../" + strings.TrimPrefix(target, st.Base+"/")
						if r := st.as(t, st.Alice, attackOp{Op: "forge", Store: path, ID: id, Forge: how.forge}); r.code != 0 {
							t.Fatalf("alice's forge: %+v", r)
						}
						st.targets(t)
						snap := attacktest.Take(t, targets.All...)
						got := v.do(t, attackOp{Op: how.op, Store: path, ID: "v1"})
						if got.code != 69 || !strings.Contains(got.msg, path) || !strings.Contains(got.msg, "corrupt") {
							t.Errorf("%s over a %s ticket with id %q: exit %d, %q; want exit 69, corrupt, naming %s", how.op, how.forge, id, got.code, got.msg, path)
						}
						snap.Unchanged(t)
					}
				}
			})
		}
	}
}

// --- item 3: bells through symlinks ---

func TestAttackBellSymlinks(t *testing.T) {
	st := newStage(t)
	for _, mode := range dirModes {
		for _, v := range st.victims() {
			t.Run(fmt.Sprintf("%o/%s", mode, v.name), func(t *testing.T) {
				targets := st.targets(t)

				// Alice's waiter's bell swapped for a symlink: the promotion rings it.
				for _, target := range targets.All {
					dir := st.dir(mode)
					path := filepath.Join(dir, "slots.db")
					if r := st.as(t, st.Alice, attackOp{Op: "hold", Store: path, ID: "h1", TTL: time.Hour}); r.code != 0 {
						t.Fatalf("alice's hold: %+v", r)
					}
					stop := st.waiter(t, attackOp{Op: "wait", Store: path, ID: "w1", Ready: filepath.Join(dir, "ready")})
					bell := findEntry(t, bellDir(path), "w1")
					st.Alice.Sh(t, dir, "rm "+attacktest.Quote(bell)+" && ln -s "+attacktest.Quote(target)+" "+attacktest.Quote(bell))
					st.targets(t)
					snap := attacktest.Take(t, targets.All...)
					if got := v.do(t, attackOp{Op: "release", Store: path, ID: "h1"}); got.code != 0 {
						t.Errorf("release of the holder: exit %d, %s", got.code, got.msg)
					}
					snap.Unchanged(t)
					stop()
				}

				// The bells directory (or Alice's own directory in it) swapped
				// for a symlink to a victim's directory, and dead tickets named
				// like the files there: the reap rings and deletes their bells.
				for i, victimDir := range []string{filepath.Dir(targets.Full[0]), filepath.Dir(targets.Full[1])} {
					for _, which := range []string{"bells", "user"} {
						dir := st.dir(mode)
						path := filepath.Join(dir, "slots.db")
						for _, f := range []string{targets.Missing[i], targets.Empty[i], targets.Full[i]} {
							name := filepath.Base(f)
							if r := st.as(t, st.Alice, attackOp{Op: "enqueue", Store: path, ID: "a-" + name, Limit: "l-" + name}); r.code != 0 {
								t.Fatalf("alice's enqueue: %+v", r)
							}
							if r := st.as(t, st.Alice, attackOp{Op: "hold", Store: path, ID: name, Limit: "l-" + name, TTL: time.Millisecond}); r.code != 0 {
								t.Fatalf("alice's hold: %+v", r)
							}
						}
						link := bellDir(path)
						if which == "user" {
							link = filepath.Join(link, strconv.Itoa(int(st.Alice.Uid)))
						}
						st.Alice.Sh(t, dir, "rm -rf "+attacktest.Quote(link)+" && ln -s "+attacktest.Quote(victimDir)+" "+attacktest.Quote(link))
						time.Sleep(10 * time.Millisecond) // the holds expire
						st.targets(t)
						snap := attacktest.Take(t, targets.All...)
						if got := v.do(t, attackOp{Op: "reap", Store: path}); got.code != 0 {
							t.Errorf("reap: exit %d, %s", got.code, got.msg)
						}
						snap.Unchanged(t)
					}
				}
			})
		}
	}
}

// waiter starts o as Alice in the background and waits until its ticket
// waits; the returned func stops it.
func (st *stage) waiter(t *testing.T, o attackOp) func() {
	t.Helper()
	cmd := st.Alice.Command(filepath.Dir(o.Store), o.env(), st.bin, "-test.run=^$")
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(o.Ready); err == nil {
			return stop
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("alice's waiter did not get to wait")
		}
	}
}

// findEntry finds the entry called name under dir (its bell, wherever the
// layout puts it).
func findEntry(t *testing.T, dir, name string) string {
	t.Helper()
	var found string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == name {
			found = p
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no entry %s under %s", name, dir)
	}
	return found
}

// --- item 4: create-then-chmod races ---

func TestAttackCreateChmodRace(t *testing.T) {
	st := newStage(t)
	const rounds, budget = 200, 3 * time.Second
	for _, mode := range dirModes {
		for _, v := range st.victims() {
			t.Run(fmt.Sprintf("%o/%s", mode, v.name), func(t *testing.T) {
				targets := st.targets(t)
				victim := targets.Full[0]
				if v.name == "bob" {
					victim = targets.Full[1]
				}
				dir := st.dir(mode)
				path := filepath.Join(dir, "slots.db")
				snap := attacktest.Take(t, targets.All...)
				racer := st.Alice.Command(dir, attackOp{Op: "race", Store: path, Victim: victim, For: budget}.env(), st.bin, "-test.run=^$")
				done := make(chan attacktest.Result, 1)
				go func() { done <- attacktest.Run(t, racer, 30*time.Second) }()
				time.Sleep(50 * time.Millisecond)
				v.do(t, attackOp{Op: "watch-loop", Store: path, ID: "r", N: rounds, For: budget})
				<-done
				snap.Unchanged(t)
			})
		}
	}
}
