package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slotctl/slotctl/store"
)

// An op is one real store call made in this step, with its real answer:
// what the model learns the store did.
type op struct {
	who   string
	owner *holder // the holder whose request this is, if any
	kind  string  // enqueue renew release get setchild reap scan setlimit setpolicy snapshot resize
	req   store.EnqueueRequest
	t     store.Ticket
	ttl   time.Duration
	why   store.Reason
	name  string
	slots int
	lims  []string // a reap's limits; none means all
	first bool     // the step's first call
	ch    store.PolicyChange

	res      store.Ticket
	lostIn   bool  // etcd: an answer was lost in the call (etcdfault.go)
	rev0     int64 // etcd: the server's revision just before a reap (notYetRevoked)
	unknown  bool  // and the call failed: its outcome is unknown
	removed  bool
	removals []store.Removal
	lim      store.Limit // a setpolicy's answer
	err      error
}

// errReplyLost is the answer a caller gets when the store's reply is lost
// (or the call failed before it reached the store): the outcome is unknown.
var errReplyLost = fmt.Errorf("%w: sim: no reply", store.ErrUnavailable)

// A conn is one actor's store handle, as a process holds it. It records
// every real call in the step's log, and injects the faults its actor is
// told to suffer. It implements store.Store, so the gate runs on it.
type conn struct {
	s     *sim
	st    store.Store
	who   string
	owner *holder

	// Fault for the next Enqueue: 0 none, 1 not executed, 2 reply lost.
	enqFault int
	bell     *simBell
}

var _ store.Store = (*conn)(nil)

func (s *sim) newConn(who string, owner *holder) *conn {
	st, err := s.be.Open()
	if err != nil {
		s.fail("setup", "open: %v", err)
	}
	c := &conn{s: s, st: st, who: who, owner: owner}
	s.conns = append(s.conns, c)
	return c
}

// errDead is what a crashed process's calls get: they are never made.
var errDead = errors.New("sim: the caller crashed")

// untimed drops the deadline of a call that has not been cancelled. A
// holder's deadlines are reckoned on the simulated clock, but the real
// store counts them on the wall clock, where a round trip to a server on a
// loaded machine may take longer than a lost lease's last 250 ms: the run
// would then depend on the machine's speed, not its seed. A call whose
// context is already done keeps it, and the store refuses it before it
// starts, as it would anywhere.
func untimed(ctx context.Context) context.Context {
	if ctx.Err() != nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// dead: the actor crashed. A request it sent before still travels: those
// go through the simulation's network handle.
func (c *conn) dead() bool { return c.owner != nil && c.owner.crashed && c != c.s.netConn }

func (c *conn) record(o *op) {
	if errors.Is(o.err, context.Canceled) {
		return // the store checks the context first: nothing ran
	}
	if errors.Is(o.err, errLocked) {
		c.s.stats.LockRefused++
		c.lockWait(o.kind) // nothing ran, after the store's timeout
		return
	}
	o.who, o.owner = c.who, c.owner
	if c.s.fileRefused(o) {
		return // nothing ran (diskfault.go, restore.go)
	}
	o.lostIn = c.s.etcdNotes()
	o.unknown = o.lostIn && errors.Is(o.err, store.ErrUnavailable)
	c.s.log = append(c.s.log, o)
	if h := c.owner; h != nil && h.crashAfterCall && c != c.s.netConn {
		c.s.tracef("%s crashes before it reads the answer", h.name)
		h.crash() // its next calls are never made
	}
}

// Enqueue implements store.Store.
func (c *conn) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	if c.dead() {
		return store.Ticket{}, errDead
	}
	remember := func() {
		if c != c.s.netConn {
			c.s.remember(request{kind: "enqueue", req: req, owner: c.owner, who: c.who})
		}
	}
	f := c.enqFault
	c.enqFault = 0
	if f == 1 {
		remember()
		return store.Ticket{}, errReplyLost
	}
	dctx, dying := c.armDeath(untimed(ctx), req)
	t, err := c.st.Enqueue(dctx, req)
	if dying != nil && dying.died {
		return c.enqueueDied(untimed(ctx), req, remember)
	}
	if c.lostAnswer(err) {
		return c.enqueueUnknown(ctx, req, err, remember)
	}
	if !errors.Is(err, store.ErrQueueFull) && !errors.Is(err, errLocked) || f == 2 {
		// A request refused by --max-waiting got its answer, and its id is
		// never sent again (the refusal wrote nothing, not even a tombstone);
		// one that never got the store's lock never left its process.
		remember()
	}
	c.record(&op{kind: "enqueue", req: req, res: t, err: err})
	if f == 2 {
		return store.Ticket{}, errReplyLost
	}
	return t, err
}

// Get implements store.Store.
func (c *conn) Get(ctx context.Context, id string) (store.Ticket, error) {
	if c.dead() {
		return store.Ticket{}, errDead
	}
	t, err := c.st.Get(untimed(ctx), id)
	c.record(&op{kind: "get", t: store.Ticket{ID: id}, res: t, err: err})
	return t, err
}

// Renew implements store.Store.
func (c *conn) Renew(ctx context.Context, t store.Ticket, ttl time.Duration) (store.Ticket, error) {
	if c.dead() {
		return store.Ticket{}, errDead
	}
	nt, err := c.st.Renew(untimed(ctx), t, ttl)
	c.record(&op{kind: "renew", t: t, ttl: ttl, res: nt, err: err})
	return nt, err
}

