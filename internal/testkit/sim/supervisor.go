package sim

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"time"

	"github.com/slotctl/slotctl/gate"
	gh "github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
)

// A holder is one `slotctl run`: the real protocol, gate/holder's Run, in a
// goroutine of its own that runs only while the scheduler waits for it.
// Run blocks in one place, its Waiter: this one hands control back to the
// scheduler, which later resumes it with the event it chose (a timer, the
// lease lost, the child's exit, a ring, a signal). So only one goroutine
// runs at a time, and a seed replays. The holder's lease is simulated here
// step by step (its arithmetic is renew.Lease, its retry delay
// renew.RetryDelay), and so is its child.
type holder struct {
	s          *sim
	n          int
	name       string
	limits     []string // its ticket's limits, in the order it names them
	weight     int      // the slots it takes in each
	ttl, every time.Duration
	margin     time.Duration
	grace      time.Duration // --kill-after
	waitFor    time.Duration // --wait; < 0 waits without bound
	runFor     time.Duration // how long the job runs if nobody stops it
	// Newer runs first (docs/leases.md §2.1 item 10).
	key        string
	supersede  bool
	replace    bool
	maxWaiting *int
	// run --priority and --share (sched.go), sent in runs with policies.
	priority int
	share    string

	// Where it runs (ptable.go): its machine's process, its record in the
	// ticket (as it read itself), its marker, and whether its owner's
	// evidence of the job (the marker, kept from the job's start to its
	// release) is there.
	sup        *mproc
	rec        store.Holder
	foreground bool // a terminal's job: the command stays in the supervisor's group
	marker     proc.Marker
	markerKept bool

	phase       hphase
	crashed     bool
	diedAt      time.Duration
	guardKilled bool // its guard was killed with it: its job's orphans are the reapers
	// guardLost: its guard was killed alone; it killed what the job left
	// that carries its marks (internal/guard's killOrphans).
	guardLost      bool
	crashAfterCall bool
	paused         bool
	resumeAt       time.Duration
	wasPaused      bool
	resumedAt      time.Duration
	// resumedLate: it resumed with its child running and its lease lost or
	// past its local deadline, so its child must be gone within
	// stopAfterResume (S24); overlapped: its child ran on after its
	// ticket's end while it was stopped.
	resumedLate bool
	overlapped  bool
	outageUntil time.Duration // renewals fail until then
	// A suspend of its host (clocks.go): how late its parked wait's timer
	// and its Keeper's deadline timer fire, the watchdog's first tick after
	// the resume, the resume, and whether it resumed past its lease (S31).
	timerLate, deadLate time.Duration
	inCall              bool // Run waits in a store call for the store's lock (storelock.go)
	contPending         bool // SIGCONT came during that call
	watchAt, wokeAt     time.Duration
	resumedPast         bool

	c  *conn
	id string

	// Run's goroutine.
	started bool
	inside  bool // Run's goroutine runs (the scheduler waits for it)
	parked  bool
	wk      gh.Wake // what the parked Run waits for
	park    chan gh.Wake
	resume  chan gh.Event
	gone    chan struct{}
	out     gh.Outcome

	// The lease.
	ticket    store.Ticket // the renewer's ticket, as last acknowledged
	lease     renew.Lease
	leased    bool // the renewer runs
	holds     bool // Run told it a job runs (Lease.Hold): renewals say held
	lost      bool
	lostAt    time.Duration
	lostErr   error
	lostC     chan struct{}
	nextRenew time.Duration
	failures  int
	inflight  *renewCall

	rung bool // the promoter rang the bell
	// onRenew is Run's: the Keeper calls it with each acknowledged renewal.
	onRenew func(store.Ticket)
	// The stop request (--replace) as the holder heard it: its bell rang
	// while its job ran, or a renewal's answer carried it (S18).
	stopHeard bool
	// stopDeferred: the stop request it heard by its bell came while its
	// job was being stopped, so its ticket is read only once the job is gone.
	stopDeferred bool
	stopHeardAt  time.Duration
	stopBy       string
	stopHow      string
	// stopAdmitted: the answer that admitted it already carried the stop
	// request.
	stopAdmitted bool

	child      child
	sigterm    bool
	sigtermAt  time.Duration
	handledSig bool
	exit       string
}

type hphase int

