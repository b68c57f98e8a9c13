package sim

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/slotctl/slotctl/store"
)

// The model is what must be true, kept apart from the store: the live
// tickets as the calls' answers say they are, the removed and refused ids,
// the limits. After a step it reads a Snapshot of the real store and
// compares; everything the store did on its own (sweeps, promotions) must be
// something the rules allow.
type model struct {
	s       *sim
	live    map[string]*mTicket
	refused map[string]bool // ids the store must refuse: removed, or cancelled before create
	// mayRefuse: ids the store may refuse, tombstoned by a release whose
	// answer was lost after it committed (etcd-lost-answer).
	mayRefuse map[string]bool
	removals  map[string]int
	gone      map[string]goneRec
	// found is the ids of gone whose records etcd may keep (goneRec.found).
	found    map[string]bool
	maxFence uint64
	limits   map[string]*mLimit

	// Newer runs first (docs/leases.md §2.1 item 10), this step's: the
	// superseding enqueues and the refusals of --max-waiting. owners
	// outlives the live set: a replacing job's child must not overlap the
	// replaced one's (S19), whatever became of its ticket.
	sups    []*supStep
	qfull   []*supStep
	owners  map[string]*holder
	replace map[string][]string // ticket -> the tickets it replaces

	counts map[string]store.Counts // each limit's counts at the last check (S22, counts.go)
	grew   []growth                // this step's resizes that took slots (S21)
	shrank bool                    // this step shrank a ticket

	// This step's waiters: those that waited before it and those it
	// enqueued (fresh), whatever became of them: every waiter a settle of
	// the step may have ordered (sched.go).
	waiters map[string]*mTicket
	fresh   map[string]bool
}

// A supStep is one enqueue of this step with --supersede or --replace (or
// a refusal of --max-waiting): the older waiting tickets of its key that
// share a limit with it (the supersede removes exactly those, S16), and the
// held ones (never removed, S17; asked to stop with --replace, S18).
type supStep struct {
	id      string
	key     string
	limits  []string
	first   bool // the step's first store call: the model's states are the store's
	victims map[string]bool
	held    map[string]bool
	unasked []string // held, of its key, not in its Replaces: gone by the diff, or S18
}

type mTicket struct {
	id     string
	limits []string // in the order requested; the first is its view's
	weight int      // slots it takes in each of its limits
	fence  uint64
	state  store.State
	slots  map[string][]int // held: its slot indexes in each limit
	boot   string
	dl     time.Duration // deadline on the store's boot clock
	ttl    time.Duration
	quiet  bool // a waiter not yet in line: no deadline judged (docs/leases.md rule 17)
	owner  *holder
	key    string
	stop   string   // the newer ticket that asked it to stop (--replace)
	repl   []string // the held tickets it replaces, as its enqueue answered
	// Scheduling (sched.go): its priority and share as enqueued, its
	// creation on the store's wall clock (as stored), and how many times
	// the wall clock had stepped back when it was enqueued.
	prio    int
	share   string
	created time.Time
	epoch   int
	// keptAt: the last step at which the store had to keep it expired,
	// its supervisor provably running (S28): L1's bound counts from then.
	keptAt time.Duration
}

// shares: t names one of the limits.
func (t *mTicket) shares(limits []string) bool { return slices.ContainsFunc(limits, t.names) }

// names reports whether t names limit.
func (t *mTicket) names(limit string) bool { return slices.Contains(t.limits, limit) }

// slot is its lowest index in its first limit, -1 while waiting.
func (t *mTicket) slot() int {
	if ix := t.slots[t.limits[0]]; len(ix) > 0 {
		return ix[0]
	}
	return -1
}

type goneRec struct {
	why    string
	force  bool // an operator's release
	file   bool // lost with the store's file (store-lost; force too)
	forgot bool // removed before the store's file was deleted: the store forgot it
	swept  bool // expired or proven dead, removed by a sweep or a reap
	// found: swept because a call found it gone, not because a call
	// removed it (etcd may keep its record until a step removes it).
	found  bool
	expiry time.Duration // when its lease ran out (for swept)
	by     string        // superseded: the newer ticket
	sure   bool          // superseded while no sweep could have removed it first
	limits []string      // superseded: its limits
	at     time.Duration // when it left the live set
}

type mLimit struct {
	slots int
	over  int          // held beyond slots allowed after a shrink; shrinks as they leave
	pol   store.Policy // as the operator set it
	// admits is when the model saw admissions to a rated limit, on the
	// store's wall clock, since its rate was last set or the wall clock
	// last stepped back (S23).
	admits []time.Time
}

func newModel(s *sim) *model {
	return &model{s: s, live: map[string]*mTicket{}, refused: map[string]bool{}, removals: map[string]int{},
		gone: map[string]goneRec{}, found: map[string]bool{}, limits: map[string]*mLimit{},
		owners: map[string]*holder{}, replace: map[string][]string{}, waiters: map[string]*mTicket{}, fresh: map[string]bool{}}
}

func (m *model) fail(rule, format string, args ...any) { m.s.fail(rule, format, args...) }

// storeLost: the store's file was deleted. Every live ticket is gone, as
// if force-released (its holder's job may run to its lease's end, S2);
// the new file refuses no id, issues fences from 1 again and knows no
// limit, counter or event, so neither does the model from now on.
func (m *model) storeLost() {
	for _, t := range m.sorted() {
		m.remove(t, goneRec{why: "lost with the store's file", force: true, file: true})
	}
	for id, g := range m.gone {
		g.forgot, g.sure = true, false // the store forgot it, its successor too, with the file
		m.gone[id] = g
	}
	m.refused, m.removals = map[string]bool{}, map[string]int{}
	m.maxFence = 0
	m.limits, m.counts = map[string]*mLimit{}, nil
}

