//go:build linux

package boltstore

// The attack suite of docs/leases.md §4.5 for the files of a bbolt store:
// a member of the store's group (Alice) prepares an attack in a 2770 and
// in a 3770 directory, and a victim uses the store through this package's
// API: root (this test process), and Bob, another member (this very test
// binary, run as Bob in its helper mode). Nothing outside the store may
// be created, changed, chmodded or deleted, an operation on a hostile
// store fails with exit 69 naming the file, and nothing hangs.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/testkit/attacktest"
	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/internal/testkit/testguard"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
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
	os.Exit(testguard.Main(m))
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
	Sweep  bool          // sweep a dead waiter's bell however young
	// MakeDir: the store is at the caller's default location, whose
	// directory New makes.
	MakeDir bool
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
	if o.Sweep {
		sweepAge = 0
	}
	switch o.Op {
	case "race":
		return race(o)
	case "forge":
		return forge(o)
	}
	s, err := New(o.Store, Options{MakeDir: o.MakeDir}) // the production setting: no --store-timeout
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
	case "wait-ring": // a waiter that exits 0 once its bell rings
		b, err := s.Watch(ctx, o.ID)
		if err != nil {
			return err
		}
		defer b.Close()
		if t, err := s.Enqueue(ctx, req); err != nil || t.State != store.Waiting {
			return fmt.Errorf("enqueue: %v, %v; want waiting", t.State, err)
		}
		if err := os.WriteFile(o.Ready, nil, 0o644); err != nil {
			return err
		}
		select {
		case <-b.C():
			return nil
		case <-time.After(10 * time.Second):
			return fmt.Errorf("the bell of %s did not ring", o.ID)
		}
	case "release":
		_, err := s.Release(ctx, store.Ticket{ID: o.ID}, store.ForceReleased)
		return err
	case "reap":
		_, err := s.Reap(ctx, store.ReapOptions{})
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
	r := ticketRec{V: legacyVersion, Rec: policy.Rec{ID: o.ID, Limit: o.Limit, State: store.Waiting, Fence: 1, Slot: -1, TTL: time.Hour,
		DeadlineBoot: now.Boot, DeadlineMono: now.Mono + time.Hour, Created: now.Wall, Holder: store.Holder{Host: "h", Pid: 1}}}
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