// Release implements store.Store.
func (c *conn) Release(ctx context.Context, t store.Ticket, why store.Reason) (bool, error) {
	if c.dead() {
		return false, errDead
	}
	if c != c.s.netConn {
		c.s.remember(request{kind: "release", t: t, why: why, owner: c.owner, who: c.who})
	}
	removed, err := c.st.Release(untimed(ctx), t, why)
	c.record(&op{kind: "release", t: t, why: why, removed: removed, err: err})
	return removed, err
}

// SetChild implements store.Store.
func (c *conn) SetChild(ctx context.Context, t store.Ticket, pgid int, pgidStart uint64) (store.Ticket, error) {
	if c.dead() {
		return store.Ticket{}, errDead
	}
	nt, err := c.st.SetChild(untimed(ctx), t, pgid, pgidStart)
	c.record(&op{kind: "setchild", t: t, res: nt, err: err})
	return nt, err
}

// Cancel implements store.Store. The model sees it as a release with
// reason cancelled: the same step.
func (c *conn) Cancel(ctx context.Context, t store.Ticket) (bool, error) {
	if c.dead() {
		return false, errDead
	}
	if c != c.s.netConn {
		c.s.remember(request{kind: "release", t: t, why: store.Cancelled, owner: c.owner, who: c.who})
	}
	removed, err := c.st.Cancel(untimed(ctx), t)
	c.record(&op{kind: "release", t: t, why: store.Cancelled, removed: removed, err: err})
	return removed, err
}

// Reap implements store.Store.
func (c *conn) Reap(ctx context.Context, o store.ReapOptions) ([]store.Removal, error) {
	if c.dead() {
		return nil, errDead
	}
	var rev0 int64
	if e, ok := c.s.be.(*Etcd); ok && !o.DryRun {
		rev0 = e.revision(c.s.ctx)
	}
	r, err := c.st.Reap(untimed(ctx), o)
	kind := "reap"
	if o.DryRun {
		kind = "scan"
	}
	c.record(&op{kind: kind, removals: r, err: err, lims: o.Limits, rev0: rev0})
	return r, err
}

// Close implements store.Store: it closes the handle the conn holds now.
func (c *conn) Close() error { return c.st.Close() }

// Events implements store.Store.
func (c *conn) Events(ctx context.Context, limit string, n int) ([]store.Event, error) {
	return c.st.Events(untimed(ctx), limit, n)
}

// Snapshot implements store.Store.
func (c *conn) Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error) {
	if c.dead() {
		return store.Snapshot{}, errDead
	}
	snap, err := c.st.Snapshot(untimed(ctx), limits...)
	c.record(&op{kind: "snapshot", err: err})
	return snap, err
}

// SetLimit implements store.Store.
func (c *conn) SetLimit(ctx context.Context, name string, slots int) (store.Limit, error) {
	l, err := c.st.SetLimit(untimed(ctx), name, slots)
	for c.lostAnswer(err) { // the operator runs the command again
		l, err = c.st.SetLimit(untimed(ctx), name, slots)
	}
	c.record(&op{kind: "setlimit", name: name, slots: slots, err: err})
	return l, err
}

// SetPolicy implements store.Store.
func (c *conn) SetPolicy(ctx context.Context, name string, ch store.PolicyChange) (store.Limit, error) {
	l, err := c.st.SetPolicy(untimed(ctx), name, ch)
	for c.lostAnswer(err) { // the operator runs the command again
		l, err = c.st.SetPolicy(untimed(ctx), name, ch)
	}
	c.record(&op{kind: "setpolicy", name: name, ch: ch, lim: l, err: err})
	return l, err
}

// RemoveLimit implements store.Store; the simulation never removes limits.
func (c *conn) RemoveLimit(ctx context.Context, name string, force bool) error {
	return errors.New("sim: RemoveLimit is not simulated")
}

// Watch implements store.Store with a bell the simulation rings: a real
// bell is a named pipe and a goroutine, which a step-driven run cannot
// order. The scheduler delivers a ring as an event to the holder's Run when
// the model sees, in the snapshot, the promotion it stands for.
func (c *conn) Watch(ctx context.Context, id string) (store.Bell, error) {
	c.bell = &simBell{c: make(chan struct{}, 1)}
	return c.bell, nil
}

// String implements store.Store.
func (c *conn) String() string { return c.st.String() }

type simBell struct{ c chan struct{} }

func (b *simBell) C() <-chan struct{} { return b.c }
func (b *simBell) Close() error       { return nil }

// Counts implements store.Store.
func (c *conn) Counts(ctx context.Context, limits ...string) ([]store.Counts, error) {
	if c.dead() {
		return nil, errDead
	}
	return c.st.Counts(untimed(ctx), limits...)
}

// Resize implements store.Store; slots is the weight asked for.
func (c *conn) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	if c.dead() {
		return store.Ticket{}, errDead
	}
	if c != c.s.netConn {
		c.s.remember(request{kind: "resize", t: t, weight: weight, owner: c.owner, who: c.who})
	}
	nt, err := c.st.Resize(untimed(ctx), t, weight)
	for c.lostAnswer(err) {
		// The jobserver keeps its view and asks for the same weight at its
		// next round (gate/jobserver: a failed shrink keeps its tokens in
		// hand, a failed growth hands none out).
		nt, err = c.st.Resize(untimed(ctx), t, weight)
	}
	c.record(&op{kind: "resize", t: t, slots: weight, res: nt, err: err})
	return nt, err
}
