package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"golang.org/x/sys/unix"

	gh "github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
)

// A process that holds the store's lock (fault "store-lock"): a stalled
// slotctl or reaper in its write transaction, or an operator's ls stopped
// in its read, keeps the bbolt store's file lock (an flock on slots.db.lock,
// store/boltstore's lock.go: exclusive for writers, shared for readers) for
// a simulated while. The simulation really takes that flock. A call that
// needs the lock meanwhile asks the kernel for it without waiting, as the
// store's first try does (lock.go), and, refused, fails as the store's call
// fails once its timeout is over: store.ErrUnavailable, nothing run. It does
// not wait the timeout: no simulated time passes in a call, the run stays
// fast, and no thread is left blocked in the kernel. Holders meet an outage
// of their renewals, polls and releases; nothing else changes, and every
// rule must hold through it and after it.
//
// A supervisor whose release meets the lock ends its run with its ticket
// left to its lease (gate/holder tries a release once); what its job handed
// off that carries the ticket then keeps it past its lease on this store,
// as after a crash (orphaned, Judges.Keep).

// errLocked is what a call refused by the held lock returns, the same each
// time so that a run replays (the store's own error says how long it
// waited, in real time).
var errLocked = &store.LockTimeoutError{Path: "slots.db", Waited: boltTimeout}

// A storeLock is the lock a stalled process holds.
type storeLock struct {
	f         *os.File
	exclusive bool
	until     time.Duration // on the store's clock
	who       string
}

// lockStore is a store handle that meets the held lock: with it held, each
// call that needs the lock waits lockWait of real time for it, and its
// failure reads errLocked. The handle is given to every actor; the model's
// checker reads past the lock (it is no process of the host).
type lockStore struct {
	store.Store
	b *Bolt
}

// blocked reports whether a call (a writer's, or a reader's) would wait for
// the lock now: the kernel refuses it the lock (flock with LOCK_NB).
func (l lockStore) blocked(write bool) bool {
	lk := l.b.lock
	if lk == nil || !write && !lk.exclusive {
		return false
	}
	f, err := os.OpenFile(l.b.path+".lock", os.O_RDWR, 0)
	if err != nil {
		return true
	}
	defer f.Close()
	how := unix.LOCK_SH
	if write {
		how = unix.LOCK_EX
	}
	return unix.Flock(int(f.Fd()), how|unix.LOCK_NB) != nil
}

func (l lockStore) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	if l.blocked(true) {
		return store.Ticket{}, errLocked
	}
	return l.Store.Enqueue(ctx, req)
}

func (l lockStore) Get(ctx context.Context, id string) (store.Ticket, error) {
	if l.blocked(false) {
		return store.Ticket{}, errLocked
	}
	return l.Store.Get(ctx, id)
}

func (l lockStore) Renew(ctx context.Context, t store.Ticket, ttl time.Duration) (store.Ticket, error) {
	if l.blocked(true) {
		return store.Ticket{}, errLocked
	}
	return l.Store.Renew(ctx, t, ttl)
}

func (l lockStore) Release(ctx context.Context, t store.Ticket, why store.Reason) (bool, error) {
	if l.blocked(true) {
		return false, errLocked
	}
	return l.Store.Release(ctx, t, why)
}

func (l lockStore) Cancel(ctx context.Context, t store.Ticket) (bool, error) {
	if l.blocked(true) {
		return false, errLocked
	}
	return l.Store.Cancel(ctx, t)
}

func (l lockStore) SetChild(ctx context.Context, t store.Ticket, pgid int, pgidStart uint64) (store.Ticket, error) {
	if l.blocked(true) {
		return store.Ticket{}, errLocked
	}
	return l.Store.SetChild(ctx, t, pgid, pgidStart)
}

func (l lockStore) Reap(ctx context.Context, o store.ReapOptions) ([]store.Removal, error) {
	if l.blocked(!o.DryRun) {
		return nil, errLocked
	}
	return l.Store.Reap(ctx, o)
}

func (l lockStore) Events(ctx context.Context, limit string, n int) ([]store.Event, error) {
	if l.blocked(false) {
		return nil, errLocked
	}
	return l.Store.Events(ctx, limit, n)
}

func (l lockStore) Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error) {
	if l.blocked(false) {
		return store.Snapshot{}, errLocked
	}
	return l.Store.Snapshot(ctx, limits...)
}

func (l lockStore) SetLimit(ctx context.Context, name string, slots int) (store.Limit, error) {
	if l.blocked(true) {
		return store.Limit{}, errLocked
	}
	return l.Store.SetLimit(ctx, name, slots)
}

func (l lockStore) SetPolicy(ctx context.Context, name string, ch store.PolicyChange) (store.Limit, error) {
	if l.blocked(true) {
		return store.Limit{}, errLocked
	}
	return l.Store.SetPolicy(ctx, name, ch)
}

func (l lockStore) Counts(ctx context.Context, limits ...string) ([]store.Counts, error) {
	if l.blocked(false) {
		return nil, errLocked
	}
	return l.Store.Counts(ctx, limits...)
}

func (l lockStore) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	if l.blocked(true) {
		return store.Ticket{}, errLocked
	}
	return l.Store.Resize(ctx, t, weight)
}