func (m *model) sorted() []*mTicket {
	out := make([]*mTicket, 0, len(m.live))
	for _, t := range m.live {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *mTicket) int { return cmp.Compare(a.fence, b.fence) })
	return out
}

func (m *model) expired(t *mTicket, now Instant) bool {
	if t.quiet && t.state == store.Waiting && t.boot == now.Boot {
		return false
	}
	return t.boot != now.Boot || now.Mono >= t.dl
}

// learn takes from a view of t what the store decides on its own: a quiet
// waiter come into line or admitted gets a whole lease from now, as does a
// waiter admitted late (docs/leases.md rule 17). A quiet view of a ticket
// that was not quiet is a violation.
func (m *model) learn(what string, v store.Ticket, t *mTicket, now Instant) bool {
	switch {
	case v.Quiet && !t.quiet:
		m.fail("S13", "%s of %s: quiet again, after it came into line", what, short(t.id))
		return false
	case v.Quiet && v.State != store.Waiting:
		m.fail("S13", "%s of %s: quiet, but %s", what, short(t.id), v.State)
		return false
	case t.quiet && !v.Quiet:
		t.quiet = false
		t.boot, t.dl = now.Boot, now.Mono+t.ttl
	case t.state == store.Waiting && v.State == store.Held && m.s.admissionRenews():
		t.boot, t.dl = now.Boot, now.Mono+t.ttl
	}
	return true
}

// expiry is when t's lease ran out, on the current boot's clock.
func (m *model) expiry(t *mTicket, now Instant) time.Duration {
	if t.boot != now.Boot {
		return m.s.rebootAt
	}
	return t.dl
}

// left is the lease the store must report for t now.
func (m *model) left(t *mTicket, now Instant) time.Duration {
	if t.boot != now.Boot {
		return 0
	}
	return t.dl - now.Mono
}

// mayReap: a sweep may remove t now, expired or its holder proven dead.
// keptAlive: t is a waiting ticket that the store must keep past its
// deadline, since its supervisor provably runs on the store's host (the
// real judge's SupervisorAlive can read it: same boot and pid namespace as
// the reapers', a start time recorded), as a host-local store does (S28,
// docs/leases.md rule 17).
func (m *model) keptAlive(t *mTicket) bool {
	h := t.owner
	return m.s.aliveOn && t.state == store.Waiting && h != nil && h.sup.alive() && h.reapable() && h.rec.PidStart != 0
}

func (m *model) mayReap(t *mTicket, now Instant) bool {
	if m.expired(t, now) || m.near(t, now) {
		return true
	}
	return m.s.judged[t.id] && t.owner != nil && !t.owner.live()
}

func (m *model) remove(t *mTicket, g goneRec) {
	g = m.setBackGone(t, g)
	delete(m.live, t.id)
	m.removals[t.id]++
	if n := m.removals[t.id]; n > 1 {
		m.fail("S5", "ticket %s of %s left the live set %d times", short(t.id), ownerName(t.owner), n)
	}
	m.refused[t.id] = true
	g.at = m.s.now().Mono
	m.gone[t.id] = g
	if h := t.owner; h != nil && !g.force {
		m.orphansLeft(h, g)
	}
}

func (m *model) sweep(t *mTicket, now Instant) {
	m.remove(t, goneRec{why: "reaped", swept: true, expiry: m.expiry(t, now)})
}

func (m *model) limit(name string, slots int) *mLimit {
	l := m.limits[name]
	if l == nil {
		l = &mLimit{slots: slots}
		m.limits[name] = l
	}
	return l
}

// held is the slots held in limit: its held tickets' weights.
func (m *model) held(limit string) int {
	n := 0
	for _, t := range m.live {
		if t.state == store.Held && t.names(limit) {
			n += t.weight
		}
	}
	return n
}

// size is a limit's size as an enqueue of req finds it: its own, or the
// size req creates it with.
func (m *model) size(name string, req store.EnqueueRequest) int {
	if l := m.limits[name]; l != nil {
		return l.slots
	}
	return req.Slots
}

// fits: no limit of req is smaller than its weight (a paused one, 0, takes any).
func (m *model) fits(req store.EnqueueRequest) bool {
	for _, name := range req.Names() {
		if n := m.size(name, req); n > 0 && req.Weighs() > n {
			return false
		}
	}
	return true
}

// check runs after every step.
func (m *model) check() {
	s := m.s
	now := s.now()
	if len(s.log) > 0 {
		m.sups, m.qfull, m.grew, m.shrank = m.sups[:0], m.qfull[:0], m.grew[:0], false
		clear(m.waiters)
		clear(m.fresh)
		for _, t := range m.live {
			if t.state != store.Held {
				m.waiters[t.id] = t
			}
		}
		for i, o := range s.log {
			o.first = i == 0
			m.apply(o, now)
			if s.viol != nil {
				return
			}
		}
		snap, err := s.checker.Snapshot(s.ctx)
		if err != nil {
			m.fail("S12", "snapshot: %v", err)
			return
		}
		m.diff(snap, now)
		if s.viol != nil {
			return
		}
		if m.counted(); s.viol != nil {
			return
		}
		m.jobs()
		if s.viol != nil {
			return
		}
	}
	m.holders(now)
	if s.viol == nil {
		m.reclaimed(now)
	}
}