// A holder's phases, as far as the scheduler needs them.
const (
	hJoin hphase = iota // Run not started
	hWait               // joined: waiting (or just admitted)
	hRun                // the child started
	hDone
)

func (p hphase) String() string { return [...]string{"join", "wait", "run", "done"}[p] }

// crashEvent makes the Waiter end Run's goroutine: the process died.
const crashEvent = gh.EventKind(-1)

// A child is the simulated job. It runs from start until its holder sees
// it exit (at end, or once stopped) or kills it.
type child struct {
	start, end time.Duration
	running    bool
	stopAt     time.Duration // SIGTERM sent; 0 if not
	exited     chan struct{}
	gone       chan struct{} // nothing of the job is left
	// Its processes (ptable.go): the guard, the command, what it started.
	guard, leader *mproc
	procs         []*mproc
	// The guard's own timer (Child.Lease): SIGTERM to the job at
	// guardTerm, SIGKILL at guardKill, should its supervisor not stop it
	// first (stopped, hung); 0: not told. guardStopped: the guard is
	// stopped with its supervisor (a pause of both).
	guardTerm, guardKill time.Duration
	guardTermSent        bool
	guardStopped         bool
}

// A renewCall is a renewal in flight: the network delivers it to the store
// at deliverAt and its answer reaches the holder replyDelay later.
type renewCall struct {
	h          *holder
	t          store.Ticket
	sent       time.Duration // on its holder's clock
	deliverAt  time.Duration
	replyDelay time.Duration
	delivered  bool
	replyAt    time.Duration
	res        store.Ticket
	err        error
}

func (c *renewCall) wake() time.Duration {
	if c.delivered {
		return never
	}
	return c.deliverAt
}

func (c *renewCall) act() { c.deliver() }

// deliver runs the delayed renewal in the store, on the network's handle:
// the request left its holder before anything that happened to it since.
func (c *renewCall) deliver() {
	s := c.h.s
	n := s.netConn
	n.who, n.owner = "net→"+c.h.name, c.h
	c.res, c.err = n.Renew(s.ctx, c.t, c.h.ttl)
	n.who, n.owner = "net", nil
	c.delivered = true
	c.replyAt = s.now().Mono + c.replyDelay
	s.tracef("renewal of %s (sent %v ago) reaches the store: %s", c.h.name, c.h.hostNow()-c.sent, result(c.res, c.err))
	if c.h.crashed {
		c.h.inflight = nil // nobody reads the answer
	}
}

// newHolder draws a job: 1-3 of the limits in a random order (the order
// matters to a job that takes them one at a time: mutation.HoldAndWait),
// and a weight of 1 or 2 (fitted to the limits when it joins).
func newHolder(s *sim, n int) *holder {
	k := 1
	if multi {
		k = 1 + s.rng.IntN(min(3, len(s.limits)))
	}
	var lims []string
	for _, i := range s.rng.Perm(len(s.limits))[:k] {
		lims = append(lims, s.limits[i].name)
	}
	weight := 1
	if multi && s.chance(0.3) {
		weight = 2
	}
	ttl := ttls[s.rng.IntN(len(ttls))]
	h := &holder{s: s, n: n, name: fmt.Sprintf("h%d", n), limits: lims, weight: weight,
		ttl: ttl, every: ttl / 3, margin: ttl / 10, grace: ttl / 5, waitFor: -1}
	s.pt.place(h)
	if s.chance(0.25) {
		h.waitFor = s.between(ttl/2, 4*ttl)
	}
	h.runFor = s.between(ttl/20, 3*ttl/2)
	h.key = keys[s.rng.IntN(len(keys))]
	switch r := s.rng.Float64(); {
	case r < 0.2:
		h.supersede = true
	case r < 0.35:
		h.replace = true
	}
	if s.chance(0.2) {
		n := s.rng.IntN(3)
		h.maxWaiting = &n
	}
	h.priority, h.share = s.drawPriority(), s.drawShare()
	h.c = s.newConn(h.name, h)
	return h
}

// keys are what jobs name with --key: few, so that runs of one key meet.
var keys = []string{"", "main", "dev"}

func (h *holder) live() bool { return !h.crashed && h.phase != hDone }

