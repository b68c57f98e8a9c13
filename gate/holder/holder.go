package holder

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
)

// Defaults of Config.
const (
	// DefaultRecordDelay: the job's process group is recorded in the
	// ticket once the job has run this long. A job that is over by then
	// needs no proof of death, and the common short job saves a write.
	DefaultRecordDelay = 50 * time.Millisecond
	// DefaultReleaseTimeout bounds a release, and the recording of the
	// job's group.
	DefaultReleaseTimeout = 5 * time.Second
)

// Config is one run of the protocol.
type Config struct {
	Store   Store
	Gate    gate.Gate            // PollEvery and Rand; its Store is Config.Store
	Request store.EnqueueRequest // the ticket to write; ID minted by the caller (gate.NewID)
	// Wait bounds the wait for a slot: < 0 waits without bound, 0 does not wait.
	Wait time.Duration
	// Renew configures the default lease, a renew.Keeper (TTL required);
	// its Now is Config.Now and its OnRenew nudges the wait.
	Renew renew.Options
	// Continue lets the job run on when the lease is lost (--on-lost
	// continue); otherwise it is stopped.
	Continue bool
	// KillAfter is how long a job stopped with a signal has before
	// SIGKILL; on a lost lease it is cut to what the lease's margin leaves.
	KillAfter time.Duration
	MaxHold   time.Duration // 0: none
	// RecordDelay: 0 means DefaultRecordDelay.
	RecordDelay time.Duration
	// ReleaseTimeout: 0 means DefaultReleaseTimeout.
	ReleaseTimeout time.Duration

	// Now is the holder's monotonic clock, counting through suspend; nil
	// means proc.Boottime.
	Now func() time.Duration
	// Signals are the signals the supervisor catches (RealWaiter only).
	Signals <-chan os.Signal
	// Waiter: nil means RealWaiter{Now, Signals}.
	Waiter Waiter
	// NewLease: nil means renew.Start with Renew.
	NewLease NewLease
	// Start starts the job.
	Start Starter
	// Notify, if not nil, is told what happens, for messages and the
	// status line. It is called from Run's goroutine.
	Notify func(Note)
	// Mutations is test-only (internal/mutation): known supervisor bugs
	// switched back on, so that the simulation proves it catches them.
	// Without the build tag slotctl_mutations it is empty and the bugs are
	// compiled out.
	Mutations mutation.Set
}

// NoteKind says what a Note reports.
type NoteKind int

// The notes.
const (
	Joined        NoteKind = iota // the ticket is written (Ticket)
	WaitStart                     // waiting for a slot begins (Ticket)
	WaitUpdate                    // a fresh read of the waiting ticket (Ticket)
	WaitEnd                       // waiting is over
	Admitted                      // the ticket is held and the lease alive: the job starts (Ticket)
	Started                       // the job started
	LeaseLost                     // the lease was lost while the job ran (Err); stopped unless Config.Continue
	MaxHoldOut                    // MaxHold ran out: the job is being stopped
	Kill                          // the stopped job is still there after After: SIGKILL
	RecordFailed                  // the job's group could not be recorded (Err)
	LeaveFailed                   // the waiting ticket could not be removed (Err)
	ReleaseFailed                 // the held ticket could not be released (Err)
	AlreadyGone                   // the held ticket was gone at release (reaped or released by an operator)
	Replaced                      // a newer run of the key asked the job to stop (Ticket.Stop): it is being stopped
	Leftover                      // the job's command exited, processes it started run on: they are being stopped
	NotGone                       // processes of the job are still there a while after SIGKILL: given up on
	StoreBusy                     // the store stayed locked by others, or lost the answer, for the enqueue (Err): trying again
)

// A Note is one thing that happened.
type Note struct {
	Kind   NoteKind
	Ticket store.Ticket
	Err    error
	After  time.Duration
}

// Result is how a run ended.
type Result int

// The results.
const (
	Ran             Result = iota // the job ran; Outcome.Exit is its status
	Busy                          // not admitted within Config.Wait
	LostWaiting                   // the ticket was lost while waiting (Err)
	LostBeforeStart               // admitted, but the lease was lost before the job could start (Err)
	Signalled                     // a terminating signal while waiting (Signal)
	Failed                        // joining, waiting or starting the job failed (Err)
	// Superseded: a newer run of the same key took the waiting ticket's
	// place (Outcome.By); the job never ran (docs/leases.md §2.1 item 10).
	Superseded
)

// Outcome is what Run returns, for the caller to turn into an exit status.
type Outcome struct {
	Result  Result
	Ticket  store.Ticket
	Exit    Exit  // Ran: the job's status
	ExitErr error // Ran: the job's status is unknown
	// Lost: the lease was lost while the job ran, and the job was stopped
	// for it (not with Config.Continue).
	Lost    bool
	MaxHold bool // MaxHold ran out and the job was stopped
	// Replaced: a newer run of the key asked the job to stop, and it was
	// stopped (docs/leases.md §2.1 item 10).
	Replaced *store.Successor
	By       store.Successor // Superseded: the run that took the ticket's place
	Signal   os.Signal
	Err      error
	// LeaveErr: the ticket that was never admitted could not be removed
	// (noted as LeaveFailed); it stays until its lease expires.
	LeaveErr error
}

const never = time.Duration(math.MaxInt64)