func unexpected(err error) bool {
	return err != nil && !errors.Is(err, store.ErrLost) && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrRemoved)
}

// apply learns one call's answer.
func (m *model) apply(o *op, now Instant) {
	if o.unknown && m.unknownOutcome(o) {
		return
	}
	if o.kind == "resize" {
		m.resize(o, now) // its refusals are its own (S21)
		return
	}
	var heavy *store.WeightError
	if o.kind == "enqueue" && errors.As(o.err, &heavy) {
		// A late duplicate may find a limit shrunk below its weight since.
		if !slices.Contains(o.req.Names(), heavy.Limit) || m.size(heavy.Limit, o.req) != heavy.Slots || m.fits(o.req) {
			m.fail("S14", "enqueue of %s (weight %d, limits %v) refused: %v; the model's sizes fit it", short(o.req.ID), o.req.Weighs(), o.req.Names(), o.err)
		}
		return
	}
	var full *store.QueueFullError
	if o.kind == "enqueue" && errors.As(o.err, &full) {
		m.refusedFull(o, full, now)
		return
	}
	if errors.Is(o.err, store.ErrLimitNotFound) && m.s.stats.StoresLost+m.s.stats.Restores > 0 {
		return // a limit the store's deleted file (or a restored older copy) took with it, not made again yet
	}
	if unexpected(o.err) {
		m.fail("S12", "%s by %s failed: %v", o.kind, o.who, o.err)
		return
	}
	switch o.kind {
	case "enqueue":
		id := o.req.ID
		t := m.live[id]
		switch {
		case o.err == nil && t != nil:
			if o.res.Fence != t.fence {
				m.fail("S14", "a retried enqueue of %s returned fence %d, not %d", short(id), o.res.Fence, t.fence)
				return
			}
			m.view("a retried enqueue", o.res, t)
		case o.err == nil:
			if m.refused[id] {
				m.fail("S7", "removed ticket id %s (%s) was enqueued again by %s: fence %d", short(id), m.gone[id].why, o.who, o.res.Fence)
				return
			}
			if o.res.Fence <= m.maxFence {
				m.fail("S8", "new ticket %s has fence %d, not above %d", short(id), o.res.Fence, m.maxFence)
				return
			}
			m.maxFence = o.res.Fence
			if !m.fits(o.req) {
				m.fail("S1", "enqueue of %s of weight %d accepted, heavier than one of its limits %v", short(id), o.req.Weighs(), o.req.Names())
				return
			}
			for _, name := range o.req.Names() {
				m.limit(name, o.req.Slots)
			}
			t := &mTicket{id: id, limits: slices.Clone(o.req.Names()), weight: o.req.Weighs(), fence: o.res.Fence, state: store.Waiting,
				boot: now.Boot, dl: now.Mono + o.req.TTL, ttl: o.req.TTL, owner: o.owner, key: o.req.Key,
				quiet: o.res.Quiet, prio: o.req.Priority, share: o.req.Share, created: now.Wall, epoch: m.s.wallBacks}
			if t.share == "" {
				t.share = o.req.Holder.User // store.Ticket.ShareKey
			}
			m.waiters[id], m.fresh[id] = t, true
			m.owners[id] = o.owner
			if !m.newer(o, t, now) {
				return
			}
			m.live[id] = t
			m.view("enqueue", o.res, t)
		case errors.Is(o.err, store.ErrRemoved):
			if t != nil && !m.sweptBefore(t, now) || t == nil && !m.refused[id] && !m.mayRefuse[id] {
				m.fail("S14", "enqueue of %s refused as removed, but it never was", short(id))
			}
		default:
			m.fail("S14", "enqueue of %s: %v", short(id), o.err)
		}
	case "renew":
		t := m.live[o.t.ID]
		switch {
		case t != nil && t.fence == o.t.Fence && m.lostWaiting(o, t):
		case o.err == nil:
			switch {
			case t == nil && m.refused[o.t.ID]:
				m.fail("S7", "renewal by %s of removed ticket %s (%s) accepted", o.who, short(o.t.ID), m.gone[o.t.ID].why)
			case t == nil:
				m.fail("S7", "renewal by %s of unknown ticket %s accepted", o.who, short(o.t.ID))
			case t.fence != o.t.Fence:
				m.fail("S8", "renewal with fence %d of ticket %s (fence %d) accepted", o.t.Fence, short(t.id), t.fence)
			case m.expired(t, now) && t.state == store.Held && !m.near(t, now):
				m.fail("S7", "renewal by %s of held ticket %s accepted %v after it expired", o.who, short(t.id), now.Mono-m.expiry(t, now))
			default:
				// A waiter's late renewal is accepted while its ticket is
				// stored (docs/leases.md rule 17).
				t.boot, t.dl = now.Boot, now.Mono+o.ttl
				m.view("renewal", o.res, t)
			}
		case t != nil && t.fence == o.t.Fence && m.expired(t, now) && m.keptAlive(t) && errors.Is(o.err, store.ErrLost):
			m.fail("S28", "late renewal by %s of waiting ticket %s refused (%v) while its supervisor provably runs", o.who, short(t.id), o.err)
		case t != nil && t.fence == o.t.Fence && !m.expired(t, now) && !m.sweptBefore(t, now):
			// (A renewal's own sweep may remove a ticket whose holder is proven dead.)
			m.fail("S6", "renewal by %s of live ticket %s refused: %v", o.who, short(t.id), o.err)
		case o.err != nil && m.live[o.t.ID] == nil:
			m.supersededErr(o, o.t.ID)
		}
	case "release":
		if h := o.owner; h != nil && o.who == h.name && h.id == o.t.ID && h.child.running {
			m.fail("S10", "%s released its ticket %s while its child runs", h.name, short(h.id))
		}
		t := m.live[o.t.ID]
		match := t != nil && (o.t.Fence == 0 || t.fence == o.t.Fence)
		switch {
		case o.removed && t == nil && m.s.recordLeft(m.gone[o.t.ID]):
			m.recordRemoved(o.t.ID)
			m.s.stats.RecordsReleased++
		case o.removed && !match:
			m.fail("S4", "a release by %s removed ticket %s, which was not live", o.who, short(o.t.ID))
		case o.removed:
			m.remove(t, goneRec{why: string(o.why) + " by " + o.who, force: o.why == store.ForceReleased})
		case match && !m.sweptBefore(t, now):
			m.fail("S4", "a release by %s left live ticket %s in place", o.who, short(o.t.ID))
		case t == nil:
			m.refused[o.t.ID] = true
			m.recordRemoved(o.t.ID)
		case match:
			m.recordRemoved(o.t.ID) // it said so: swept
		}
	case "get":
		t := m.live[o.t.ID]
		switch {
		case o.err == nil && t == nil:
			m.fail("S7", "Get found ticket %s, which is not live", short(o.t.ID))
		case o.err == nil && o.res.Fence != t.fence:
			m.fail("S8", "Get of %s returned fence %d, not %d", short(t.id), o.res.Fence, t.fence)
		case o.err == nil:
			m.view("Get", o.res, t)
		case o.err != nil && t != nil && !m.sweptBefore(t, now):
			m.fail("S4", "Get lost live ticket %s: %v", short(t.id), o.err)
		case o.err != nil && m.live[o.t.ID] == nil:
			m.supersededErr(o, o.t.ID)
		}
	case "setchild":
		t := m.live[o.t.ID]
		ok := t != nil && t.fence == o.t.Fence && (!m.expired(t, now) && !m.quietPast(t, now) || m.near(t, now))
		if o.err == nil && !ok {
			m.fail("S7", "SetChild of %s accepted, but it is gone or expired", short(o.t.ID))
		} else if o.err != nil && ok && !m.sweptBefore(t, now) {
			m.fail("S6", "SetChild of live ticket %s refused: %v", short(o.t.ID), o.err)
		}
	case "scan", "reap":
		for _, r := range o.removals {
			t := m.live[r.Ticket.ID]
			switch {
			case t == nil && m.s.awaitsSettle(r.Ticket, m.gone[r.Ticket.ID]):
				// Its record, which the model swept already (etcd.go).
				if o.kind == "reap" {
					m.recordRemoved(r.Ticket.ID)
				}
			case t == nil:
				m.fail("S5", "%s by %s lists ticket %s, which is not live", o.kind, o.who, short(r.Ticket.ID))
			case !m.mayReap(t, now):
				m.fail("S6", "%s by %s lists live ticket %s of %s (%s): its lease has %v left", o.kind, o.who, short(t.id),
					ownerName(t.owner), r.Evidence, m.left(t, now))
			case o.kind == "reap":
				m.sweep(t, now)
			}
			if m.s.viol != nil {
				return
			}
		}
		if o.kind == "reap" && !o.lostIn { // (etcdfault.go: what a lost answer removed is not listed)
			for _, t := range m.sorted() {
				if m.expired(t, now) && !m.near(t, now) && (len(o.lims) == 0 || slices.ContainsFunc(o.lims, t.names)) && !orphaned(t.owner) && !m.keptAlive(t) &&
					!m.s.notYetRevoked(t, now, o.rev0) {
					m.fail("L1", "a reap by %s left expired ticket %s of %s (expired %v ago)", o.who, short(t.id),
						ownerName(t.owner), now.Mono-m.expiry(t, now))
					return
				}
			}
		}
	case "setlimit":
		l := m.limit(o.name, o.slots)
		l.slots = o.slots
		l.over = max(0, m.held(o.name)-o.slots)
	case "setpolicy":
		m.setPolicy(o)
	}
}