// stoppedAt: the supervisor is stopped (SIGSTOP) or was until just now, or
// its host is suspended or resumed just now (clocks.go), so it cannot have
// stopped its child on time.
func (h *holder) stoppedAt(now time.Duration) bool {
	return h.paused || h.wasPaused && now <= h.resumedAt+h.grace || h.late(now) && now <= h.wakeBound()
}

// stopAfterResume is how long the child of a supervisor that resumes past
// its lease may still run: SIGTERM at once and SIGKILL within the kill
// grace, cut to half the margin for a lost lease (gate/holder's killBy).
func (h *holder) stopAfterResume() time.Duration { return min(h.grace, h.margin/2) }

// How a holder heard its stop request: a read of its ticket on a ring of
// its bell or a nudge (heardByRead), or a renewal's answer.
const (
	heardByBell    = "its bell"
	heardByNudge   = "a read on a nudge"
	heardByRenewal = "a renewal's answer"
)

// heardByRead: how is a read of the ticket that the supervisor made itself.
func heardByRead(how string) bool { return how == heardByBell || how == heardByNudge }

// readsStop: Run reads h's ticket now (on a ring or a nudge), and hears the
// stop request the model has on it.
func (h *holder) readsStop(now time.Duration, how string) {
	if t := h.s.m.live[h.id]; t != nil && t.stop != "" {
		h.heard(now, t.stop, how)
		// gate/holder reads a ticket rung while its job is being stopped
		// (or drained) only once the job is gone: what it reads then (the
		// ticket gone, a restored copy's) need not ask it.
		h.stopDeferred = h.child.stopAt != 0 || !h.child.running
	}
}

// heard records that h heard its stop request, how.
func (h *holder) heard(now time.Duration, by, how string) {
	if h.stopHeard || h.phase != hRun {
		return
	}
	h.stopHeard, h.stopHeardAt, h.stopBy, h.stopHow = true, now, by, how
	switch how {
	case heardByBell:
		h.s.stats.HeardByBell++
	case heardByRenewal:
		h.s.stats.HeardByRenewal++
	}
	h.s.tracef("%s hears that %s replaces it (%s)", h.name, short(by), how)
}

// renewing: the renewer sends renewals now.
func (h *holder) renewing() bool {
	return h.leased && !h.lost && h.inflight == nil && (h.phase == hWait || h.phase == hRun)
}