type runner struct {
	cfg   Config
	now   func() time.Duration
	w     Waiter
	entry *gate.Entry
	lease Lease
	// child is the running job, told of each renewal (Child.Lease); set
	// from Run's goroutine, read from the renewer's.
	child    atomic.Pointer[Child]
	released bool // mutation.ReleaseBeforeExit: released before the job stopped
	// admittedByJoin: the enqueue itself admitted the ticket (and rang
	// its bell); wait had nothing to wait for.
	admittedByJoin bool
	// holding: the job runs, so a renewal that shows the ticket held is
	// news only when it carries a stop request (set from Run's goroutine,
	// read from the renewer's).
	holding atomic.Bool
	// renewed is the newest answer of a renewal while the ticket waits:
	// the wait takes it as its read of the ticket, so that a waiter's
	// renewals are its polls too (one store operation per renewal period,
	// not two: all an idle waiter costs is its renewals).
	renewed atomic.Pointer[store.Ticket]
	// asked is a renewal's answer, while the job runs, that carries a stop
	// request: it is the ticket read, so the supervisor acts on it without
	// reading it again (a ticket removed since would otherwise leave the
	// request unheard until the lease is judged lost).
	asked atomic.Pointer[store.Ticket]
	// seenAt is when the read of the entry's ticket that the wait holds
	// began: its Remaining was read after it.
	seenAt time.Duration
}

func newRunner(cfg Config) *runner {
	r := &runner{cfg: cfg, now: cfg.Now, w: cfg.Waiter}
	if r.now == nil {
		r.now = proc.Boottime
		if r.bug(mutation.MonotonicDeadline) { // mutation (test-only): CLOCK_MONOTONIC, which stops in suspend (D4)
			start := time.Now()
			r.now = func() time.Duration { return time.Since(start) }
		}
	}
	if r.w == nil {
		r.w = RealWaiter{Now: r.now, Signals: cfg.Signals}
	}
	if r.cfg.RecordDelay == 0 {
		r.cfg.RecordDelay = DefaultRecordDelay
	}
	if r.cfg.ReleaseTimeout == 0 {
		r.cfg.ReleaseTimeout = DefaultReleaseTimeout
	}
	return r
}

func (r *runner) note(n Note) {
	if r.cfg.Notify != nil {
		r.cfg.Notify(n)
	}
}

func (r *runner) bug(b mutation.Bug) bool { return r.cfg.Mutations.Has(b) }

// Run runs the protocol once: join, wait, start the job, watch it, stop
// it, drain it and release. It returns when the job and its group are gone
// and the ticket is released (or the release failed).
func Run(ctx context.Context, cfg Config) Outcome {
	if cfg.Mutations.Has(mutation.HoldAndWait) && len(cfg.Request.Names()) > 1 { // mutation (test-only): one limit at a time (docs/leases.md H1)
		return holdAndWait(ctx, cfg)
	}
	r := newRunner(cfg)
	entry, sent, out, ok := r.join(ctx)
	if !ok {
		return out
	}
	defer entry.Close()
	r.entry = entry
	t := entry.Ticket()
	r.seenAt = sent
	r.note(Note{Kind: Joined, Ticket: t})
	if !r.bug(mutation.WaiterNotRenewed) && !t.Quiet {
		// Renew from the first write: the enqueue counts as the first ack.
		// A quiet waiter renews nothing until it comes into line
		// (docs/leases.md rule 17).
		r.lease = r.startLease(ctx, t, sent)
	}
	joined := t
	t, out, ok = r.wait(ctx)
	if !ok {
		return out
	}
	// The hold the store answered: its lease's time left.
	adopted := t
	if r.bug(mutation.HoldNotAdopted) { // mutation (test-only): the holder keeps its view of the ticket as it joined
		adopted = joined
	}
	if out, ok := r.admittedLease(ctx, adopted); !ok {
		return out
	}
	if out, ok := r.leaseLeft(ctx, t); !ok {
		return out
	}
	r.lease.Hold() // a job runs from now on: check the lease every second too (suspend)
	r.note(Note{Kind: Admitted, Ticket: t})

	jobCtx, cancelJob := context.WithCancelCause(ctx)
	defer cancelJob(nil)
	out = r.runJob(ctx, jobCtx, t, cancelJob)
	// Drain before release: the job and its group are gone; no renewal is
	// in flight after Stop.
	r.lease.Stop()
	if !r.released {
		why := store.Released
		if r.lease.Err() != nil {
			why = store.Lost
		}
		r.release(ctx, why, true)
	}
	return out
}

// joinPause is the pause before an enqueue whose answer was lost is sent
// again; it doubles up to joinPauseMax, so that a store that loses every
// answer at once (its server gone after the lost commit) is not asked in
// a busy loop.
const (
	joinPause    = 100 * time.Millisecond
	joinPauseMax = 5 * time.Second
)