// sweptBefore accounts for a call that finds gone a ticket the model has:
// a sweep earlier in this step may have removed it, if it was expired or
// its holder proven dead. Then the model removes it too.
func (m *model) sweptBefore(t *mTicket, now Instant) bool {
	if !m.mayReap(t, now) {
		return false
	}
	m.remove(t, goneRec{why: "reaped", swept: true, found: true, expiry: m.expiry(t, now)})
	m.found[t.id] = true
	return true
}

// recordRemoved notes that no record of id is left: a call removed it, or
// found it gone.
func (m *model) recordRemoved(id string) {
	if g, ok := m.gone[id]; ok && g.found {
		g.found = false
		m.gone[id] = g
	}
	delete(m.found, id)
}

// view checks one view of ticket t that the store returned (S15: held in
// all of its limits or in none), and that it names t's limits and weight.
// A view is its ticket under one limit (its first, or in a Snapshot the
// one it is listed under).
func (m *model) view(what string, v store.Ticket, t *mTicket) bool {
	if !slices.Equal(v.Names(), t.limits) || v.Weighs() != t.weight || !t.names(v.Limit) {
		m.fail("S8", "%s of %s: limits %v (under %s), weight %d; it was enqueued with %v, weight %d", what, short(t.id),
			v.Names(), v.Limit, v.Weighs(), t.limits, t.weight)
		return false
	}
	if v.Key != t.key {
		m.fail("S8", "%s of %s: key %q; it was enqueued with %q", what, short(t.id), v.Key, t.key)
		return false
	}
	if v.Priority != t.prio || v.ShareKey() != t.share {
		m.fail("S8", "%s of %s: priority %d, share %q; it was enqueued with %d, %q", what, short(t.id), v.Priority, v.ShareKey(), t.prio, t.share)
		return false
	}
	if got := v.Stop; (got == nil) != (t.stop == "") || got != nil && (got.Ticket != t.stop || m.owners[t.stop] != nil && got.Pid != m.owners[t.stop].sup.pid) {
		m.fail("S18", "%s of %s (%s): stop request %+v; the model's: %q", what, short(t.id), v.State, got, short(t.stop))
		return false
	}
	switch v.State {
	case store.Held:
		for _, name := range t.limits {
			if ix := v.In(name); len(ix) != t.weight || !increasing(ix) {
				m.fail("S15", "%s of %s: held, with slot indexes %v in %s: not %d distinct ones in each of %v", what, short(t.id), ix, name, t.weight, t.limits)
				return false
			}
		}
		if v.Slot != v.In(v.Limit)[0] {
			m.fail("S15", "%s of %s: slot %d under %s, its indexes there %v", what, short(t.id), v.Slot, v.Limit, v.In(v.Limit))
			return false
		}
	default:
		if v.Slot != -1 || len(v.Indexes) > 0 {
			m.fail("S15", "%s of %s: %s, but slot %d, indexes %v", what, short(t.id), v.State, v.Slot, v.Indexes)
			return false
		}
	}
	return true
}

