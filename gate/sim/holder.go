package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
)

type hphase int

// A holder's phases, in cmd/slotctl/run.go's order.
const (
	hJoin     hphase = iota // mint an id, gate.Join
	hWait                   // waiting: renew, poll, give up
	hAdmitted               // held: check the local deadline, start the child
	hRecord                 // record the child's group in the ticket
	hRun                    // supervise the child
	hDrain                  // child gone: stop the renewer, release
	hDone
)

func (p hphase) String() string {
	return [...]string{"join", "wait", "admitted", "record", "run", "drain", "done"}[p]
}

// A child is the simulated job. It runs from start until its holder sees
// it exit (at end, or once stopped) or kills it.
type child struct {
	start, end time.Duration
	running    bool
	stopAt     time.Duration // SIGTERM sent; 0 if not
	killAt     time.Duration // SIGKILL due
}

// A renewCall is a renewal in flight: the network delivers it to the store
// at deliverAt and its answer reaches the holder replyDelay later.
type renewCall struct {
	h          *holder
	t          store.Ticket
	sent       time.Duration
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
	s.tracef("renewal of %s (sent %v ago) reaches the store: %s", c.h.name, s.now().Mono-c.sent, result(c.res, c.err))
	if c.h.crashed {
		c.h.inflight = nil // nobody reads the answer
	}
}

// A holder is one `slotctl run`: a supervisor and its child.
type holder struct {
	s          *sim
	n, pid     int
	name       string
	limit      string
	ttl, every time.Duration
	margin     time.Duration
	grace      time.Duration // --kill-after
	waitFor    time.Duration // --wait; < 0 waits without bound
	runFor     time.Duration // how long the job runs if nobody stops it

	phase          hphase
	crashed        bool
	crashAfterCall bool
	paused         bool
	resumeAt       time.Duration
	wasPaused      bool
	resumedAt      time.Duration
	outageUntil    time.Duration // renewals fail until then

	c     *conn
	g     *gate.Gate
	entry *gate.Entry
	id    string

	joinedAt  time.Duration
	ticket    store.Ticket // the renewer's ticket, as last acknowledged
	lease     renew.Lease
	leased    bool // the renewer runs
	lost      bool
	lostAt    time.Duration
	nextRenew time.Duration
	failures  int
	inflight  *renewCall

	nextPoll time.Duration
	rung     bool
	expiryAt time.Duration // gate's expiry timer (head of the queue); 0 when not armed

	child      child
	sigterm    bool
	sigtermAt  time.Duration
	handledSig bool
	released   bool // mutation.ReleaseBeforeExit: released before the child stopped
	exit       string
}

func newHolder(s *sim, n int) *holder {
	lim := s.limits[s.rng.IntN(len(s.limits))]
	ttl := ttls[s.rng.IntN(len(ttls))]
	h := &holder{s: s, n: n, pid: 1000 + n, name: fmt.Sprintf("h%d", n), limit: lim.name,
		ttl: ttl, every: ttl / 3, margin: ttl / 10, grace: ttl / 5, waitFor: -1}
	if s.chance(0.25) {
		h.waitFor = s.between(ttl/2, 4*ttl)
	}
	h.runFor = s.between(ttl/20, 3*ttl/2)
	h.c = s.newConn(h.name, h)
	h.g = &gate.Gate{Store: h.c, PollEvery: time.Hour, Rand: s.rng.Float64}
	return h
}

func (h *holder) bug(b mutation.Bug) bool { return h.s.cfg.Mutations.Has(b) }

func (h *holder) live() bool { return !h.crashed && h.phase != hDone }

// renewing: the renewer sends renewals now.
func (h *holder) renewing() bool {
	return h.leased && !h.lost && h.inflight == nil && (h.phase == hWait || h.phase == hRun)
}

func (h *holder) wake() time.Duration {
	if !h.live() {
		return never
	}
	if h.paused {
		return h.resumeAt
	}
	switch h.phase {
	case hJoin, hAdmitted, hRecord, hDrain:
		return 0
	}
	if h.sigterm && !h.handledSig {
		return 0
	}
	w := never
	if c := h.inflight; c != nil && c.delivered {
		w = min(w, c.replyAt)
	}
	if h.leased && !h.lost {
		w = min(w, h.lease.Deadline())
	}
	if h.renewing() {
		w = min(w, h.nextRenew)
	}
	switch h.phase {
	case hWait:
		if h.rung {
			return 0
		}
		w = min(w, h.nextPoll)
		if h.expiryAt != 0 {
			w = min(w, h.expiryAt)
		}
		if h.waitFor >= 0 {
			w = min(w, h.joinedAt+h.waitFor)
		}
	case hRun:
		if h.child.running {
			w = min(w, h.child.end)
			if h.child.stopAt != 0 {
				w = min(w, h.child.killAt)
			}
		}
	}
	return w
}