// join writes the ticket. It is Run's first phase of its own because a
// store locked by others all along wrote nothing, and a store that lost a
// write's answer (an election) may have written it: a run that may wait
// keeps trying, as it would wait for a slot (docs/leases.md rule 17); only
// one that may not wait says the store is busy or unavailable. sent is
// when the write that succeeded, or the first that may have, was sent;
// not ok, out is how the run ended.
func (r *runner) join(ctx context.Context) (entry *gate.Entry, sent time.Duration, out Outcome, ok bool) {
	cfg := r.cfg
	g := cfg.Gate
	g.Store = cfg.Store
	first := r.now()
	sent = first
	mayWait := func() bool { return cfg.Wait != 0 && (cfg.Wait < 0 || r.now()-first < cfg.Wait) && ctx.Err() == nil }
	var sig os.Signal
	// A write whose answer was lost (an election) is sent again, the same
	// ticket, while the run may wait, after a pause: sent stays when the
	// first was sent, which may be the one that wrote it.
	pause := joinPause
	g.JoinAgain = func(err error) bool {
		if !mayWait() {
			return false
		}
		r.note(Note{Kind: StoreBusy, Err: err})
		at := r.now() + pause
		pause = min(2*pause, joinPauseMax)
		for {
			switch ev := r.w.Wait(Wake{At: at, Done: ctx.Done()}); {
			case ev.Kind == Timer:
				return true
			case ev.Kind == Signal && Terminating(ev.Signal):
				sig = ev.Signal // Join cancels the ticket
				return false
			case ev.Kind == Done:
				return false
			}
		}
	}
	entry, err := g.Join(ctx, cfg.Request)
	var busy *store.LockTimeoutError
	for errors.As(err, &busy) && mayWait() {
		r.note(Note{Kind: StoreBusy, Err: err})
		if s, ok := r.terminated(); ok {
			return nil, 0, Outcome{Result: Signalled, Signal: s}, false // nothing was written: nothing to leave
		}
		sent = r.now()
		entry, err = g.Join(ctx, cfg.Request)
		busy = nil
	}
	switch {
	case err != nil && sig != nil:
		return nil, 0, Outcome{Result: Signalled, Signal: sig}, false
	case err != nil:
		return nil, 0, Outcome{Result: Failed, Err: err}, false
	}
	return entry, sent, Outcome{}, true
}

// admittedLease makes sure the admitted ticket t has a lease of its own
// running: the lease decides whether the job may start, and a waiter may
// have come through the wait without one. Not ok, the slot is given back
// as lost and out is how the run ended.
func (r *runner) admittedLease(ctx context.Context, t store.Ticket) (Outcome, bool) {
	if r.bug(mutation.WaiterNotRenewed) {
		r.lease = r.startLease(ctx, t, r.now()) // counts from the admission it observed
	} else if r.lease == nil || r.lease.Err() == nil && r.lease.Deadline() <= r.now() || errors.Is(r.lease.Err(), renew.ErrDeadline) {
		// Admitted while quiet, or with its own deadline past (a slow
		// machine): the lease the admission gave it, as read after seenAt
		// (docs/leases.md rule 17).
		if r.lease != nil {
			r.lease.Stop()
		}
		if err := r.adopt(ctx, t); err != nil {
			r.release(ctx, store.Lost, false)
			return Outcome{Result: LostBeforeStart, Ticket: t, Err: err}, false
		}
	}
	return Outcome{}, true
}

// leaseLeft lets the job start only with a lease that has time left; else
// it gives the slot back now, as lost, rather than at expiry, and out (not
// ok) is how the run ended.
func (r *runner) leaseLeft(ctx context.Context, t store.Ticket) (Outcome, bool) {
	if left := r.lease.Deadline() - r.now(); left <= 0 || r.lease.Err() != nil {
		r.lease.Stop()
		err := r.lease.Err()
		if err == nil {
			err = renew.ErrDeadline
		}
		r.release(ctx, store.Lost, false)
		return Outcome{Result: LostBeforeStart, Ticket: t, Err: err}, false
	}
	return Outcome{}, true
}

// runJob starts the job of ticket t under jobCtx and supervises it to its
// end. It is the part of Run that a job that never started skips;
// cancelJob stays Run's, so that the job's context outlives the release.
func (r *runner) runJob(ctx, jobCtx context.Context, t store.Ticket, cancelJob context.CancelCauseFunc) Outcome {
	c, err := r.cfg.Start(jobCtx, t)
	if err != nil {
		return Outcome{Result: Failed, Ticket: t, Err: err}
	}
	r.note(Note{Kind: Started, Ticket: t})
	r.holding.Store(true)
	if r.admittedByJoin && r.entry != nil {
		// The enqueue that admitted the ticket rang its bell: take that
		// ring, or supervise reads the ticket again for nothing (a whole
		// store open). Taken after the start, so that the bell's reader
		// has had time to pass it on. A stop request that shares the
		// ring is heard at the next renewal at the latest, the bound a
		// --replace promises (startLease's onRenew).
		select {
		case <-r.entry.Bell():
		default:
		}
	}
	return r.supervise(ctx, c, t, cancelJob)
}

// Supervise watches a job that runs without a ticket of its own (a nested
// run, under its ancestor's): forwarded signals, MaxHold and its exit.
func Supervise(ctx context.Context, cfg Config, c Child) Outcome {
	r := newRunner(cfg)
	return r.supervise(ctx, c, store.Ticket{}, func(error) {})
}

// terminated takes a terminating signal that arrived while the run could
// not reach the store (it waits in Join, not in the Waiter): the run gives
// up as it would while waiting for a slot. Other signals are dropped, as the
// wait drops them.
func (r *runner) terminated() (os.Signal, bool) {
	for {
		select {
		case s := <-r.cfg.Signals:
			if Terminating(s) {
				return s, true
			}
		default:
			return nil, false
		}
	}
}