// diff compares the model with the store after a step. A Snapshot lists a
// ticket under each of its limits.
func (m *model) diff(snap store.Snapshot, now Instant) {
	views := map[string][]store.Ticket{}
	var order []string
	for _, st := range snap.Tickets {
		if views[st.ID] == nil {
			order = append(order, st.ID)
		}
		views[st.ID] = append(views[st.ID], st)
	}
	for id := range m.found {
		if views[id] == nil {
			m.recordRemoved(id) // a step removed it
		}
	}
	var promoted []*mTicket
	var settling []store.Ticket
	for _, id := range order {
		vs := views[id]
		st := vs[0]
		if !m.listed(id, st) {
			return
		}
		t := m.live[id]
		switch {
		case t == nil && m.refused[id] && m.s.awaitsSettle(st, m.gone[id]):
			settling = append(settling, vs...) // its limits count it until then
			continue
		case t == nil && m.refused[id]:
			m.fail("S7", "removed ticket %s (%s) is live again, fence %d", short(id), m.gone[id].why, st.Fence)
			return
		case t == nil:
			m.fail("S4", "ticket %s appeared without an enqueue", short(id))
			return
		}
		var under []string
		for _, v := range vs {
			switch {
			case v.Fence != t.fence:
				m.fail("S8", "ticket %s changed fence: %d, was %d", short(t.id), v.Fence, t.fence)
				return
			case v.State != st.State:
				m.fail("S15", "ticket %s is %s under %s and %s under %s: admitted to some of its limits %v", short(t.id),
					st.State, st.Limit, v.State, v.Limit, t.limits)
				return
			case !m.view("the snapshot", v, t) || !m.shown(v, t, snap.Now):
				return
			}
			under = append(under, v.Limit)
		}
		if slices.Sort(under); !slices.Equal(under, sorted(t.limits)) {
			m.fail("S3", "ticket %s is listed under %v; it names %v", short(t.id), under, t.limits)
			return
		}
		switch {
		case t.state == store.Held && st.State != store.Held:
			m.fail("S1", "held ticket %s went back to %s", short(t.id), st.State)
			return
		case t.state == store.Held:
			for _, name := range t.limits {
				if ix := st.In(name); !slices.Equal(ix, t.slots[name]) {
					m.fail("S1", "held ticket %s moved in %s from slots %v to %v", short(t.id), name, t.slots[name], ix)
					return
				}
			}
		case st.State == store.Held:
			if !m.learn("the snapshot", st, t, now) {
				return
			}
			t.state, t.slots = store.Held, map[string][]int{}
			for _, name := range t.limits {
				t.slots[name] = slices.Clone(st.In(name))
			}
			promoted = append(promoted, t)
			m.s.tracef("the snapshot shows %s held", short(t.id))
		}
		if st.State == store.Waiting && !m.learn("the snapshot", st, t, now) {
			return
		}
		if t.quiet {
			continue // its deadline means nothing
		}
		if want := m.left(t, now); m.s.remainingOff(st.Remaining, want) {
			m.fail("S13", "ticket %s of %s: the store says %v left, its deadline says %v", short(t.id), ownerName(t.owner), st.Remaining, want)
			return
		}
	}
	for _, t := range m.sorted() {
		if views[t.id] != nil {
			continue
		}
		if m.vanished(t, now) {
			continue
		}
		if m.s.viol != nil {
			return
		}
		m.sweep(t, now)
	}
	if !m.asked() || !m.admittedBeside(promoted) {
		return
	}
	if len(snap.Limits) != len(m.limits) {
		m.fail("S1", "the store has %d limits, the model %d", len(snap.Limits), len(m.limits))
		return
	}
	all := m.sorted()
	for _, l := range snap.Limits {
		ml := m.limits[l.Name]
		if ml == nil || ml.slots != l.Slots {
			m.fail("S1", "limit %s has %d slots in the store, not %v", l.Name, l.Slots, ml)
			return
		}
		if l.Policy != ml.pol {
			m.fail("S1", "limit %s has policy %s in the store, not %s", l.Name, l.Policy, ml.pol)
			return
		}
		held, waiting, slots := 0, []*mTicket{}, map[int]*mTicket{}
		for _, t := range all {
			switch {
			case !t.names(l.Name):
			case t.state == store.Held:
				held += t.weight
				for _, ix := range t.slots[l.Name] {
					if o := slots[ix]; o != nil {
						m.fail("S1", "limit %s: slot %d held by %s and %s", l.Name, ix, short(o.id), short(t.id))
						return
					}
					slots[ix] = t
				}
			default:
				waiting = append(waiting, t)
			}
		}
		nwait := len(waiting)
		for _, v := range settling {
			switch {
			case v.Limit != l.Name:
			case v.State == store.Held:
				held += v.Weighs()
			default:
				nwait++
			}
		}
		if held != l.Held || nwait != l.Waiting {
			m.fail("S3", "limit %s counts %d slots held, %d waiting; its tickets say %d, %d", l.Name, l.Held, l.Waiting, held, nwait)
			return
		}
		var ps []*mTicket
		for _, p := range promoted {
			if p.names(l.Name) {
				ps = append(ps, p)
			}
		}
		if len(ps) > 0 {
			if held > l.Slots {
				m.fail("S1", "limit %s admitted %s: %d slots held of %d%s", l.Name, names(ps), held, l.Slots, m.stepCalls())
				return
			}
			for _, p := range ps {
				if ix := p.slots[l.Name]; ix[len(ix)-1] >= l.Slots {
					m.fail("S1", "ticket %s admitted to slots %v of %s, which has %d", short(p.id), ix, l.Name, l.Slots)
					return
				}
				// A FIFO limit's waiters go in ticket order whatever the
				// orders of their other limits (sched.go); the others' are
				// L11-L13's.
				for _, w := range waiting {
					if w.fence < p.fence && ml.pol.Ordered() == store.FIFO {
						m.fail("L4", "limit %s admitted %s (fence %d, weight %d, limits %v) before waiting %s (fence %d, weight %d, limits %v)",
							l.Name, short(p.id), p.fence, p.weight, p.limits, short(w.id), w.fence, w.weight, w.limits)
						return
					}
				}
			}
		}
		if held > l.Slots+ml.over {
			m.fail("S1", "limit %s has %d slots held of %d", l.Name, held, l.Slots)
			return
		}
		ml.over = min(ml.over, max(0, held-l.Slots))
	}
	if m.scheduled(promoted, now); m.s.viol != nil {
		return
	}
	for _, p := range promoted {
		if h := p.owner; h != nil && h.phase == hWait {
			h.rung = true // the promoter rings its bell
		}
	}
	if m.grown(promoted); m.s.viol != nil {
		return
	}
	m.stops()
	if m.logged(); m.s.viol != nil {
		return
	}
	m.heads(all)
}

