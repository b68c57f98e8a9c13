package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// The model is what must be true, kept apart from the store: the live
// tickets as the calls' answers say they are, the removed and refused ids,
// the limits. After a step it reads a Snapshot of the real store and
// compares; everything the store did on its own (sweeps, promotions) must be
// something the rules allow.
type model struct {
	s        *sim
	live     map[string]*mTicket
	refused  map[string]bool // ids the store must refuse: removed, or cancelled before create
	removals map[string]int
	gone     map[string]goneRec
	maxFence uint64
	limits   map[string]*mLimit

	overSince map[string]time.Duration // limit -> since when more children run than it has slots
}

type mTicket struct {
	id, limit string
	fence     uint64
	state     store.State
	slot      int
	boot      string
	dl        time.Duration // deadline on the store's boot clock
	owner     *holder
}

type goneRec struct {
	why    string
	force  bool          // an operator's release
	swept  bool          // expired or proven dead, removed by a sweep or a reap
	expiry time.Duration // when its lease ran out (for swept)
}

type mLimit struct {
	slots int
	over  int // held beyond slots allowed after a shrink; shrinks as they leave
}

func newModel(s *sim) *model {
	return &model{s: s, live: map[string]*mTicket{}, refused: map[string]bool{}, removals: map[string]int{},
		gone: map[string]goneRec{}, limits: map[string]*mLimit{}, overSince: map[string]time.Duration{}}
}

func (m *model) fail(rule, format string, args ...any) { m.s.fail(rule, format, args...) }

func (m *model) sorted() []*mTicket {
	out := make([]*mTicket, 0, len(m.live))
	for _, t := range m.live {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *mTicket) int { return cmpU64(a.fence, b.fence) })
	return out
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (m *model) expired(t *mTicket, now Instant) bool { return t.boot != now.Boot || now.Mono >= t.dl }

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
func (m *model) mayReap(t *mTicket, now Instant) bool {
	if m.expired(t, now) {
		return true
	}
	return m.s.judged[t.id] && t.owner != nil && !t.owner.live()
}