// adopt starts the lease of a ticket that has none running: a quiet waiter
// come into line or admitted, or a waiter whose own deadline passed while
// its ticket stayed (a busy machine or store: docs/leases.md rule 17). The
// store's reading of what is left (t.Remaining, read after r.seenAt) gives
// the lease; with too little left, one renewal first. It fails with an
// error wrapping store.ErrLost when the ticket is gone, or with a
// transient error (the caller tries again later).
func (r *runner) adopt(ctx context.Context, t store.Ticket) error {
	ttl := r.cfg.Request.TTL
	if t.Remaining > ttl/2 && t.Remaining <= ttl {
		// The store's deadline is at least seenAt + Remaining: the lease
		// counts as renewed then, a TTL before it.
		r.lease = r.startLease(ctx, t, r.seenAt+t.Remaining-ttl)
		return nil
	}
	sent := r.now()
	nt, err := r.cfg.Store.Renew(ctx, t, ttl)
	if err != nil {
		return err
	}
	r.lease = r.startLease(ctx, nt, sent)
	return nil
}

func (r *runner) startLease(ctx context.Context, t store.Ticket, sent time.Duration) Lease {
	onRenew := func(nt store.Ticket) {
		switch {
		case !r.holding.Load():
			// The wait reads the answer: it shows the ticket held (a lost
			// ring costs one period) or its place in the queue.
			r.renewed.Store(&nt)
			r.entry.Nudge()
		case nt.State == store.Held && nt.Stop != nil:
			// Asked to stop by a newer run of its key (--replace): heard
			// at the next renewal at the latest.
			r.asked.Store(&nt)
			r.entry.Nudge()
		}
		if c := r.child.Load(); c != nil {
			r.tellLease(*c)
		}
	}
	if r.cfg.NewLease != nil {
		return r.cfg.NewLease(t, sent, onRenew)
	}
	o := r.cfg.Renew
	o.Now = r.now
	if prev := o.OnRenew; prev != nil {
		o.OnRenew = func(nt store.Ticket) { prev(nt); onRenew(nt) }
	} else {
		o.OnRenew = onRenew
	}
	return renew.Start(context.WithoutCancel(ctx), r.cfg.Store, t, sent, o)
}

// wait waits for the ticket to be held. Not held, it leaves the queue and
// reports how the wait ended (ok false).
func (r *runner) wait(ctx context.Context) (store.Ticket, Outcome, bool) {
	e := r.entry
	t := e.Ticket()
	if t.State == store.Held {
		r.admittedByJoin = true
		return t, Outcome{}, true
	}
	if r.cfg.Wait == 0 {
		return t, r.leave(ctx, Outcome{Result: Busy, Ticket: t, Err: gate.ErrBusy}), false
	}
	w := r.newWaiting(ctx, t)
	// Noted after the first read, so that what a caller does on it (a
	// test that then cuts the store off) meets the loop, not a read.
	r.note(Note{Kind: WaitStart, Ticket: t})
	defer r.note(Note{Kind: WaitEnd})
	for w.t.State != store.Held {
		ev := r.w.Wait(Wake{At: at(w.deadline, w.nextPoll, w.expiryAt), Done: w.done, Lost: w.lostC, Bell: e.Bell(), Nudge: e.Nudged()})
		next := readTicket // a bell, and what the cases below leave to a read
		switch ev.Kind {
		case Done:
			next = w.over(w.t, r.leave(ctx, Outcome{Result: Failed, Ticket: w.t, Err: context.Cause(ctx)}), false)
		case Lost:
			next = w.lost(ctx)
		case Signal:
			next = w.signal(ctx, ev.Signal)
		case Timer:
			next = w.timer(ctx)
		case Nudge:
			next = w.nudged(ctx)
		}
		if next == readTicket {
			next = w.read(ctx)
		}
		if next == waitOver {
			return w.endT, w.out, w.ok
		}
	}
	return w.t, Outcome{}, true
}

// waiting is the state of wait's loop: the ticket as last read, the
// moments it wakes at and the lease it watches. Its own type so that each
// event's handling is a method of its own.
type waiting struct {
	r *runner
	e *gate.Entry
	t store.Ticket
	// deadline is the end of Config.Wait, nextPoll the next fallback poll
	// (never while renewals read the ticket), expiryAt when a holder's
	// lease runs out, as last read.
	deadline, nextPoll, expiryAt time.Duration
	lostC, done                  <-chan struct{}
	// How the wait ended, once a step is waitOver.
	endT store.Ticket
	out  Outcome
	ok   bool
}

// waitStep is what the wait does after an event.
type waitStep int

const (
	readTicket waitStep = iota // read the ticket from the store, then wait again
	waitAgain                  // wait for the next event
	waitOver                   // return endT, out and ok
)

// newWaiting sets the wait's moments up from the ticket t that the join
// read: the wait's end, its first poll (none beside renewals) and the
// holders' expiry.
func (r *runner) newWaiting(ctx context.Context, t store.Ticket) *waiting {
	e := r.entry
	now := r.now()
	w := &waiting{r: r, e: e, t: t, deadline: never, expiryAt: never}
	if r.cfg.Wait > 0 {
		w.deadline = now + r.cfg.Wait
	}
	w.nextPoll = now + e.PollPeriod()
	if r.lease != nil {
		w.lostC = r.lease.Lost()
		// The renewals read the ticket (renewed): no poll beside them.
		w.nextPoll = never
	}
	w.done = ctx.Done()
	w.armExpiry(ctx)
	return w
}

// over records how the wait ended, for the loop to return.
func (w *waiting) over(t store.Ticket, out Outcome, ok bool) waitStep {
	w.endT, w.out, w.ok = t, out, ok
	return waitOver
}

// armExpiry reads when a holder's lease runs out, for the wait to sweep
// then rather than at the next write.
func (w *waiting) armExpiry(ctx context.Context) {
	if d, ok := w.e.Expiry(ctx); ok {
		w.expiryAt = w.r.now() + d
	}
}