// heads checks L3: no waiting ticket is the oldest waiter of each of its
// limits while each has room for its weight. Every write that frees or adds
// room settles every limit its tickets connect, in the same step, so the
// step that made room admits it. Only a ticket of FIFO limits without a
// rate is judged: elsewhere time alone reorders the waiters (aging) or
// opens room (a rate's window), and the next write admits them.
func (m *model) heads(all []*mTicket) {
	blocked := map[string]*mTicket{} // limit -> its oldest waiter
	for _, t := range all {
		if t.state == store.Held {
			continue
		}
		head := true
		for _, name := range t.limits {
			if blocked[name] != nil {
				head = false
			}
		}
		for _, id := range t.repl {
			if m.live[id] != nil {
				head = false // it waits for those it replaces, and blocks its limits meanwhile (S19)
			}
		}
		if head && m.plain(t) {
			var room []string
			for _, name := range t.limits {
				held, size := m.held(name), m.limits[name].slots
				if held+t.weight > size {
					room = nil
					break
				}
				room = append(room, fmt.Sprintf("%s %d/%d", name, held, size))
			}
			if room != nil {
				m.fail("L3", "ticket %s of %s (fence %d, weight %d) waits at the head of its limits, which have room (slots held/size: %v)%s",
					short(t.id), ownerName(t.owner), t.fence, t.weight, room, m.stepCalls())
				return
			}
		}
		for _, name := range t.limits {
			if blocked[name] == nil {
				blocked[name] = t
			}
		}
	}
}