func (m *model) remove(t *mTicket, g goneRec) {
	delete(m.live, t.id)
	m.removals[t.id]++
	if n := m.removals[t.id]; n > 1 {
		m.fail("S5", "ticket %s of %s left the live set %d times", short(t.id), ownerName(t.owner), n)
	}
	m.refused[t.id] = true
	m.gone[t.id] = g
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

func (m *model) held(limit string) int {
	n := 0
	for _, t := range m.live {
		if t.limit == limit && t.state == store.Held {
			n++
		}
	}
	return n
}

// check runs after every step.
func (m *model) check() {
	s := m.s
	now := s.now()
	if len(s.log) > 0 {
		for _, o := range s.log {
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
			}
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
			m.limit(o.req.Limit, o.req.Slots)
			m.live[id] = &mTicket{id: id, limit: o.req.Limit, fence: o.res.Fence, state: store.Waiting, slot: -1,
				boot: now.Boot, dl: now.Mono + o.req.TTL, owner: o.owner}
		case errors.Is(o.err, store.ErrRemoved):
			if t != nil && !m.sweptBefore(t, now) || t == nil && !m.refused[id] {
				m.fail("S14", "enqueue of %s refused as removed, but it never was", short(id))
			}
		default:
			m.fail("S14", "enqueue of %s: %v", short(id), o.err)
		}
	case "renew":
		t := m.live[o.t.ID]
		switch {
		case o.err == nil:
			switch {
			case t == nil && m.refused[o.t.ID]:
				m.fail("S7", "renewal by %s of removed ticket %s (%s) accepted", o.who, short(o.t.ID), m.gone[o.t.ID].why)
			case t == nil:
				m.fail("S7", "renewal by %s of unknown ticket %s accepted", o.who, short(o.t.ID))
			case t.fence != o.t.Fence:
				m.fail("S8", "renewal with fence %d of ticket %s (fence %d) accepted", o.t.Fence, short(t.id), t.fence)
			case m.expired(t, now):
				m.fail("S7", "renewal by %s of ticket %s accepted %v after it expired", o.who, short(t.id), now.Mono-m.expiry(t, now))
			default:
				t.dl = now.Mono + o.ttl
			}
		case t != nil && t.fence == o.t.Fence && !m.expired(t, now):
			m.fail("S6", "renewal by %s of live ticket %s refused: %v", o.who, short(t.id), o.err)
		}
	case "release":
		if h := o.owner; h != nil && o.who == h.name && h.id == o.t.ID && h.child.running {
			m.fail("S10", "%s released its ticket %s while its child runs", h.name, short(h.id))
		}
		t := m.live[o.t.ID]
		match := t != nil && (o.t.Fence == 0 || t.fence == o.t.Fence)
		switch {
		case o.removed && !match:
			m.fail("S4", "a release by %s removed ticket %s, which was not live", o.who, short(o.t.ID))
		case o.removed:
			m.remove(t, goneRec{why: string(o.why) + " by " + o.who, force: o.why == store.ForceReleased})
		case match && !m.sweptBefore(t, now):
			m.fail("S4", "a release by %s left live ticket %s in place", o.who, short(o.t.ID))
		case t == nil:
			m.refused[o.t.ID] = true
		}
	case "get":
		t := m.live[o.t.ID]
		switch {
		case o.err == nil && t == nil:
			m.fail("S7", "Get found ticket %s, which is not live", short(o.t.ID))
		case o.err == nil && o.res.Fence != t.fence:
			m.fail("S8", "Get of %s returned fence %d, not %d", short(t.id), o.res.Fence, t.fence)
		case o.err != nil && t != nil && !m.sweptBefore(t, now):
			m.fail("S4", "Get lost live ticket %s: %v", short(t.id), o.err)
		}
	case "setchild":
		t := m.live[o.t.ID]
		ok := t != nil && t.fence == o.t.Fence && !m.expired(t, now)
		if o.err == nil && !ok {
			m.fail("S7", "SetChild of %s accepted, but it is gone or expired", short(o.t.ID))
		} else if o.err != nil && ok {
			m.fail("S6", "SetChild of live ticket %s refused: %v", short(o.t.ID), o.err)
		}
	case "scan", "reap":
		for _, r := range o.removals {
			t := m.live[r.Ticket.ID]
			switch {
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
		if o.kind == "reap" {
			for _, t := range m.sorted() {
				if m.expired(t, now) && (len(o.lims) == 0 || slices.Contains(o.lims, t.limit)) {
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
	}
}

// sweptBefore accounts for a call that finds gone a ticket the model has:
// a sweep earlier in this step may have removed it, if it was expired or
// its holder proven dead. Then the model removes it too.
func (m *model) sweptBefore(t *mTicket, now Instant) bool {
	if !m.mayReap(t, now) {
		return false
	}
	m.sweep(t, now)
	return true
}

// diff compares the model with the store after a step.
func (m *model) diff(snap store.Snapshot, now Instant) {
	seen := make(map[string]bool, len(snap.Tickets))
	promoted := map[string][]*mTicket{}
	for _, st := range snap.Tickets {
		seen[st.ID] = true
		t := m.live[st.ID]
		switch {
		case t == nil && m.refused[st.ID]:
			m.fail("S7", "removed ticket %s (%s) is live again, fence %d", short(st.ID), m.gone[st.ID].why, st.Fence)
			return
		case t == nil:
			m.fail("S4", "ticket %s appeared without an enqueue", short(st.ID))
			return
		case st.Fence != t.fence || st.Limit != t.limit:
			m.fail("S8", "ticket %s changed fence or limit: %d/%s, was %d/%s", short(t.id), st.Fence, st.Limit, t.fence, t.limit)
			return
		case t.state == store.Held && st.State != store.Held:
			m.fail("S1", "held ticket %s went back to %s", short(t.id), st.State)
			return
		case t.state == store.Held && st.Slot != t.slot:
			m.fail("S1", "held ticket %s moved from slot %d to %d", short(t.id), t.slot, st.Slot)
			return
		case t.state == store.Waiting && st.State == store.Held:
			t.state, t.slot = store.Held, st.Slot
			promoted[t.limit] = append(promoted[t.limit], t)
		}
		if want := m.left(t, now); st.Remaining != want {
			m.fail("S13", "ticket %s of %s: the store says %v left, its deadline says %v", short(t.id), ownerName(t.owner), st.Remaining, want)
			return
		}
	}
	for _, t := range m.sorted() {
		if seen[t.id] {
			continue
		}
		if !m.mayReap(t, now) {
			m.fail("S6", "ticket %s of %s (%s, slot %d) vanished while its lease has %v left%s", short(t.id), ownerName(t.owner),
				t.state, t.slot, m.left(t, now), m.stepCalls())
			return
		}
		m.sweep(t, now)
	}
	if len(snap.Limits) != len(m.limits) {
		m.fail("S1", "the store has %d limits, the model %d", len(snap.Limits), len(m.limits))
		return
	}
	for _, l := range snap.Limits {
		ml := m.limits[l.Name]
		if ml == nil || ml.slots != l.Slots {
			m.fail("S1", "limit %s has %d slots in the store, not %v", l.Name, l.Slots, ml)
			return
		}
		var held, waiting []*mTicket
		for _, t := range m.sorted() {
			if t.limit != l.Name {
				continue
			}
			if t.state == store.Held {
				held = append(held, t)
			} else {
				waiting = append(waiting, t)
			}
		}
		if len(held) != l.Held || len(waiting) != l.Waiting {
			m.fail("S3", "limit %s counts %d held, %d waiting; its tickets say %d, %d", l.Name, l.Held, l.Waiting, len(held), len(waiting))
			return
		}
		if ps := promoted[l.Name]; len(ps) > 0 {
			if len(held) > l.Slots {
				m.fail("S1", "limit %s admitted %s: %d held of %d slots%s", l.Name, names(ps), len(held), l.Slots, m.stepCalls())
				return
			}
			for _, p := range ps {
				if p.slot < 0 || p.slot >= l.Slots {
					m.fail("S1", "ticket %s admitted to slot %d of %d", short(p.id), p.slot, l.Slots)
					return
				}
				for _, w := range waiting {
					if w.fence < p.fence {
						m.fail("L4", "limit %s admitted %s (fence %d) before waiting %s (fence %d)", l.Name, short(p.id), p.fence, short(w.id), w.fence)
						return
					}
				}
				if h := p.owner; h != nil && h.phase == hWait {
					h.rung = true // the promoter rings its bell
				}
			}
		}
		if len(held) > l.Slots+ml.over {
			m.fail("S1", "limit %s has %d held of %d slots", l.Name, len(held), l.Slots)
			return
		}
		ml.over = min(ml.over, max(0, len(held)-l.Slots))
		if len(held) < l.Slots && len(waiting) > 0 {
			m.fail("L3", "limit %s has %d of %d slots held and %d waiting", l.Name, len(held), l.Slots, len(waiting))
			return
		}
		slots := map[int]bool{}
		for _, t := range held {
			if slots[t.slot] {
				m.fail("S1", "limit %s: slot %d held twice", l.Name, t.slot)
				return
			}
			slots[t.slot] = true
		}
	}
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

// holders checks the children and the holders' beliefs (S2, S9).
func (m *model) holders(now Instant) {
	s := m.s
	running := map[string]int{}
	exempt := map[string]bool{}
	for _, h := range s.holders {
		if h.crashed {
			continue
		}
		m.holder(h, now, running, exempt)
		if s.viol != nil {
			return
		}
	}
	for _, l := range s.limits {
		ml := m.limits[l.name]
		if ml == nil {
			continue
		}
		if running[l.name] > ml.slots+ml.over && exempt[l.name] {
			since, ok := m.overSince[l.name]
			if !ok {
				since = now.Mono
				m.overSince[l.name] = since
			}
			s.stats.PauseOverlap = max(s.stats.PauseOverlap, now.Mono-since)
		} else {
			delete(m.overSince, l.name)
		}
	}
}

func (m *model) holder(h *holder, now Instant, running map[string]int, exempt map[string]bool) {
	t := m.live[h.id]
	if h.leased && !h.lost && t != nil && t.boot == now.Boot && h.lease.Deadline()+h.margin > t.dl {
		m.fail("S9", "%s counts on its lease until %v from now, but the store's ends in %v", h.name,
			h.lease.Deadline()+h.margin-now.Mono, t.dl-now.Mono)
	}
	if !h.child.running {
		return
	}
	running[h.limit]++
	stopped := h.paused || h.wasPaused && now.Mono <= h.resumedAt+h.grace
	if t == nil || t.state != store.Held {
		g := m.gone[h.id]
		until := never
		switch {
		case stopped:
			exempt[h.limit] = true
		case g.force:
			until = h.lease.Deadline() + h.margin + h.grace
		case g.swept:
			until = min(h.lease.Deadline()+h.margin, g.expiry) + h.grace
		default:
			until = 0
		}
		if now.Mono > until {
			if until == 0 {
				m.fail("S2", "%s's child runs without a lease: its ticket %s was %s", h.name, short(h.id), g.why)
			} else {
				m.fail("S2", "%s's child runs without a lease: its ticket %s was %s, and the child is %v past the allowed window "+
					"(margin %v + kill grace %v past the local deadline or the store's expiry)", h.name, short(h.id), g.why, now.Mono-until, h.margin, h.grace)
			}
			return
		}
	}
	if stopped {
		return
	}
	if h.leased && now.Mono > h.lease.Deadline()+h.grace {
		m.fail("S9", "%s's child runs %v past its local deadline", h.name, now.Mono-h.lease.Deadline())
		return
	}
	if h.lost && now.Mono > h.lease.Expiry() {
		// The whole stop fits before the earliest moment the store could
		// judge the lease expired, whatever the kill grace.
		m.fail("S9", "%s's child still runs %v after its lost lease could expire in the store (kill grace %v, margin %v)", h.name, now.Mono-h.lease.Expiry(), h.grace, h.margin)
		return
	}
	if h.lost && now.Mono > h.lostAt+h.grace || h.handledSig && now.Mono > h.sigtermAt+h.grace {
		m.fail("S9", "%s's child still runs more than the kill grace %v after it was stopped", h.name, h.grace)
	}
}

// reclaimed checks that no expired ticket outlives the reapers (L1).
func (m *model) reclaimed(now Instant) {
	bound := 3 * reclaimBound
	for _, t := range m.sorted() {
		if m.expired(t, now) && now.Mono-m.expiry(t, now) > bound {
			m.fail("L1", "ticket %s of %s expired %v ago and is still there", short(t.id), ownerName(t.owner), now.Mono-m.expiry(t, now))
			return
		}
	}
}