// lost handles the renewer's verdict on the waiting ticket's lease.
func (w *waiting) lost(ctx context.Context) waitStep {
	r := w.r
	if by, ok := supersededBy(r.lease.Err()); ok {
		return w.over(w.t, r.superseded(w.t, by, r.lease.Err()), false)
	}
	if errors.Is(r.lease.Err(), renew.ErrDeadline) {
		// Its own deadline passed, not the store's word: a waiter
		// holds no slot, so it reads its ticket and, still there,
		// renews and waits on (docs/leases.md rule 17).
		r.lease.Stop()
		r.lease, w.lostC = nil, nil
		return readTicket
	}
	err := fmt.Errorf("%w while waiting: %w", store.ErrLost, r.lease.Err())
	return w.over(w.t, r.leave(ctx, Outcome{Result: LostWaiting, Ticket: w.t, Err: err}), false)
}

// signal handles a signal while waiting: SIGCONT checks the lease (the
// process may have been stopped past it), a terminating one leaves the
// queue, others are dropped.
func (w *waiting) signal(ctx context.Context, s os.Signal) waitStep {
	r := w.r
	if s == syscall.SIGCONT {
		if r.lease != nil {
			r.lease.Check()
		}
	} else if Terminating(s) {
		return w.over(w.t, r.leave(ctx, Outcome{Result: Signalled, Ticket: w.t, Signal: s}), false)
	}
	return waitAgain
}

// timer handles the moment that came due: the end of the wait (a last
// look), a holder's expiry (a sweep) or the fallback poll.
func (w *waiting) timer(ctx context.Context) waitStep {
	r, e := w.r, w.e
	now := r.now()
	switch {
	case now >= w.deadline:
		r.seenAt = now
		lt, err := e.LastLook(ctx)
		if err == nil {
			return w.over(lt, Outcome{}, true)
		}
		return w.over(lt, r.leave(ctx, Outcome{Result: Busy, Ticket: lt, Err: err}), false)
	case now >= w.expiryAt:
		// A holder's lease ran out, as last read: sweep now rather
		// than at the next write. Read first: a holder that renewed
		// since (the usual case) costs a read, not a sweep's write.
		w.expiryAt = never
		if d, ok := e.Expiry(ctx); ok && d > sweepSlack {
			w.expiryAt = r.now() + d
			return waitAgain
		}
		e.Sweep(ctx)
	case now >= w.nextPoll:
		w.nextPoll = now + e.PollPeriod()
	default:
		return waitAgain // early: nothing is due yet
	}
	return readTicket
}

// nudged takes a renewal's answer as the wait's read of the ticket, when
// there is one: a waiter's renewals are its polls too.
func (w *waiting) nudged(ctx context.Context) waitStep {
	if p := w.r.renewed.Swap(nil); p != nil && p.State == store.Waiting && p.ID == w.t.ID && p.Fence == w.t.Fence {
		// A renewal's answer: still waiting, at this place. Only a
		// new place may make it the head, which watches the
		// holders' expiry (a read): most renewals cost the wait
		// no store operation at all.
		moved := p.Position != w.t.Position
		w.t = w.e.Saw(*p)
		w.r.note(Note{Kind: WaitUpdate, Ticket: w.t})
		if moved || len(w.t.Limits) > 1 {
			w.armExpiry(ctx)
		}
		return waitAgain
	}
	return readTicket
}

// read reads the ticket from the store: held, the wait is over; still
// waiting, it may have come into line and start renewing.
func (w *waiting) read(ctx context.Context) waitStep {
	r, e := w.r, w.e
	r.seenAt = r.now()
	nt, err := e.Refresh(ctx)
	if out, ok := r.ended(ctx, w.t, err); ok {
		return w.over(w.t, out, false)
	}
	if err != nil {
		if r.lease == nil {
			w.nextPoll = r.now() + e.PollPeriod()
		}
		return waitAgain // transient: the next poll tries again; the renewer judges the lease
	}
	w.t = nt
	r.note(Note{Kind: WaitUpdate, Ticket: w.t})
	if w.t.State == store.Held {
		return waitAgain // the loop ends: admitted
	}
	w.armExpiry(ctx)
	return w.inLine(ctx)
}

// inLine starts renewing a ticket that the read shows in line (not
// quiet), or sets the next poll of a quiet one (docs/leases.md rule 17).
func (w *waiting) inLine(ctx context.Context) waitStep {
	r := w.r
	switch {
	case r.lease != nil || r.bug(mutation.WaiterNotRenewed):
	case w.t.Quiet:
		w.nextPoll = r.now() + w.e.PollPeriod()
	default:
		// In line: renew from now on (docs/leases.md rule 17).
		err := r.adopt(ctx, w.t)
		if out, ok := r.ended(ctx, w.t, err); ok {
			return w.over(w.t, out, false)
		}
		if err != nil {
			w.nextPoll = r.now() + w.e.PollPeriod()
		} else {
			w.lostC, w.nextPoll = r.lease.Lost(), never
		}
	}
	return waitAgain
}

// ended turns an error of a read or a renewal of the waiting ticket t into
// the end of the wait: superseded by a newer run, or lost (gone from the
// store). Any other error is transient: ok is false.
func (r *runner) ended(ctx context.Context, t store.Ticket, err error) (Outcome, bool) {
	if by, ok := supersededBy(err); ok {
		return r.superseded(t, by, err), true
	}
	if errors.Is(err, store.ErrLost) {
		return r.leave(ctx, Outcome{Result: LostWaiting, Ticket: t, Err: err}), true
	}
	return Outcome{}, false
}