// ready is the event the parked Run waits for that is ready now (on its
// clock), if any.
func (h *holder) ready(now time.Duration) (gh.Event, bool) {
	if !h.parked {
		return gh.Event{}, false
	}
	w := h.wk
	if h.inCall { // in a store call that waits for the lock: its timeout alone ends it
		return gh.Event{Kind: gh.Timer}, w.At+h.timerLate <= now
	}
	switch {
	case h.contPending:
		return gh.Event{Kind: gh.Signal, Signal: syscall.SIGCONT}, true
	case w.Lost != nil && closed(w.Lost):
		return gh.Event{Kind: gh.Lost}, true
	case h.sigterm && !h.handledSig:
		return gh.Event{Kind: gh.Signal, Signal: syscall.SIGTERM}, true
	case w.Exited != nil && closed(w.Exited):
		return gh.Event{Kind: gh.Exited}, true
	case w.Bell != nil && h.rung:
		return gh.Event{Kind: gh.Bell}, true
	case w.Nudge != nil && len(w.Nudge) > 0:
		return gh.Event{Kind: gh.Nudge}, true
	case w.At != 0 && w.At+h.timerLate <= now:
		return gh.Event{Kind: gh.Timer}, true
	}
	return gh.Event{}, false
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (h *holder) wake() time.Duration {
	if !h.live() {
		return never
	}
	if h.asleep() {
		return h.sup.mc.clk.asleepUntil
	}
	if h.paused {
		return min(h.resumeAt, h.guardDue())
	}
	if !h.started {
		return 0
	}
	if _, ok := h.ready(h.hostNow()); ok {
		return 0
	}
	w := never
	if c := h.inflight; c != nil && c.delivered {
		w = min(w, c.replyAt)
	}
	if h.leased && !h.lost {
		w = min(w, h.deadlineWake())
	}
	if h.renewing() {
		w = min(w, h.storeAt(h.nextRenew))
	}
	w = min(w, h.guardDue())
	if h.child.running {
		w = min(w, h.child.end)
	}
	for _, p := range h.tree() {
		if p.kind == pDescendant {
			w = min(w, p.end)
		}
	}
	if h.parked && h.wk.At != 0 {
		w = min(w, h.storeAt(h.wk.At+h.timerLate))
	}
	return w
}

// deadlineWake is when the Keeper next checks the lease's local deadline,
// on the store's clock: its deadline timer, late by a suspend that passed
// since it was armed; while the job runs, the watchdog's next tick past
// the deadline, if that is sooner.
func (h *holder) deadlineWake() time.Duration {
	w := h.storeAt(h.lease.Deadline() + h.deadLate)
	if h.phase == hRun && (h.watchAt != 0 || h.deadLate > 0) {
		// The watchdog ticks every second from the resume, or from Hold
		// (the job's start) if the suspend came before.
		d, tick := h.storeAt(h.lease.Deadline()), h.watchAt
		if tick == 0 {
			tick = h.child.start + watchdog
		}
		if d > tick {
			tick += (d - tick + watchdog - 1) / watchdog * watchdog
		}
		w = min(w, tick)
	}
	return w
}

// act does the one thing due now, in the order the Keeper and the
// supervisor would notice them.
func (h *holder) act() {
	s := h.s
	now, local := s.now().Mono, h.hostNow()
	switch {
	case h.paused && now < h.resumeAt:
		h.guardActs(now)
		return
	case h.paused:
		h.paused, h.resumedAt = false, now
		h.resumedLate = h.child.running && (h.lost || h.leased && h.lease.Expired(local))
		s.tracef("%s resumes (SIGCONT) and checks its lease", h.name)
		if h.inCall {
			h.contPending = true // Run reads it once its store call is over
			return
		}
		h.deliver(gh.Event{Kind: gh.Signal, Signal: syscall.SIGCONT})
		return
	case !h.started:
		h.start()
		return
	}
	if c := h.inflight; c != nil && c.delivered && c.replyAt <= now {
		h.inflight = nil
		s.tracef("%s reads its late renewal answer", h.name)
		h.answer(local, c.sent, c.res, c.err)
		return
	}
	if h.leased && !h.lost && h.lease.Expired(local) {
		h.loseLease(renew.ErrDeadline)
		return
	}
	if h.guardDue() <= now {
		h.guardActs(now)
		return
	}
	if h.child.running && now >= h.child.end {
		s.tracef("%s: child exited (ran %v)", h.name, now-h.child.start)
		s.pt.exit(h.child.leader)
	}
	if ev, ok := h.ready(local); ok {
		switch ev.Kind {
		case gh.Signal:
			if ev.Signal == syscall.SIGCONT {
				h.contPending = false
				break
			}
			h.handledSig, h.sigtermAt = true, now
			s.tracef("%s: SIGTERM", h.name)
		case gh.Bell:
			h.rung = false
			h.readsStop(now, heardByBell)
		case gh.Nudge:
			<-h.wk.Nudge // as the real Waiter's select takes it
			if h.phase == hRun {
				// A nudge left over from a renewal that the wait did not
				// take: the supervisor reads its ticket on it, as on a ring.
				h.readsStop(now, heardByNudge)
			}
		}
		waiting := h.phase == hWait
		h.deliver(ev)
		// Unless its read of the ticket waits for the store's lock (storelock.go).
		if g := s.m.gone[h.id]; ev.Kind == gh.Bell && waiting && g.by != "" && !g.forgot && h.live() && !h.inCall {
			s.fail("S16", "%s heard its bell after %s superseded its ticket %s, and still %ss", h.name, short(g.by), short(h.id), h.phase)
		}
		return
	}
	if h.renewing() && local >= h.nextRenew {
		h.sendRenewal(now, local)
	}
}

// start starts Run in its goroutine and waits until it blocks.
func (h *holder) start() {
	s := h.s
	h.started = true
	h.id = s.newID()
	h.rec = s.pt.record(h)
	req := store.EnqueueRequest{ID: h.id, Slots: s.size(h.limits[0]), TTL: h.ttl, Holder: h.rec,
		Key: h.key, Supersede: h.supersede, Replace: h.replace, MaxWaiting: h.maxWaiting}
	if s.sched {
		req.Priority, req.Share = h.priority, h.share
	}
	if len(h.limits) == 1 {
		req.Limit = h.limits[0]
	} else {
		req.Limits = h.limits
	}
	// Never heavier than a limit at its enqueue (nor than its configured
	// size, which the quiescent phase restores): operators may shrink it later.
	for _, name := range h.limits {
		h.weight = min(h.weight, s.size(name))
		if n := s.m.size(name, req); n > 0 {
			h.weight = min(h.weight, n)
		}
	}
	if h.weight > 1 || s.chance(0.5) {
		req.Weight = h.weight // else 0, which means 1
	}
	if !s.quiet && s.cfg.Faults.Has(LostReply) && s.chance(0.06) {
		h.c.enqFault = 1 + s.rng.IntN(2)
	}
	cfg := gh.Config{
		Store:   h.c,
		Gate:    gate.Gate{PollEvery: pollEvery, Rand: s.rng.Float64},
		Request: req,
		Wait:    h.waitFor, KillAfter: h.grace,
		Now:       h.hostNow,
		Waiter:    simWaiter{h},
		NewLease:  h.newLease,
		Start:     h.startChild,
		Notify:    h.note,
		Mutations: s.cfg.Mutations,
	}
	h.park, h.resume, h.gone = make(chan gh.Wake), make(chan gh.Event), make(chan struct{})
	h.inside = true
	go func() {
		defer close(h.gone)
		h.out = gh.Run(s.ctx, cfg)
	}()
	h.await()
}

// deliver resumes the parked Run with ev and waits until it blocks again.
func (h *holder) deliver(ev gh.Event) {
	h.parked, h.inside = false, true
	h.resume <- ev
	h.await()
}

func (h *holder) await() {
	select {
	case w := <-h.park:
		h.parked, h.wk, h.timerLate = true, w, 0
	case <-h.gone:
		h.finished()
	}
	h.inside = false
}

// simWaiter is Run's Waiter: park, and wait for the scheduler's event.
type simWaiter struct{ h *holder }

func (w simWaiter) Wait(wk gh.Wake) gh.Event {
	w.h.park <- wk
	ev := <-w.h.resume
	if ev.Kind == crashEvent {
		runtime.Goexit()
	}
	return ev
}

// finished: Run returned.
func (h *holder) finished() {
	if h.crashed {
		return
	}
	o := h.out
	switch o.Result {
	case gh.Ran:
		h.exit = "ok"
		if o.Lost {
			h.exit = "lost"
		}
		if o.Replaced != nil {
			h.exit = "replaced by " + short(o.Replaced.Ticket)
			h.s.stats.Replaced++
		}
	case gh.Superseded:
		h.exit = "superseded by " + short(o.By.Ticket)
	case gh.Busy:
		h.exit = "busy"
	case gh.LostWaiting:
		h.exit = "lost while waiting"
	case gh.LostBeforeStart:
		h.exit = "lost before start"
	case gh.Signalled:
		h.exit = "signalled"
	default:
		h.exit = fmt.Sprintf("failed: %v", o.Err)
	}
	if h.exit == "ok" {
		h.s.stats.Finished++
	}
	h.markerKept = false // released, or never admitted
	h.s.pt.exit(h.sup)
	if h.ticket.ID != "" {
		h.s.records = append(h.s.records, h.ticket)
	}
	h.s.m.outcome(h, o)
	h.s.tracef("%s: run over: %s", h.name, h.exit)
	h.phase, h.leased = hDone, false
}

// note is Run's Notify.
func (h *holder) note(n gh.Note) {
	s := h.s
	switch n.Kind {
	case gh.Joined:
		h.phase = hWait
		s.tracef("%s joins %v as %s: %s", h.name, n.Ticket.Names(), short(n.Ticket.ID), result(n.Ticket, nil))
	case gh.WaitUpdate:
		s.tracef("%s polls: %s", h.name, result(n.Ticket, nil))
	case gh.Admitted:
		s.stats.Admitted++
		if len(h.limits) > 1 {
			s.stats.AdmittedMulti++
		}
		if h.weight > 1 {
			s.stats.AdmittedHeavy++
		}
		s.tracef("%s: admitted to slot %d, starts its job (local deadline in %v)", h.name, n.Ticket.Slot, h.lease.Deadline()-h.hostNow())
	case gh.LeaseLost:
		s.tracef("%s: lease lost while its job runs: stops it", h.name)
	case gh.Kill:
		s.tracef("%s: child still there %v after SIGTERM: SIGKILL", h.name, n.After)
	case gh.ReleaseFailed, gh.LeaveFailed:
		s.tracef("%s: release failed: %v", h.name, n.Err)
	case gh.AlreadyGone:
		s.tracef("%s: its ticket was already gone at release", h.name)
	}
}

// newLease is Run's NewLease: the simulated renewer.
func (h *holder) newLease(t store.Ticket, sent time.Duration, onRenew func(store.Ticket)) gh.Lease {
	h.ticket = t
	h.onRenew = onRenew
	h.lease = renew.NewLease(sent, h.ttl, h.margin)
	h.leased, h.deadLate = true, 0
	// A waiter starts a new lease after its own deadline passed (or as it
	// comes into line): the old one's verdict was the old lease's.
	h.lost, h.lostErr, h.failures = false, nil, 0
	h.lostC = make(chan struct{})
	h.nextRenew = sent + h.s.jitter(h.every)
	return simLease{h}
}

// simLease is the holder's side of the simulated renewer.
type simLease struct{ h *holder }

func (l simLease) Lost() <-chan struct{}   { return l.h.lostC }
func (l simLease) Deadline() time.Duration { return l.h.lease.Deadline() }
func (l simLease) Expiry() time.Duration   { return l.h.lease.Expiry() }
func (l simLease) Hold()                   { l.h.holds, l.h.deadLate = true, 0 } // renew.Keeper re-arms its deadline timer on Hold
func (l simLease) Check()                  { l.h.checkLease(l.h.hostNow()) }

func (l simLease) Err() error {
	if l.h.lost {
		return l.h.lostErr
	}
	return nil
}

// Stop is keeper.Stop: a renewal still in flight either reaches the store
// now or is cancelled before it does; either way it is over.
func (l simLease) Stop() {
	h := l.h
	if h.crashed {
		return
	}
	if c := h.inflight; c != nil {
		if !c.delivered && h.s.chance(0.5) {
			c.deliver()
		}
		h.inflight = nil
	}
	h.leased = false
}

// startChild is Run's Starter.
func (h *holder) startChild(_ context.Context, t store.Ticket) (gh.Child, error) {
	now := h.s.now().Mono
	if g := h.s.m.gone[t.ID]; g.by != "" && !g.forgot {
		h.s.fail("S16", "%s starts the job of ticket %s, which %s superseded", h.name, short(t.ID), short(g.by))
	}
	h.child = child{start: now, end: now + h.runFor, running: true, exited: make(chan struct{}), gone: make(chan struct{})}
	h.marker, _ = h.judge().SelfMarker()
	h.markerKept = true
	h.s.pt.newJob(h, h.marker)
	h.phase = hRun
	if t.Stop != nil {
		// Asked to stop between its admission and the answer that told it
		// of it (a --replace enqueued in between): Run starts the job and
		// stops it when its bell or a renewal tells it again.
		h.stopAdmitted = true
	}
	return simChild{h}, nil
}

// simChild is the holder's handle on its simulated child.
type simChild struct{ h *holder }

func (c simChild) Exited() <-chan struct{} { return c.h.child.exited }
func (c simChild) Foreground() bool        { return c.h.foreground }
func (c simChild) Gone() <-chan struct{}   { return c.h.child.gone }
func (c simChild) Close()                  {}

// Lease arms the guard's timer, as the supervisor tells it of each
// renewal: it stops the job by itself at the lease's end.
func (c simChild) Lease(term, kill time.Duration) {
	h := c.h
	ch, local := &h.child, h.hostNow()
	// On the supervisor's host's clock, kept as the store's readings then.
	ch.guardTerm, ch.guardKill, ch.guardTermSent = h.storeAt(local+term), h.storeAt(local+kill), false
}
func (c simChild) Exit() (gh.Exit, error) { return gh.Exit{}, nil }

// Group is the command's group, as the supervisor reads its leader's
// start time.
func (c simChild) Group() (int, uint64, bool) {
	pgid := c.h.child.leader.pgrp
	start, _ := c.h.judge().StartTime(pgid)
	return pgid, start, true
}

// Signal goes to the whole job, as the guard sends it: the command's
// group and every process under the guard. SIGTERM makes the command exit
// within 1.5 kill graces (it may ignore it for longer than the grace);
// SIGKILL ends it at once.
func (c simChild) Signal(sig syscall.Signal) {
	h := c.h
	ch := &h.child
	now := h.s.now().Mono
	for _, p := range h.tree() {
		if p.kind != pCommand {
			h.s.pt.deliver(p, sig, nil)
		}
	}
	if !ch.running {
		return
	}
	defer func() { ch.leader.end = ch.end }()
	switch sig {
	case syscall.SIGTERM:
		if ch.stopAt != 0 {
			return
		}
		ch.stopAt = now
		ch.end = min(ch.end, now+h.s.between(0, 3*h.grace/2))
		h.s.tracef("%s: SIGTERM to its child", h.name)
	case syscall.SIGKILL:
		ch.end = now
		h.s.tracef("%s: SIGKILL to its child", h.name)
	}
}

// judge reads the host as the supervisor does (its own start time, the
// group it records), with the judge's bugs switched on.
func (h *holder) judge() proc.Judge {
	return proc.Judge{Host: view{pt: h.s.pt, mc: h.sup.mc, self: h.sup}, Mutations: h.s.cfg.Mutations}
}

// sendRenewal sends a renewal now (local on h's clock).
func (h *holder) sendRenewal(now, local time.Duration) {
	s := h.s
	t := h.ticket
	if h.holds {
		t.State = store.Held // as renew.Keeper says once Hold was called
	}
	s.remember(request{kind: "renew", t: t, ttl: h.ttl, owner: h, who: h.name})
	switch {
	case now < h.outageUntil:
		s.tracef("%s renews: store unreachable", h.name)
		h.answer(local, local, store.Ticket{}, errReplyLost)
		return
	case !s.quiet && s.cfg.Faults.Has(RenewFail) && s.chance(0.04):
		s.tracef("%s renews: the call fails before the store", h.name)
		h.answer(local, local, store.Ticket{}, errReplyLost)
		return
	case !s.quiet && s.cfg.Faults.Has(RenewFail) && s.chance(0.04):
		res, err := h.c.Renew(s.ctx, t, h.ttl)
		s.tracef("%s renews: the store answers %s, the answer is lost", h.name, result(res, err))
		h.answer(local, local, store.Ticket{}, errReplyLost)
		return
	case !s.quiet && s.cfg.Faults.Has(RenewDelay) && s.chance(0.12):
		c := &renewCall{h: h, t: t, sent: local, deliverAt: now + s.between(0, 3*h.ttl/5), replyDelay: s.between(0, 2*h.ttl/5)}
		switch r := s.rng.IntN(10); {
		case r < 3:
			c.deliverAt = now // only the answer is late
		case r < 5:
			c.deliverAt = now + s.between(3*h.ttl/5, 6*h.ttl/5) // very late: past the lease
		}
		h.inflight = c
		s.tracef("%s renews: delayed %v there, %v back", h.name, c.deliverAt-now, c.replyDelay)
		if c.deliverAt == now {
			c.deliver()
		}
		return
	}
	res, err := h.c.Renew(s.ctx, t, h.ttl)
	s.tracef("%s renews: %s", h.name, result(res, err))
	h.answer(local, local, res, err)
}

// answer is the Keeper's handling of a renewal's result; now and sent are
// on h's clock.
func (h *holder) answer(now, sent time.Duration, res store.Ticket, err error) {
	if h.crashed || h.lost || !h.leased {
		return
	}
	switch {
	case err == nil:
		if !h.lease.Acked(sent, now) {
			h.loseLease(fmt.Errorf("%w: the ack came after the local deadline", renew.ErrDeadline))
			return
		}
		h.ticket = res
		h.failures = 0
		h.deadLate = 0 // the deadline timer is armed again
		h.nextRenew = sent + h.s.jitter(h.every)
		if res.Stop != nil {
			h.heard(h.s.now().Mono, res.Stop.Ticket, heardByRenewal)
		}
		if h.onRenew != nil {
			h.onRenew(res) // as the Keeper does
		}
	case errors.Is(err, store.ErrLost):
		h.loseLease(fmt.Errorf("store refused the renewal: %w", err))
	default:
		if h.lease.Expired(now) {
			h.loseLease(renew.ErrDeadline)
			return
		}
		h.failures++
		h.nextRenew = now + h.s.jitter(renew.RetryDelay(h.every, h.failures))
	}
}

func (h *holder) checkLease(now time.Duration) {
	if h.leased && !h.lost && h.lease.Expired(now) {
		h.loseLease(fmt.Errorf("%w: the local deadline passed while stopped", renew.ErrDeadline))
	}
}

// loseLease: the lease is presumed lost; Run learns it from Lost.
func (h *holder) loseLease(err error) {
	s := h.s
	h.lost, h.lostAt, h.lostErr = true, s.now().Mono, err
	s.stats.Lost++
	s.tracef("%s: lease lost: %v", h.name, err)
	close(h.lostC)
}

// crash: the supervisor dies; its child with it (parent-death signal).
func (h *holder) crash() {
	if h.crashed {
		return
	}
	h.crashed, h.paused, h.diedAt = true, false, h.s.now().Mono
	h.s.pt.supervisorDied(h)
	h.child.running = false
	h.s.stats.Crashes++
	h.s.tracef("%s crashes (in %s)", h.name, h.phase)
	if h.inside {
		runtime.Goexit() // in Run's goroutine, in a store call: its next calls are never made
	}
	h.kill()
}

// kill ends a parked Run's goroutine.
func (h *holder) kill() {
	if h.parked {
		h.parked = false
		h.resume <- gh.Event{Kind: crashEvent}
		<-h.gone
	}
}

func (h *holder) pause(d time.Duration) {
	h.paused, h.wasPaused = true, true
	h.resumeAt = h.s.now().Mono + d
	h.s.stats.Pauses++
	// SIGSTOP to the supervisor alone (kill -STOP), or to it and its
	// guard (the whole machine paused, a cgroup frozen).
	h.child.guardStopped = h.s.guardRng.IntN(2) == 0
	if h.child.guardStopped || !h.child.guard.alive() {
		h.s.tracef("%s stopped (SIGSTOP) with its guard for %v; its child runs on", h.name, d)
		return
	}
	h.s.stats.PausesAlone++
	h.s.tracef("%s stopped (SIGSTOP) for %v; its guard runs", h.name, d)
}

// guardWatches: the guard runs (not stopped with its supervisor), holds a
// lease, and the job runs: its timer stops the job at the lease's end,
// whatever its supervisor does meanwhile (stopped, hung, or stopping it).
func (h *holder) guardWatches() bool {
	stopped := h.paused && h.child.guardStopped
	return !stopped && h.child.guard.alive() && h.child.guardKill != 0 && (h.child.running || len(h.tree()) > 0)
}

// guardDue is when the guard acts next.
func (h *holder) guardDue() time.Duration {
	ch := &h.child
	switch {
	case !h.guardWatches():
		return never
	case !ch.guardTermSent:
		return ch.guardTerm
	case ch.running && ch.end < ch.guardKill:
		return ch.end
	default:
		return ch.guardKill
	}
}

// guardActs is the guard at its timer: SIGTERM to the job at the lease's
// local deadline, SIGKILL half the margin later (internal/guard). A
// stopped supervisor learns of it when it resumes.
func (h *holder) guardActs(now time.Duration) {
	ch := &h.child
	if ch.running && now >= ch.end {
		h.s.pt.exit(ch.leader)
	}
	switch {
	case !h.guardWatches():
	case now >= ch.guardKill:
		h.s.tracef("%s's guard: the lease ran out while its supervisor is stopped: SIGKILL to the job", h.name)
		simChild{h}.Signal(syscall.SIGKILL)
		h.s.pt.exit(ch.leader)
		ch.guardKill = never
	case now >= ch.guardTerm && !ch.guardTermSent:
		if local := h.hostNow(); h.leased && local < h.lease.Deadline() {
			h.s.fail("S29", "%s's guard stops the job %v before its lease's local deadline", h.name, h.lease.Deadline()-local)
			return
		}
		ch.guardTermSent = true
		h.s.tracef("%s's guard: the lease's local deadline passed while its supervisor is stopped: SIGTERM to the job", h.name)
		simChild{h}.Signal(syscall.SIGTERM)
	}
}

func (s *sim) newID() string {
	return fmt.Sprintf("%016x%016x", s.rng.Uint64(), s.rng.Uint64())
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return "error: " + err.Error()
}