// holdLock takes the store's file lock as a stalled process would hold it.
func (b *Bolt) holdLock(exclusive bool, until time.Duration, who string) error {
	f, err := os.OpenFile(b.path+".lock", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if err := b.flock(f, exclusive); err != nil {
		f.Close()
		return err
	}
	b.lock = &storeLock{f: f, exclusive: exclusive, until: until, who: who}
	return nil
}

// flock takes the lock, waiting for the calls that gave up on it to let go:
// each drops it the moment the kernel hands it over (lock.go).
func (b *Bolt) flock(f *os.File, exclusive bool) error {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// letLock: the stalled process goes on and lets the lock go.
func (b *Bolt) letLock() {
	if b.lock != nil {
		b.lock.f.Close()
		b.lock = nil
	}
}

// stepAside lets the lock go for the model's reads after a step and returns
// what takes it again: the checker is the simulation's, no process of the
// host, and must see the store as it is.
func (b *Bolt) stepAside() func() error {
	lk := b.lock
	if lk == nil || !lk.exclusive {
		return func() error { return nil }
	}
	if err := unix.Flock(int(lk.f.Fd()), unix.LOCK_UN); err != nil {
		return func() error { return err }
	}
	b.lock = nil
	return func() error {
		b.lock = lk
		return b.flock(lk.f, true)
	}
}

// lockOne has a process stall with the store's lock held, from 1 s to
// two of the longest TTLs: exclusive (a writer) or shared (a reader).
// These draws come from a stream of their own.
func (s *sim) lockOne() bool {
	b, ok := s.be.(*Bolt)
	if !ok || b.lock != nil {
		return false
	}
	if _, err := os.Stat(b.path + ".lock"); err != nil {
		return false // nothing wrote the store yet: no process has its lock to hold
	}
	r := s.lockRng
	d := time.Second + time.Duration(r.Int64N(int64(2*ttls[len(ttls)-1])))
	exclusive := r.IntN(2) == 0
	who := []string{"a reaper stopped in its reap", "a slotctl run stopped in its renewal", "an operator's slotctl ls stopped in its read"}[r.IntN(3)]
	if !exclusive {
		who = "an operator's slotctl ls stopped in its read"
	} else if who == "an operator's slotctl ls stopped in its read" {
		who = "a slotctl release stopped in its write"
	}
	if err := b.holdLock(exclusive, s.now().Mono+d, who); err != nil {
		s.fail("setup", "hold the store's lock: %v", err)
		return false
	}
	s.stats.LockHolds++
	s.lockFree = s.now().Mono + d
	kind := "shared"
	if exclusive {
		kind = "exclusive"
	}
	s.tracef("%s holds the store's lock (%s) for %v", who, kind, d)
	return true
}

// lockActor lets the lock go when the stalled process goes on.
type lockActor struct{ b *Bolt }

func (a lockActor) wake() time.Duration { return a.b.lock.until }

func (a lockActor) act() { a.b.letLock() }

// lockHeld is the lock's actor while a process holds it, and whether one does.
func (s *sim) lockHeld() (actor, bool) {
	if b, ok := s.be.(*Bolt); ok && b.lock != nil {
		return lockActor{b}, true
	}
	return nil, false
}

// letLockGo: whoever held the lock goes on (the quiescent phase, a reboot).
func (s *sim) letLockGo() {
	if b, ok := s.be.(*Bolt); ok && b.lock != nil {
		b.letLock()
		s.lockFree = s.now().Mono
		s.tracef("the store's lock is let go")
	}
}

func (lk *storeLock) String() string { return fmt.Sprintf("%s until %v", lk.who, lk.until) }

// newLockRng is the lock fault's stream.
func newLockRng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x10c4ed)) }

// checkAside checks the model after a step, past a held lock.
func (s *sim) checkAside() {
	b, ok := s.be.(*Bolt)
	if !ok {
		s.m.check()
		return
	}
	again := b.stepAside()
	s.m.check()
	if err := again(); err != nil {
		s.fail("setup", "hold the store's lock again: %v", err)
	}
}

// lockWait: a call refused by the held lock waited the store's timeout
// for it. A call Run makes (its join, its polls, its release) blocks Run
// that long, in simulated time, as the store's lock wait blocks slotctl:
// Run, which tries again at once when its join meets a locked store,
// must not spin while no time passes. The scheduler's calls (renewals,
// reapers, the operator) fail at once: their retries wait on their own.
//
// A stop request Run heard and was reading (kind "get") when the lock
// refused the read is not acted on (gate/holder reads the ticket first and
// leaves an unreadable one to its lease): it is heard anew at its next
// renewal's answer or ring (S18). One it read already stays heard, though
// a later call, its release, meets the lock.
func (c *conn) lockWait(kind string) {
	h := c.owner
	if h == nil || !h.inside || c == c.s.netConn {
		return
	}
	if kind == "get" && h.stopHeard && h.child.stopAt == 0 {
		h.stopHeard = false
	}
	h.inCall = true
	defer func() { h.inCall = false }()
	simWaiter{h}.Wait(gh.Wake{At: h.hostNow() + boltTimeout})
}