// sweepSlack: a holder's lease that runs out this soon is swept now
// (gate.HeadExpiry says 55ms for one already out).
const sweepSlack = 100 * time.Millisecond

// supersededBy finds the successor in an error of Get or Renew for a
// ticket that a newer run of its key superseded.
func supersededBy(err error) (store.Successor, bool) {
	var s *store.SupersededError
	if errors.As(err, &s) {
		return s.By, true
	}
	return store.Successor{}, false
}

// superseded ends a wait whose ticket a newer run took the place of: the
// store removed it already, in the newer run's enqueue, so there is
// nothing to leave.
func (r *runner) superseded(t store.Ticket, by store.Successor, err error) Outcome {
	if r.lease != nil {
		r.lease.Stop()
	}
	r.entry.Close()
	return Outcome{Result: Superseded, Ticket: t, By: by, Err: err}
}

// leave removes a ticket that was never admitted, and returns out: as
// cancelled, as busy when the wait ran out (store.Busy: a Cancel that the
// limit's counters count as busy, not as cancelled), or as lost when the
// wait ended in a loss.
func (r *runner) leave(ctx context.Context, out Outcome) Outcome {
	if r.lease != nil {
		r.lease.Stop()
	}
	why := store.Cancelled
	switch out.Result {
	case LostWaiting:
		why = store.Lost
	case Busy:
		why = store.Busy
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.releaseTimeout(why))
	defer cancel()
	var err error
	if why == store.Cancelled {
		_, err = r.entry.Cancel(rctx)
	} else {
		_, err = r.entry.Leave(rctx, why)
	}
	if err != nil {
		r.note(Note{Kind: LeaveFailed, Ticket: r.entry.Ticket(), Err: err})
		out.LeaveErr = err
	}
	return out
}

// release removes the held ticket, as released or lost. ran: the job ran,
// so a ticket already gone is worth a note.
func (r *runner) release(ctx context.Context, why store.Reason, ran bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.releaseTimeout(why))
	defer cancel()
	removed, err := r.entry.Leave(rctx, why)
	switch {
	case err != nil:
		r.note(Note{Kind: ReleaseFailed, Ticket: r.entry.Ticket(), Err: err})
	case !removed && ran:
		r.note(Note{Kind: AlreadyGone, Ticket: r.entry.Ticket()})
	}
}

// minLostRelease is the least a release after a loss is given: enough for
// a store that answers, when nothing is left of the lease.
const minLostRelease = 250 * time.Millisecond

// releaseTimeout bounds a release. After a loss the store will expire the
// ticket on its own by the lease's expiry, so a release that cannot get
// through (the store unreachable) is not worth waiting for longer than
// what is left of the lease.
func (r *runner) releaseTimeout(why store.Reason) time.Duration {
	d := r.cfg.ReleaseTimeout
	if why == store.Lost && r.lease != nil {
		d = min(d, max(r.lease.Expiry()-r.now(), minLostRelease))
	}
	return d
}

// supervise waits for the job, forwarding signals, stopping it when the
// lease is lost (unless Continue) or MaxHold runs out, and escalating to
// SIGKILL. Once the job's command has exited it drains the rest of the
// job, still watching the lease. It returns only when the whole job is
// gone (or did not go within notGoneWait of SIGKILL).
func (r *runner) supervise(ctx context.Context, c Child, t store.Ticket, cancelJob context.CancelCauseFunc) Outcome {
	defer c.Close()
	if r.lease != nil && !r.cfg.Continue {
		// The job stops by itself at the lease's end should this process
		// be stopped or hung then; each renewal moves that on.
		r.child.Store(&c)
		defer r.child.Store(nil)
		r.tellLease(c)
	}
	s := r.newSupervision(ctx, c, t, cancelJob)
	for {
		if r.released {
			s.bellC, s.nudgeC = nil, nil // mutation.ReleaseBeforeExit: the bell is closed
		}
		ev := r.w.Wait(Wake{At: at(s.recordAt, s.maxHoldAt, s.killAt, s.giveUpAt), Done: s.done, Lost: s.lostC, Exited: s.endC, Bell: s.bellC, Nudge: s.nudgeC})
		switch ev.Kind {
		case Bell, Nudge:
			s.stopRequest(ctx)
		case Exited:
			if s.exited() {
				return s.over(ctx)
			}
		case Signal:
			s.signal(ctx, ev.Signal)
		case Lost:
			if s.leaseLost() {
				s.stop(syscall.SIGTERM)
			}
		case Done:
			s.done = nil
			s.stop(syscall.SIGTERM)
		case Timer:
			if s.timer(ctx) {
				return s.over(ctx)
			}
		}
	}
}

// over is the outcome once the job is gone: a stop request rung while the
// job was being stopped is read now, so that the outcome names it.
func (s *supervision) over(ctx context.Context) Outcome {
	if s.rungStopping && s.out.Replaced == nil {
		ctx, cancel := context.WithTimeout(ctx, s.r.cfg.ReleaseTimeout)
		defer cancel()
		if nt, err := s.r.entry.Refresh(ctx); err == nil && nt.Stop != nil {
			s.t = nt
			by := *nt.Stop
			s.out.Replaced = &by
			s.r.note(Note{Kind: Replaced, Ticket: s.t})
		}
	}
	return s.out
}