// jobs checks the tickets job by job (L9, L10): a job never holds a ticket
// while it waits for another, so no waiting job waits for one that waits.
func (m *model) jobs() {
	type job struct{ held, waiting []*mTicket }
	js := map[*holder]*job{}
	var order []*holder
	for _, t := range m.sorted() {
		if t.owner == nil {
			continue
		}
		j := js[t.owner]
		if j == nil {
			j = &job{}
			js[t.owner] = j
			order = append(order, t.owner)
		}
		if t.state == store.Held {
			j.held = append(j.held, t)
		} else {
			j.waiting = append(j.waiting, t)
		}
	}
	// L10: the wait-for graph: a job waits for each job that holds a slot
	// in a limit it waits in. A cycle is a deadlock: none of them lets go.
	waitsFor := func(h *holder) []*holder {
		var out []*holder
		for _, w := range js[h].waiting {
			for _, o := range order {
				if o == h || slices.Contains(out, o) {
					continue
				}
				for _, ht := range js[o].held {
					if slices.ContainsFunc(w.limits, ht.names) {
						out = append(out, o)
						break
					}
				}
			}
		}
		return out
	}
	state := map[*holder]int{} // 1 on the path, 2 done
	var path []*holder
	var visit func(h *holder) bool
	visit = func(h *holder) bool {
		state[h] = 1
		path = append(path, h)
		for _, o := range waitsFor(h) {
			switch state[o] {
			case 1:
				i := slices.Index(path, o)
				var cyc []string
				for _, c := range path[i:] {
					cyc = append(cyc, m.jobString(c, js[c].held, js[c].waiting))
				}
				m.fail("L10", "a cycle of waiting jobs, each waiting for a slot the next holds: %s", strings.Join(cyc, " -> "))
				return true
			case 0:
				if visit(o) {
					return true
				}
			}
		}
		path = path[:len(path)-1]
		state[h] = 2
		return false
	}
	for _, h := range order {
		if state[h] == 0 && visit(h) {
			return
		}
	}
	for _, h := range order {
		if j := js[h]; len(j.held) > 0 && len(j.waiting) > 0 {
			m.fail("L9", "%s holds while it waits: %s", h.name, m.jobString(h, j.held, j.waiting))
			return
		}
	}
}

func (m *model) jobString(h *holder, held, waiting []*mTicket) string {
	var hs, ws []string
	for _, t := range held {
		hs = append(hs, fmt.Sprintf("%s %v", short(t.id), t.limits))
	}
	for _, t := range waiting {
		ws = append(ws, fmt.Sprintf("%s %v", short(t.id), t.limits))
	}
	return fmt.Sprintf("%s (holds %s, waits %s)", h.name, strings.Join(hs, ", "), strings.Join(ws, ", "))
}

// increasing: ascending and distinct.
func increasing(ix []int) bool {
	for i := 1; i < len(ix); i++ {
		if ix[i] <= ix[i-1] {
			return false
		}
	}
	return true
}

func sorted(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return out
}

func names(ts []*mTicket) string {
	var out []string
	for _, t := range ts {
		out = append(out, short(t.id)+" of "+ownerName(t.owner))
	}
	return fmt.Sprint(out)
}

// stepCalls names this step's calls, for a violation's message.
func (m *model) stepCalls() string {
	var out []string
	for _, o := range m.s.log {
		out = append(out, o.kind+" by "+o.who)
	}
	return fmt.Sprintf(" (this step: %v)", out)
}

// holders checks the children and the holders' beliefs (S2, S9, S24).
func (m *model) holders(now Instant) {
	for _, h := range m.s.holders {
		if m.jobOutlives(h, now.Mono); m.s.viol != nil {
			return
		}
		if h.crashed {
			continue
		}
		m.holder(h, now)
		if m.s.viol != nil {
			return
		}
	}
}

func (m *model) holder(h *holder, now Instant) {
	t := m.live[h.id]
	// Its lease's end on its own clock, read on the store's: the drift
	// within the bound may move it by that much over a lease (clocks.go).
	// On etcd the model's end of the store's lease is the renewal's step
	// plus its TTL, while the store's handle measures what is left from
	// the renewal's real send time: real time ran ahead of the
	// simulation's by a lag that changes (the slack), so a waiter that
	// starts its lease from a read's Remaining may count on that much
	// beyond the model's end, never beyond the server's.
	if h.leased && !h.lost && t != nil && t.boot == now.Boot && !m.setBackBy(t) && h.storeAt(h.lease.Deadline()+h.margin) > t.dl+h.slack(h.ttl)+m.s.slack() {
		m.fail("S9", "%s counts on its lease until %v from now, but the store's ends in %v (its host's clock %v)", h.name,
			h.storeAt(h.lease.Deadline()+h.margin)-now.Mono, t.dl-now.Mono, h.sup.mc.clk)
	}
	m.heardStop(h, now)
	// The job is the command and, once it exits, what it left: the drain
	// still watches the lease (docs/leases.md rule 8).
	if !h.child.running && !slices.ContainsFunc(h.tree(), func(p *mproc) bool { return !h.hidden(p) }) || m.s.viol != nil {
		return
	}
	job := h.name + "'s child"
	if !h.child.running {
		job = h.name + "'s job (its command exited)"
	}
	if m.replacedRuns(h, now); m.s.viol != nil {
		return
	}
	if m.pausedPast(h, now); m.s.viol != nil {
		return
	}
	if m.guardStops(h, now, job); m.s.viol != nil {
		return
	}
	if m.sleptPast(h, now); m.s.viol != nil {
		return
	}
	if m.outlivesLease(h, now); m.s.viol != nil {
		return
	}
	stopped := h.stoppedAt(now.Mono)
	if t == nil || t.state != store.Held {
		g := m.gone[h.id]
		until := never
		switch {
		case stopped:
		case g.force:
			until = h.storeAt(h.lease.Deadline() + h.margin + h.grace)
		case g.swept:
			until = min(h.storeAt(h.lease.Deadline()+h.margin), g.expiry) + h.span(h.grace)
		default:
			until = 0
		}
		if now.Mono > until {
			if until == 0 {
				m.fail("S2", "%s runs without a lease: its ticket %s was %s", job, short(h.id), g.why)
			} else {
				m.fail("S2", "%s runs without a lease: its ticket %s was %s, %v past the allowed window "+
					"(margin %v + kill grace %v past the local deadline or the store's expiry)", job, short(h.id), g.why, now.Mono-until, h.margin, h.grace)
			}
			return
		}
	}
	if stopped {
		return
	}
	// On its own clock, which its timers keep.
	if local := h.hostNow(); h.leased && local > h.lease.Deadline()+h.grace {
		m.fail("S9", "%s runs %v past its local deadline", job, local-h.lease.Deadline())
		return
	} else if h.lost && local > h.lease.Expiry() {
		// The whole stop fits before the earliest moment the store could
		// judge the lease expired, whatever the kill grace.
		m.fail("S9", "%s still runs %v after its lost lease could expire in the store (kill grace %v, margin %v)", job, local-h.lease.Expiry(), h.grace, h.margin)
		return
	}
	if h.lost && now.Mono > h.lostAt+h.span(h.grace) || h.handledSig && now.Mono > h.sigtermAt+h.span(h.grace) {
		m.fail("S9", "%s still runs more than the kill grace %v after it was stopped", job, h.grace)
	}
}