// watchLoop makes bells and rings them, o.N times or for o.For, each time
// with a new Store as each slotctl run has: the victim's side of the race.
// Failures are expected (the racer breaks the bells directory all the time);
// only what they touch counts.
func watchLoop(ctx context.Context, _ *Store, o attackOp) error {
	end := time.Now().Add(o.For)
	for i := 0; i < o.N && time.Now().Before(end); i++ {
		s, err := New(o.Store, Options{MakeDir: o.MakeDir}) // the production setting: no --store-timeout
		if err != nil {
			continue
		}
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

// A storeVictim falls for an attack: it runs the operation as itself.
type storeVictim struct {
	name string
	do   func(t *testing.T, o attackOp) outcome
}

// victims are who fall for an attack: root and Bob.
func (st *stage) victims() []storeVictim {
	return []storeVictim{
		{"root", asRoot},
		{"bob", func(t *testing.T, o attackOp) outcome { return st.as(t, st.Bob, o) }},
	}
}

// eachCase runs fn as a subtest for every shared directory mode and victim.
func (st *stage) eachCase(t *testing.T, fn func(t *testing.T, mode uint32, v storeVictim)) {
	t.Helper()
	for _, mode := range dirModes {
		for _, v := range st.victims() {
			t.Run(fmt.Sprintf("%o/%s", mode, v.name), func(t *testing.T) { fn(t, mode, v) })
		}
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
	st.eachCase(t, func(t *testing.T, mode uint32, v storeVictim) {
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
		linked := filepath.Join(st.Alice.Home, "linked")
		snap := attacktest.Take(t, linked)
		opened := watchWrites(t, linked)
		refused(t, "enqueue with a hard-linked slots.db", v.do(t, attackOp{Op: "enqueue", Store: path, ID: "t1"}), path)
		snap.Unchanged(t)
		if opened() {
			t.Errorf("enqueue opened a hard-linked slots.db for writing")
		}
	})
}

// --- item 7: a named pipe at the store path ---

func TestAttackFIFOStoreFile(t *testing.T) {
	st := newStage(t)
	st.eachCase(t, func(t *testing.T, mode uint32, v storeVictim) {
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
		// A device (which only root can make: a stand-in for /dev/null)
		// is refused the same way.
		dir := st.dir(mode)
		path := filepath.Join(dir, "slots.db")
		if err := unix.Mknod(path, unix.S_IFCHR|0o660, int(unix.Mkdev(1, 3))); err != nil {
			t.Logf("NOT TESTED: a device at the store path (mknod: %v)", err)
			return
		}
		if err := os.Chown(path, int(st.Alice.Uid), int(st.Group)); err != nil {
			t.Fatal(err)
		}
		for _, op := range []string{"reap", "snapshot", "enqueue"} {
			refused(t, op+" with a device at slots.db", v.do(t, attackOp{Op: op, Store: path, ID: "t1"}), path)
		}
	})
}

// --- item 9: the lock file and the directory ---

func TestAttackLockFile(t *testing.T) {
	st := newStage(t)
	st.eachCase(t, func(t *testing.T, mode uint32, v storeVictim) {
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
		got := v.do(t, attackOp{Op: "enqueue", Store: path, ID: "t1"})
		refused(t, "enqueue in a symlinked store directory", got, filepath.Join(dir, "store"))
		if !strings.Contains(got.msg, "symbolic link") {
			t.Errorf("enqueue in a symlinked store directory: %q does not say it is a symbolic link", got.msg)
		}
		snap.Unchanged(t)
	})
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
	st.eachCase(t, func(t *testing.T, mode uint32, v storeVictim) {
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

// --- item 3: bells through symlinks ---

func TestAttackBellSymlinks(t *testing.T) {
	st := newStage(t)
	st.eachCase(t, func(t *testing.T, mode uint32, v storeVictim) {
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

		// Alice's bell swapped for a regular file (here her own, hard-linked
		// from her home): the promotion neither writes it nor even opens it
		// for writing (inotify sees every close of a written-to descriptor).
		{
			dir := st.dir(mode)
			path := filepath.Join(dir, "slots.db")
			if r := st.as(t, st.Alice, attackOp{Op: "hold", Store: path, ID: "h1", TTL: time.Hour}); r.code != 0 {
				t.Fatalf("alice's hold: %+v", r)
			}
			stop := st.waiter(t, attackOp{Op: "wait", Store: path, ID: "w1", Ready: filepath.Join(dir, "ready")})
			bell := findEntry(t, bellDir(path), "w1")
			own := filepath.Join(st.Alice.Home, "plain")
			st.Alice.Sh(t, dir, "echo mine > "+attacktest.Quote(own)+" && chmod 666 "+attacktest.Quote(own)+
				" && rm "+attacktest.Quote(bell)+" && ln "+attacktest.Quote(own)+" "+attacktest.Quote(bell))
			opened := watchWrites(t, own)
			snap := attacktest.Take(t, own)
			if got := v.do(t, attackOp{Op: "release", Store: path, ID: "h1"}); got.code != 0 {
				t.Errorf("release of the holder: exit %d, %s", got.code, got.msg)
			}
			if opened() {
				t.Errorf("the promotion opened a regular file at the bell's name for writing")
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

// waiter starts o as Alice in the background and waits until its ticket
// waits; the returned func stops it.
func (st *stage) waiter(t *testing.T, o attackOp) func() {
	t.Helper()
	stop, _ := st.waiterAs(t, st.Alice, o)
	return stop
}

// waiterAs starts o as u in the background and waits until its ticket
// waits. stop kills it; wait waits (at most 15 s) for its exit code.
func (st *stage) waiterAs(t *testing.T, u attacktest.User, o attackOp) (stop func(), wait func() int) {
	t.Helper()
	cmd := u.Command(st.Base, o.env(), st.bin, "-test.run=^$")
	cmd.SysProcAttr.Setpgid = true
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan int, 1)
	go func() { _ = cmd.Wait(); exited <- cmd.ProcessState.ExitCode() }()
	var once sync.Once
	code, killed := -1, false
	wait = func() int {
		once.Do(func() {
			select {
			case code = <-exited:
			case <-time.After(15 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
			}
			if code != 0 && !killed {
				t.Logf("%s's %s: exit %d: %s", u.Name, o.Op, code, stderr.String())
			}
		})
		return code
	}
	stop = func() { killed = true; _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); wait() }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(o.Ready); err == nil {
			return stop, wait
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("%s's waiter did not get to wait", u.Name)
		}
	}
}

// watchWrites watches path with inotify; opened reports whether anything
// opened it for writing since (and closed it), or wrote to it.
func watchWrites(t *testing.T, path string) (opened func() bool) {
	t.Helper()
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(in, path, unix.IN_CLOSE_WRITE|unix.IN_MODIFY); err != nil {
		unix.Close(in)
		t.Fatal(err)
	}
	return func() bool {
		defer unix.Close(in)
		buf := make([]byte, 4096)
		n, _ := unix.Read(in, buf)
		return n > 0
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
	// The long suite races for 2 s a case; the fast one for a fraction.
	rounds, budget := longtest.Pick(30, 200), longtest.Pick(300*time.Millisecond, 2*time.Second)
	for _, mode := range dirModes {
		for _, v := range st.victims() {
			for _, bells := range []string{"", "alice's bells"} {
				t.Run(fmt.Sprintf("%o/%s/%s", mode, v.name, bells), func(t *testing.T) {
					targets := st.targets(t)
					victim := targets.Full[0]
					if v.name == "bob" {
						victim = targets.Full[1]
					}
					dir := st.dir(mode)
					path := filepath.Join(dir, "slots.db")
					if bells != "" { // made by Alice, who may then rename what others make in it
						st.Alice.Sh(t, dir, "mkdir -m 2770 slots.db.bells")
					}
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
}

// --- the layouts the attacks must not break ---

// packaged makes the directory the packages ship: 3770 root:group, with the
// store file (empty: bbolt initialises it), its lock and its bells directory
// made in advance, so that no member can replace them.
func (st *stage) packaged(t *testing.T) string {
	t.Helper()
	dir := st.dir(0o3770)
	for _, f := range []struct {
		name string
		mode uint32
		dir  bool
	}{{"slots.db", 0o660, false}, {"slots.db.lock", 0o660, false}, {"slots.db.bells", 0o3770, true}} {
		p := filepath.Join(dir, f.name)
		var err error
		if f.dir {
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, nil, 0o600)
		}
		if err == nil {
			err = os.Chown(p, 0, int(st.Group))
		}
		if err == nil {
			err = os.Chmod(p, attacktest.Mode(f.mode))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// In every layout a member's release wakes another member's waiter, and
// root's wakes a member's; a dead waiter's bell, which another member cannot
// remove, is swept by its owner's next Watch; root's reap removes it.
func TestSharedLayouts(t *testing.T) {
	st := newStage(t)
	for _, layout := range []string{"packaged", "2770", "3770"} {
		t.Run(layout, func(t *testing.T) {
			var dir string
			switch layout {
			case "packaged":
				dir = st.packaged(t)
			case "2770":
				dir = st.dir(0o2770)
			case "3770":
				dir = st.dir(0o3770)
			}
			path := filepath.Join(dir, "slots.db")
			ready := func(n string) string { return filepath.Join(dir, "ready-"+n) }
			mustDo := func(what string, got outcome) {
				t.Helper()
				if got.code != 0 {
					t.Fatalf("%s: exit %d, %s", what, got.code, got.msg)
				}
			}
			mustDo("alice holds", st.as(t, st.Alice, attackOp{Op: "hold", Store: path, ID: "h1", TTL: time.Hour}))

			// root rings Bob
			_, wait := st.waiterAs(t, st.Bob, attackOp{Op: "wait-ring", Store: path, ID: "b1", Ready: ready("b1")})
			mustDo("root releases", asRoot(t, attackOp{Op: "release", Store: path, ID: "h1"}))
			if code := wait(); code != 0 {
				t.Errorf("bob's waiter: exit %d, want its bell rung by root's release", code)
			}
			// Bob rings Alice
			_, wait = st.waiterAs(t, st.Alice, attackOp{Op: "wait-ring", Store: path, ID: "a1", Ready: ready("a1")})
			mustDo("bob releases", st.as(t, st.Bob, attackOp{Op: "release", Store: path, ID: "b1"}))
			if code := wait(); code != 0 {
				out, _ := exec.Command("sh", "-c", "ls -lanR "+attacktest.Quote(bellDir(path))).CombinedOutput()
				t.Errorf("alice's waiter: exit %d, want its bell rung by bob's release\n%s", code, out)
			}

			aliceBells := filepath.Join(bellDir(path), strconv.Itoa(int(st.Alice.Uid)))
			checkMode := func(p string, want uint32) {
				t.Helper()
				var s syscall.Stat_t
				if err := syscall.Lstat(p, &s); err != nil {
					t.Fatal(err)
				}
				if s.Mode&0o7777 != want || s.Uid != st.Alice.Uid || s.Gid != st.Group {
					t.Errorf("%s: mode %o uid %d gid %d; want %o, alice's, the group's", p, s.Mode&0o7777, s.Uid, s.Gid, want)
				}
			}
			// A waiter killed leaves its bell; Bob cannot remove it, Alice's next run does.
			stop, _ := st.waiterAs(t, st.Alice, attackOp{Op: "wait", Store: path, ID: "a2", Ready: ready("a2")})
			checkMode(aliceBells, 0o2750)
			checkMode(filepath.Join(aliceBells, "a2"), 0o620)
			stop()
			mustDo("bob releases alice's dead waiter", st.as(t, st.Bob, attackOp{Op: "release", Store: path, ID: "a2"}))
			if _, err := os.Lstat(filepath.Join(aliceBells, "a2")); err != nil {
				t.Fatalf("the dead waiter's bell: %v; bob should not have been able to remove it", err)
			}
			mustDo("alice runs again", st.as(t, st.Alice, attackOp{Op: "enqueue", Store: path, ID: "a3", Limit: "y", Sweep: true}))
			if _, err := os.Lstat(filepath.Join(aliceBells, "a2")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the dead waiter's bell after alice's next run: %v, want swept", err)
			}
			// Root's reap (or release) removes a dead waiter's bell itself.
			stop, _ = st.waiterAs(t, st.Alice, attackOp{Op: "wait", Store: path, ID: "a4", Ready: ready("a4")})
			stop()
			mustDo("root releases alice's dead waiter", asRoot(t, attackOp{Op: "release", Store: path, ID: "a4"}))
			if _, err := os.Lstat(filepath.Join(aliceBells, "a4")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the dead waiter's bell after root removed its ticket: %v, want removed", err)
			}
			if layout == "packaged" {
				var s syscall.Stat_t
				if err := syscall.Stat(path, &s); err != nil || s.Mode&0o777 != 0o660 || s.Uid != 0 || s.Size == 0 {
					t.Errorf("the packaged store file after use: %+v, %v; want root's, 0660, initialised", s, err)
				}
			}
		})
	}
}

// A member's store in its own private directory, made as the default
// location's is, works as it did.
func TestPrivateDirectoryAsMember(t *testing.T) {
	st := newStage(t)
	path := filepath.Join(st.Bob.Home, "state", "slots.db")
	if got := st.as(t, st.Bob, attackOp{Op: "enqueue", Store: path, ID: "b1", MakeDir: true}); got.code != 0 {
		t.Fatalf("bob's enqueue in his own directory: exit %d, %s", got.code, got.msg)
	}
	var s syscall.Stat_t
	for p, want := range map[string]uint32{filepath.Dir(path): 0o700, path: 0o600,
		bellDir(path): 0o700, filepath.Join(bellDir(path), strconv.Itoa(int(st.Bob.Uid))): 0o700} {
		if err := syscall.Stat(p, &s); err != nil || s.Mode&0o7777 != want || s.Uid != st.Bob.Uid {
			t.Errorf("%s: mode %o uid %d (%v); want %o, bob's", p, s.Mode&0o7777, s.Uid, err, want)
		}
	}
}

// A store directory named through a symlink of the caller's own, or root's,
// is used (nobody else could have planted it); one a member made for
// another user is refused (TestAttackLockFile).
func TestTrustedSymlinkedDirectory(t *testing.T) {
	st := newStage(t)
	real := filepath.Join(st.Bob.Home, "real")
	st.Bob.Sh(t, st.Bob.Home, "mkdir -m 700 real && ln -s real link")
	path := filepath.Join(st.Bob.Home, "link", "slots.db")
	if got := st.as(t, st.Bob, attackOp{Op: "enqueue", Store: path, ID: "b1"}); got.code != 0 {
		t.Fatalf("bob's enqueue through his own symlink: exit %d, %s", got.code, got.msg)
	}
	if _, err := os.Stat(filepath.Join(real, "slots.db")); err != nil {
		t.Fatalf("the store is not in the directory bob's link names: %v", err)
	}
	shared := st.dir(0o3770)
	link := filepath.Join(st.Base, "roots-link")
	if err := os.Symlink(shared, link); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(link, "slots.db")
	if got := st.as(t, st.Bob, attackOp{Op: "enqueue", Store: path, ID: "b2"}); got.code != 0 {
		t.Fatalf("bob's enqueue through root's symlink: exit %d, %s", got.code, got.msg)
	}
	// Alice's link in root's directory: refused for Bob and root alike.
	st.Alice.Sh(t, shared, "ln -s "+attacktest.Quote(real)+" alices")
	path = filepath.Join(shared, "alices", "slots.db")
	for _, v := range st.victims() {
		refused(t, v.name+"'s enqueue through alice's symlink", v.do(t, attackOp{Op: "enqueue", Store: path, ID: "b3"}), filepath.Join(shared, "alices"))
	}
}