// supervision is the state of supervise's loop: the job, the outcome so
// far, the moments it wakes at and the channels it still watches. Its own
// type so that each event's handling is a method of its own.
type supervision struct {
	r         *runner
	c         Child
	t         store.Ticket // the ticket as last read
	cancelJob context.CancelCauseFunc
	out       Outcome
	// recordAt: record the job's group; maxHoldAt: MaxHold runs out;
	// killAt: SIGKILL (again); giveUpAt: stop waiting for the job to go.
	recordAt, maxHoldAt, killAt, giveUpAt time.Duration
	stopAt                                time.Duration // when the job was first stopped
	killed                                bool          // SIGKILL was sent
	killBy                                time.Duration // on a lost lease: SIGKILL no later than this
	lostC, done                           <-chan struct{}
	// endC is the command's exit, then (draining) the end of the whole job.
	endC     <-chan struct{}
	draining bool
	// rungStopping: the bell rang while the job was being stopped.
	rungStopping bool
	// The bell stays open while the job runs: a newer run of the key that
	// asks it to stop (--replace) rings it, and so do renewals that
	// carry the request (a nudge).
	bellC, nudgeC <-chan struct{}
}

// newSupervision sets up the watch of job c from now: its record, MaxHold
// and the channels it waits on.
func (r *runner) newSupervision(ctx context.Context, c Child, t store.Ticket, cancelJob context.CancelCauseFunc) *supervision {
	s := &supervision{r: r, c: c, t: t, cancelJob: cancelJob, out: Outcome{Result: Ran, Ticket: t}}
	now := r.now()
	s.recordAt, s.maxHoldAt, s.killAt, s.giveUpAt = never, never, never, never
	if r.lease != nil {
		s.lostC = r.lease.Lost()
		s.recordAt = now + r.cfg.RecordDelay
	}
	if r.cfg.MaxHold > 0 {
		s.maxHoldAt = now + r.cfg.MaxHold
	}
	s.stopAt, s.killed = never, false
	s.killBy = never
	s.done = ctx.Done()
	s.endC, s.draining = c.Exited(), false
	if r.entry != nil {
		s.bellC, s.nudgeC = r.entry.Bell(), r.entry.Nudged()
	}
	return s
}

// stop signals the job to stop and, the first time, sets when SIGKILL
// follows: KillAfter later, and no later than killBy.
func (s *supervision) stop(sig syscall.Signal) {
	s.c.Signal(sig)
	if !s.killed && s.killAt == never {
		s.stopAt = s.r.now()
		s.killAt = s.stopAt + s.r.cfg.KillAfter
	}
	s.killAt = min(s.killAt, s.killBy)
}

// untilDue is how long a store call made while the job runs may take: 0
// once the job is being stopped (it needs no record, its guard kills it if
// this process dies, and a stop request is read once it is gone: over),
// else until MaxHold runs out, or without bound. A call that waits on a
// store held up (its lock held by a stalled process) must not stretch the
// kill grace.
func (s *supervision) untilDue(now time.Duration) time.Duration {
	switch {
	case s.killAt != never:
		return 0
	case s.maxHoldAt != never:
		return s.maxHoldAt - now
	}
	return never
}

// stopRequest reads the ticket on a ring of its bell: a newer run of the
// key that asks the job to stop (--replace) has it stopped.
func (s *supervision) stopRequest(ctx context.Context) {
	if p := s.r.asked.Swap(nil); p != nil && s.out.Replaced == nil {
		s.replaced(*p, s.killAt == never)
		return
	}
	budget := s.untilDue(s.r.now())
	if budget <= 0 {
		s.rungStopping = true
		return
	}
	if budget != never {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	}
	nt, err := s.r.entry.Refresh(ctx)
	if err != nil || nt.Stop == nil {
		return // gone or unreadable: the lease judges that
	}
	s.replaced(nt, true)
}

// replaced acts on ticket nt, read with a stop request in it: the outcome
// names the newer run, and the job is stopped unless it is already.
func (s *supervision) replaced(nt store.Ticket, stop bool) {
	s.bellC, s.nudgeC = nil, nil
	s.t = nt
	by := *nt.Stop
	s.out.Replaced = &by
	s.r.note(Note{Kind: Replaced, Ticket: s.t})
	if stop {
		s.stop(syscall.SIGTERM)
	}
}

// leaseLost acts on the lost lease: the job's context is cancelled and,
// unless Continue, the job is to be stopped within the lease's margin. It
// reports whether the job is to be stopped.
func (s *supervision) leaseLost() bool {
	s.lostC = nil
	err := s.r.lease.Err()
	s.cancelJob(fmt.Errorf("%w: %w", store.ErrLost, err))
	s.r.note(Note{Kind: LeaseLost, Ticket: s.t, Err: err})
	if s.r.cfg.Continue {
		return false
	}
	s.out.Lost = true
	s.killBy = s.r.killBy()
	return true
}

// exited handles the end of the command, then the end of the whole job:
// the command's status is kept, and what it left of the job is stopped
// and drained. It reports whether the whole job is gone.
func (s *supervision) exited() bool {
	if s.draining {
		return true
	}
	s.out.Exit, s.out.ExitErr = s.c.Exit()
	if s.lostC != nil {
		// The job may have ended at its lease's end, stopped by its
		// guard while this process was stopped: the lease first.
		s.r.lease.Check()
		select {
		case <-s.lostC:
			s.leaseLost()
		default:
		}
	}
	s.draining, s.endC = true, s.c.Gone()
	if s.r.cfg.Mutations.Has(mutation.DrainBlind) { // mutation (test-only): the drain no longer watches the lease
		s.lostC = nil
	}
	select {
	case <-s.endC:
		return true
	default:
	}
	// Drain before release: what the command left is the job too.
	// SIGTERM, then SIGKILL after KillAfter — sooner on a lost
	// lease, which the loop still watches.
	s.r.note(Note{Kind: Leftover, Ticket: s.t})
	s.stop(syscall.SIGTERM)
	return false
}