func (h *holder) act() {
	now := h.s.now().Mono
	if h.paused {
		h.paused, h.resumedAt = false, now
		h.s.tracef("%s resumes (SIGCONT) and checks its lease", h.name)
		h.checkLease(now) // keeper.Check on SIGCONT
		return
	}
	switch h.phase {
	case hJoin:
		h.join(now)
	case hAdmitted:
		h.admitted(now)
	case hRecord:
		h.recordChild()
	case hDrain:
		h.drain(now)
	case hWait, hRun:
		h.supervise(now)
	}
}

func (h *holder) join(now time.Duration) {
	s := h.s
	h.id = s.newID()
	slots := 1
	for _, l := range s.limits {
		if l.name == h.limit {
			slots = l.slots
		}
	}
	req := store.EnqueueRequest{ID: h.id, Limit: h.limit, Slots: slots, TTL: h.ttl,
		Holder: store.Holder{Host: "sim", Pid: h.pid, Label: h.name}}
	if !s.quiet && s.cfg.Faults.Has(LostReply) && s.chance(0.06) {
		h.c.enqFault = 1 + s.rng.IntN(2)
	}
	sentAt := now
	entry, err := h.g.Join(s.ctx, req)
	h.joinedAt = now
	if err != nil {
		s.tracef("%s joins %s as %s: %v (the gate cancels the id)", h.name, h.limit, short(h.id), err)
		h.finish("join failed")
		return
	}
	h.entry, h.ticket = entry, entry.Ticket()
	if !h.bug(mutation.WaiterNotRenewed) {
		// Renew from the first write: the enqueue counts as the first ack.
		h.startRenewer(sentAt)
	}
	s.tracef("%s joins %s as %s: %s", h.name, h.limit, short(h.id), result(h.ticket, nil))
	if h.ticket.State == store.Held {
		h.phase = hAdmitted
		return
	}
	h.phase = hWait
	h.nextPoll = now + h.s.jitter(pollEvery)
}

func (h *holder) startRenewer(sentAt time.Duration) {
	h.lease = renew.NewLease(sentAt, h.ttl, h.margin)
	h.leased = true
	h.nextRenew = sentAt + h.s.jitter(h.every)
}

// supervise does the one thing due now, in the order the Keeper and the
// supervisor would notice them.
func (h *holder) supervise(now time.Duration) {
	s := h.s
	if c := h.inflight; c != nil && c.delivered && c.replyAt <= now {
		h.inflight = nil
		s.tracef("%s reads its late renewal answer", h.name)
		h.answer(now, c.sent, c.res, c.err)
		return
	}
	if h.leased && !h.lost && h.lease.Expired(now) {
		h.loseLease(now, "no renewal acknowledged before the local deadline")
		return
	}
	if h.sigterm && !h.handledSig {
		h.onSignal(now)
		return
	}
	if h.phase == hRun && h.child.running {
		if h.child.stopAt != 0 && now >= h.child.killAt && h.child.end > h.child.killAt {
			h.child.end = now
			s.tracef("%s: child ignored SIGTERM for %v: SIGKILL", h.name, h.grace)
		}
		if now >= h.child.end {
			h.child.running = false
			h.phase = hDrain
			s.tracef("%s: child exited (ran %v)", h.name, now-h.child.start)
			return
		}
	}
	if h.renewing() && now >= h.nextRenew {
		h.sendRenewal(now)
		return
	}
	if h.phase == hWait {
		if h.waitFor >= 0 && now >= h.joinedAt+h.waitFor {
			s.tracef("%s gives up after --wait %v", h.name, h.waitFor)
			h.leave(now, store.Cancelled, "busy")
			return
		}
		if h.expiryAt != 0 && now >= h.expiryAt {
			// gate.Wait: the first holder's lease ran out: sweep, then read.
			h.expiryAt = 0
			list, err := h.c.Reap(s.ctx, false, h.limit)
			s.tracef("%s (next in line) sweeps %s: %d removed %s", h.name, h.limit, len(list), errString(err))
			h.poll(now)
			return
		}
		if h.rung || now >= h.nextPoll {
			h.poll(now)
			return
		}
	}
}