// guardStops checks the job of a supervisor stopped alone (S29): its guard
// runs, and stops the job by itself at the lease's end: SIGTERM at the
// local deadline, SIGKILL half the margin later, before the store could
// judge the lease expired. So nothing of it runs then, and no slot is
// shared. (A host that slept has its guard's timers late: S31 judges it.)
func (m *model) guardStops(h *holder, now Instant, job string) {
	if !h.paused || h.child.guardStopped || !h.child.guard.alive() || !h.leased || h.wokeAt != 0 {
		return
	}
	local := h.hostNow()
	end := h.lease.Deadline() + h.margin/2
	if local <= end+time.Microsecond { // (the clocks' conversions round)
		return
	}
	if h.child.running && h.child.end > now.Mono {
		m.fail("S29", "%s runs %v past its lease's end while its supervisor is stopped and its guard is not", job, local-end)
		return
	}
	for _, p := range h.tree() {
		if p.end > now.Mono {
			m.fail("S29", "process %d of %s's job runs %v past its lease's end while its supervisor is stopped and its guard is not", p.pid, h.name, local-end)
			return
		}
	}
}

// pausedPast checks the child of a supervisor that was stopped (SIGSTOP)
// past its lease (S24). A stopped supervisor cannot stop its child, and a
// guard stopped with it cannot either (guardStops checks the one that
// runs), so the child runs on and
// its ticket expires and is reaped: its slot may be another's. On SIGCONT
// the supervisor checks its lease first, finds it lost and stops the child
// with SIGKILL at most stopAfterResume later (gate/holder's killBy). The
// child's run beside the slot's next holder, from its ticket's end (at the
// earliest the store's expiry, or an operator's forced release) to its own,
// is thus at most the pause beyond the ticket's end plus that.
func (m *model) pausedPast(h *holder, now Instant) {
	if !h.paused && !h.resumedLate {
		return
	}
	g, gone := m.gone[h.id]
	if gone {
		overlap := now.Mono - g.at
		m.s.stats.PauseOverlap = max(m.s.stats.PauseOverlap, overlap)
		if !h.overlapped {
			h.overlapped = true
			m.s.stats.PauseOverlaps++
		}
	}
	if h.paused {
		return // the fault itself: nothing runs to stop the child
	}
	if h.wokeAt > h.resumedAt {
		return // its host was suspended since: S31 judges its late timers
	}
	k := h.span(h.stopAfterResume()) // on its clock
	if now.Mono <= h.resumedAt+k {
		return
	}
	if gone {
		m.fail("S24", "%s's child runs %v after its ticket %s was %s, %v past its bound: the pause beyond the ticket's end (%v) "+
			"+ %v (the kill grace %v cut to half the margin %v: its supervisor resumed past its lease's local deadline)",
			h.name, now.Mono-g.at, short(h.id), g.why, now.Mono-(h.resumedAt+k), h.resumedAt-g.at, k, h.grace, h.margin)
		return
	}
	m.fail("S24", "%s resumed past its lease's local deadline %v ago and its child still runs (bound %v: the kill grace %v cut to half the margin %v)",
		h.name, now.Mono-h.resumedAt, k, h.grace, h.margin)
}

// reclaimed checks that no expired ticket outlives the reapers (L1).
//
// An expired ticket whose orphaned job still runs (its supervisor and
// guard killed) may be kept (Judges.Keep): the reap that stops the job
// frees it. So is a waiter whose supervisor provably runs (S28): a late
// renewal on a loaded machine is not its death. A stalled process that
// holds the store's lock keeps every reaper out (store-lock): the bound
// counts from when it goes on.
func (m *model) reclaimed(now Instant) {
	bound := 3 * reclaimBound
	for _, t := range m.sorted() {
		if m.keptAlive(t) {
			t.keptAt = now.Mono
			continue
		}
		if m.expired(t, now) && now.Mono-max(m.expiry(t, now), t.keptAt, m.s.lockFree) > bound && !orphaned(t.owner) {
			m.fail("L1", "ticket %s of %s expired %v ago and is still there", short(t.id), ownerName(t.owner), now.Mono-m.expiry(t, now))
			return
		}
	}
}