// signal handles a signal that reached the supervisor: forwarded to the
// job, or stopping it.
func (s *supervision) signal(ctx context.Context, sig os.Signal) {
	r := s.r
	sg, ok := sig.(syscall.Signal)
	switch {
	case !ok:
	case sg == syscall.SIGCONT:
		if r.lease != nil {
			r.lease.Check()
		}
	case s.c.Foreground() && !s.draining && (sg == syscall.SIGINT || sg == syscall.SIGQUIT):
		// A terminal sends Ctrl-C and Ctrl-\ to the whole foreground
		// group, the job included: do not deliver them twice.
	case Terminating(sg):
		if r.bug(mutation.ReleaseBeforeExit) && r.lease != nil && !r.released {
			r.lease.Stop()
			r.release(ctx, store.Released, true)
			r.released = true
		}
		s.stop(sg)
	default:
		s.c.Signal(sg)
	}
}

// timer handles the moments that came due: the record of the job's
// group, MaxHold, giving up on a job that does not go, and SIGKILL. It
// reports whether supervise gives up on the job.
func (s *supervision) timer(ctx context.Context) bool {
	r := s.r
	now := r.now()
	if now >= s.recordAt {
		s.recordAt = never
		r.record(ctx, s.c, s.t, s.untilDue(now))
	}
	if now >= s.maxHoldAt {
		s.maxHoldAt = never
		r.note(Note{Kind: MaxHoldOut, Ticket: s.t})
		s.out.MaxHold = true
		s.stop(syscall.SIGTERM)
	}
	if now >= s.giveUpAt {
		r.note(Note{Kind: NotGone, Ticket: s.t, After: now - s.stopAt})
		return true
	}
	if now >= s.killAt {
		if !s.killed {
			r.note(Note{Kind: Kill, Ticket: s.t, After: s.killAt - s.stopAt})
		}
		s.c.Signal(syscall.SIGKILL)
		// Again and again: a process forked while the job was being
		// killed was not there to be signalled.
		s.killAt, s.killed = now+killRepeat, true
		if s.giveUpAt == never {
			s.giveUpAt = now + notGoneWait
		}
	}
	return false
}

// After SIGKILL the job is signalled again every killRepeat, and given up
// on after notGoneWait: a process stuck in the kernel (uninterruptible
// I/O) does not hold the slot for ever, and runs no code of its own.
const (
	killRepeat  = 50 * time.Millisecond
	notGoneWait = time.Second
)

// tellLease gives the job the lease's end: SIGTERM at the local deadline,
// SIGKILL half the margin after it (killBy's moment), both before the
// store could judge the lease expired — what this process does itself when
// it notices the loss in time.
func (r *runner) tellLease(c Child) {
	if r.bug(mutation.GuardUntold) { // mutation (test-only): the guard keeps no lease
		return
	}
	now, d := r.now(), r.lease.Deadline()
	m := r.lease.Expiry() - d
	c.Lease(d-now, d-now+m/2)
}

// killBy is when a job stopped for a lost lease must get SIGKILL, whatever
// KillAfter says: the whole stop must fit before the earliest moment the
// store could judge the lease expired (the local deadline + the margin),
// so SIGKILL comes half the margin after the loss is noticed, which at the
// local deadline is half the margin before that moment. A loss noticed
// later (after a suspend, when the slot may already be another's) gets the
// same half margin, for the job's SIGTERM handler.
func (r *runner) killBy() time.Duration {
	if r.bug(mutation.LateLossGrace) && r.now() > r.lease.Deadline() { // mutation (test-only): a loss noticed late keeps the whole kill grace (D4)
		return never
	}
	return r.now() + (r.lease.Expiry()-r.lease.Deadline())/2
}

// record writes the job's process group into the ticket: with it, a reaper
// on this host can prove the job gone once the supervisor dies. Without it
// the TTL decides, so a failure is only a note. It gives up after budget
// (the supervision's next moment: see untilDue).
func (r *runner) record(ctx context.Context, c Child, t store.Ticket, budget time.Duration) {
	pgid, start, ok := c.Group()
	if !ok || budget <= 0 {
		return
	}
	// Bounded by the lease: a store that does not answer must not hold up
	// the watch past the local deadline.
	sctx, cancel := context.WithTimeout(ctx, min(max(min(r.cfg.ReleaseTimeout, r.lease.Deadline()-r.now()), minLostRelease), budget))
	defer cancel()
	if _, err := r.cfg.Store.SetChild(sctx, t, pgid, start); err != nil && !errors.Is(err, store.ErrLost) {
		r.note(Note{Kind: RecordFailed, Ticket: t, Err: err})
	}
}

// at is the earliest of the moments, as a Wake's At (0: none).
func at(ts ...time.Duration) time.Duration {
	m := never
	for _, t := range ts {
		m = min(m, t)
	}
	if m == never {
		return 0
	}
	return max(m, 1)
}

// Terminating reports the signals whose default action ends a process, on
// which a waiting run leaves the queue and a running one stops its job.
func Terminating(s os.Signal) bool {
	switch s {
	case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}