// poll is one round of gate's Entry.Wait: a bell (or the poll timer) wakes
// it, it reads the ticket once, and the step ends.
func (h *holder) poll(now time.Duration) {
	s := h.s
	h.rung = false
	h.c.bell.ring()
	h.c.lastSnap = nil
	// The Get cancels ctx, so Wait returns after one round. The timeout
	// only guards the test against a Wait that never reaches its Get.
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	h.c.oneShot = cancel
	t, err := h.entry.Wait(ctx, -1, nil)
	h.c.oneShot = nil
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		s.fail("sim", "%s: gate.Wait did not return after one poll", h.name)
		return
	}
	switch {
	case err == nil:
		s.tracef("%s polls: %s", h.name, result(t, nil))
		h.phase = hAdmitted
	case errors.Is(err, store.ErrLost):
		s.tracef("%s polls: its waiting ticket is gone", h.name)
		h.lost, h.lostAt = true, now
		h.leave(now, store.Cancelled, "lost while waiting")
	default:
		s.tracef("%s polls: still %s", h.name, result(h.entry.Ticket(), nil))
		h.nextPoll = now + s.jitter(pollEvery)
		h.armExpiry(now)
	}
}

// armExpiry is gate's watchExpiry, from the Snapshot the poll's Wait read:
// the head of the queue wakes when the first holder's lease runs out.
func (h *holder) armExpiry(now time.Duration) {
	snap := h.c.lastSnap
	if snap == nil || h.entry.Ticket().Position != 1 {
		return
	}
	if d, ok := gate.HeadExpiry(*snap); ok {
		h.expiryAt = now + d
	}
}

// admitted is run.go between Wait and startChild: start the child only
// with a lease that has time left.
func (h *holder) admitted(now time.Duration) {
	s := h.s
	s.stats.Admitted++
	if h.bug(mutation.WaiterNotRenewed) {
		h.startRenewer(now) // the renewer starts at admission, counting from it
	}
	if h.lost || h.lease.Expired(now) {
		s.tracef("%s: admitted, but its lease is lost: exits without starting the job", h.name)
		h.stopRenewer()
		h.lost = true
		h.finish("lost before start")
		return
	}
	h.child = child{start: now, end: now + h.runFor, running: true}
	h.phase = hRecord
	s.tracef("%s: admitted to slot %d, starts its job (local deadline in %v)", h.name, h.entry.Ticket().Slot, h.lease.Deadline()-now)
}

func (h *holder) recordChild() {
	_, err := h.c.SetChild(h.s.ctx, h.entry.Ticket(), h.pid+100000, 1)
	h.s.tracef("%s records its child's group: %v", h.name, errString(err))
	h.phase = hRun
}

func (h *holder) sendRenewal(now time.Duration) {
	s := h.s
	t := h.ticket
	s.remember(request{kind: "renew", t: t, ttl: h.ttl, owner: h, who: h.name})
	switch {
	case now < h.outageUntil:
		s.tracef("%s renews: store unreachable", h.name)
		h.answer(now, now, store.Ticket{}, errReplyLost)
		return
	case !s.quiet && s.cfg.Faults.Has(RenewFail) && s.chance(0.04):
		s.tracef("%s renews: the call fails before the store", h.name)
		h.answer(now, now, store.Ticket{}, errReplyLost)
		return
	case !s.quiet && s.cfg.Faults.Has(RenewFail) && s.chance(0.04):
		res, err := h.c.Renew(s.ctx, t, h.ttl)
		s.tracef("%s renews: the store answers %s, the answer is lost", h.name, result(res, err))
		h.answer(now, now, store.Ticket{}, errReplyLost)
		return
	case !s.quiet && s.cfg.Faults.Has(RenewDelay) && s.chance(0.12):
		c := &renewCall{h: h, t: t, sent: now, deliverAt: now + s.between(0, 3*h.ttl/5), replyDelay: s.between(0, 2*h.ttl/5)}
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
	h.answer(now, now, res, err)
}

// answer is the Keeper's handling of a renewal's result.
func (h *holder) answer(now, sent time.Duration, res store.Ticket, err error) {
	if h.crashed || h.lost {
		return
	}
	switch {
	case err == nil:
		if !h.lease.Acked(sent, now) {
			h.loseLease(now, "the ack came after the local deadline")
			return
		}
		h.ticket = res
		h.failures = 0
		h.nextRenew = sent + h.s.jitter(h.every)
	case errors.Is(err, store.ErrLost):
		h.loseLease(now, "the store refused the renewal")
	default:
		if h.lease.Expired(now) {
			h.loseLease(now, "no renewal acknowledged before the local deadline")
			return
		}
		h.failures++
		h.nextRenew = now + h.backoff(h.failures)
	}
}

// backoff is the Keeper's: doubling from Every/10 (at least 100ms), capped at Every/2, jittered.
func (h *holder) backoff(n int) time.Duration {
	cap := h.every / 2
	d := min(max(h.every/10, 100*time.Millisecond), cap)
	for i := 1; i < n && d < cap; i++ {
		d *= 2
	}
	return h.s.jitter(min(d, cap))
}

func (h *holder) checkLease(now time.Duration) {
	if h.leased && !h.lost && h.lease.Expired(now) && (h.phase == hWait || h.phase == hRun) {
		h.loseLease(now, "the local deadline passed while stopped")
	}
}

// loseLease: the lease is presumed lost. Waiting, the run leaves the
// queue; running, the child is stopped (--on-lost kill).
func (h *holder) loseLease(now time.Duration, why string) {
	s := h.s
	h.lost, h.lostAt = true, now
	s.stats.Lost++
	s.tracef("%s: lease lost: %s", h.name, why)
	switch h.phase {
	case hWait:
		h.leave(now, store.Cancelled, "lost while waiting")
	case hRun:
		h.stopChild(now)
	}
}

func (h *holder) onSignal(now time.Duration) {
	h.handledSig, h.sigtermAt = true, now
	switch h.phase {
	case hWait:
		h.s.tracef("%s: SIGTERM while waiting: leaves the queue", h.name)
		h.leave(now, store.Cancelled, "signalled")
	case hRun:
		if h.bug(mutation.ReleaseBeforeExit) && !h.released {
			h.s.tracef("%s: SIGTERM: releases first, then stops its child", h.name)
			h.stopRenewer()
			h.leased = false
			removed, err := h.entry.Leave(h.s.ctx, store.Released)
			h.released = true
			h.s.tracef("%s releases: removed=%v %s", h.name, removed, errString(err))
		}
		h.s.tracef("%s: SIGTERM: forwards it to the child", h.name)
		h.stopChild(now)
	}
}

// stopChild sends SIGTERM; the child exits within 1.5 kill graces, and is
// killed at one.
func (h *holder) stopChild(now time.Duration) {
	c := &h.child
	if !c.running || c.stopAt != 0 {
		return
	}
	c.stopAt, c.killAt = now, now+h.grace
	c.end = min(c.end, now+h.s.between(0, 3*h.grace/2))
	h.s.tracef("%s: SIGTERM to its child", h.name)
}

// stopRenewer is keeper.Stop: a renewal still in flight either reaches the
// store now or is cancelled before it does; either way it is over.
func (h *holder) stopRenewer() {
	c := h.inflight
	if c == nil {
		return
	}
	if !c.delivered && h.s.chance(0.5) {
		c.deliver()
	}
	h.inflight = nil
}

// drain: the child and its group are gone; stop the renewer, then release.
func (h *holder) drain(now time.Duration) {
	h.stopRenewer()
	if h.released {
		h.finish("released early")
		return
	}
	why, exit := store.Released, "ok"
	if h.lost {
		why, exit = store.Lost, "lost"
	}
	removed, err := h.entry.Leave(h.s.ctx, why)
	h.s.tracef("%s releases (%s): removed=%v %s", h.name, why, removed, errString(err))
	if exit == "ok" {
		h.s.stats.Finished++
	}
	h.finish(exit)
}

func (h *holder) leave(now time.Duration, why store.Reason, exit string) {
	h.stopRenewer()
	removed, err := h.entry.Leave(h.s.ctx, why)
	h.s.tracef("%s leaves (%s): removed=%v %s", h.name, why, removed, errString(err))
	h.finish(exit)
}

func (h *holder) finish(exit string) {
	h.phase, h.exit = hDone, exit
	h.leased = false
}

func (h *holder) crash() {
	if h.crashed {
		return
	}
	h.crashed, h.paused = true, false
	h.child.running = false // parent-death signal
	h.s.stats.Crashes++
	h.s.tracef("%s crashes (in %s)", h.name, h.phase)
}

func (h *holder) pause(d time.Duration) {
	h.paused, h.wasPaused = true, true
	h.resumeAt = h.s.now().Mono + d
	h.s.stats.Pauses++
	h.s.tracef("%s stopped (SIGSTOP) for %v; its child runs on", h.name, d)
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
