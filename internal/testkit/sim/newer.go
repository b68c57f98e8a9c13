package sim

import (
	"errors"
	"slices"

	gh "github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
)

// Newer runs first (docs/leases.md §2.1 item 10): what the model expects of
// --key, --supersede, --replace and --max-waiting, from the requests and
// the answers alone. The rules (docs/leases.md, "Simulation invariants"):
//
//	S16 a supersede removes, in its enqueue's own step, exactly the older
//	    waiting tickets of its key that share a limit with it, and logs it;
//	    a superseded ticket is never found again, Get and Renew name its
//	    successor, its job never runs, its holder ends superseded
//	S17 a held ticket is never removed by a supersede
//	S18 a replace asks exactly the held tickets of its key sharing a limit
//	    to stop, and logs it; Get and Renew return the request; its holder
//	    stops its child at once when it hears it (its bell, or its next
//	    renewal), and ends replaced
//	S19 a replacing ticket is admitted only once every ticket it replaces
//	    is gone, and its job never runs beside a replaced job
//	S20 --max-waiting refuses exactly when the ticket would wait behind N
//	    waiting tickets (after the supersede) in one of its limits, and a
//	    refusal writes nothing

// keyed is the live tickets of req's key that share a limit with it: the
// waiting ones (a supersede removes them) and the held ones.
func (m *model) keyed(req store.EnqueueRequest, first bool) *supStep {
	st := &supStep{id: req.ID, key: req.Key, limits: req.Names(), first: first, victims: map[string]bool{}, held: map[string]bool{}}
	if !req.Supersede && !req.Replace {
		return st
	}
	for _, t := range m.sorted() {
		if t.id == req.ID || t.key != req.Key || !t.shares(req.Names()) {
			continue
		}
		if t.state == store.Held {
			st.held[t.id] = true
		} else {
			st.victims[t.id] = true
		}
	}
	return st
}

// waitingIn counts the waiting tickets of limit other than self and the
// supersede's victims, as its enqueue's settle may leave them: at most hi,
// at least lo. The settle may remove tickets that a sweep may take, and
// admit the waiters behind them or behind the victims; else it admits
// nobody (L3 held after the last step), so lo = hi. Where a limit has a
// policy, time alone may have made a waiter next (sched.go): lo = 0.
func (m *model) waitingIn(limit string, victims map[string]bool, self string, now Instant) (lo, hi int) {
	for _, t := range m.live {
		if t.state == store.Held || t.id == self || victims[t.id] || !t.names(limit) {
			continue
		}
		hi++
	}
	if len(victims) > 0 || m.scheduling() {
		return 0, hi
	}
	for _, t := range m.live {
		if m.mayReap(t, now) {
			return 0, hi
		}
	}
	return hi, hi
}

// newer learns what the enqueue that created t did to the tickets of its
// key, and checks its answer; false after a violation.
func (m *model) newer(o *op, t *mTicket, now Instant) bool {
	req := o.req
	if len(o.res.Replaces) > 0 && !req.Replace {
		m.fail("S19", "enqueue of %s without --replace answered Replaces %v", short(t.id), shorts(o.res.Replaces))
		return false
	}
	st := m.keyed(req, o.first)
	if req.Supersede || req.Replace {
		m.sups = append(m.sups, st)
	}
	if req.Replace {
		for _, id := range o.res.Replaces {
			if !st.held[id] {
				m.fail("S18", "enqueue of %s (key %q, limits %v) replaces %s, not a held ticket of its key in its limits", short(t.id), req.Key, req.Names(), short(id))
				return false
			}
		}
		for _, id := range sortedKeys(st.held) {
			if !slices.Contains(o.res.Replaces, id) && !m.mayReap(m.live[id], now) && o.first {
				st.unasked = append(st.unasked, id) // the diff says whether it is still there (S18) or was removed (S17)
			}
		}
		for _, id := range o.res.Replaces {
			m.live[id].stop = t.id
		}
		m.s.stats.StopRequests += len(o.res.Replaces)
		t.repl = slices.Clone(o.res.Replaces)
		m.replace[t.id] = t.repl
	}
	if n := req.MaxWaiting; n != nil && o.res.State != store.Held && o.first {
		for _, name := range req.Names() {
			if lo, _ := m.waitingIn(name, st.victims, t.id, now); lo >= *n {
				m.fail("S20", "enqueue of %s queued behind %d waiting tickets of %s, with --max-waiting %d", short(t.id), lo, name, *n)
				return false
			}
		}
	}
	return true
}

// refusedFull checks a refusal of --max-waiting: the limit it names is one
// of the request's, with as many waiting (after the supersede) as the bound
// or more, and the ticket would not have been admitted at once. The diff
// then checks that it wrote nothing.
func (m *model) refusedFull(o *op, full *store.QueueFullError, now Instant) {
	req := o.req
	switch {
	case req.MaxWaiting == nil:
		m.fail("S20", "enqueue of %s without --max-waiting refused: %v", short(req.ID), full)
		return
	case m.live[req.ID] != nil:
		m.fail("S20", "a retried enqueue of live ticket %s refused: %v", short(req.ID), full)
		return
	case full.Max != *req.MaxWaiting || !slices.Contains(req.Names(), full.Limit) || full.Waiting < full.Max:
		m.fail("S20", "enqueue of %s (limits %v, --max-waiting %d) refused: %v", short(req.ID), req.Names(), *req.MaxWaiting, full)
		return
	}
	st := m.keyed(req, o.first)
	m.qfull = append(m.qfull, st)
	m.s.stats.QueueFull++
	if !o.first {
		return // the model's states may be behind this step's earlier calls
	}
	if lo, hi := m.waitingIn(full.Limit, st.victims, req.ID, now); full.Waiting < lo || full.Waiting > hi {
		m.fail("S20", "enqueue of %s refused: %v; the model counts %d to %d waiting there after the supersede", short(req.ID), full, lo, hi)
		return
	}
	if m.admits(req, st, now) {
		m.fail("S20", "enqueue of %s refused (%v), but it would have been admitted at once", short(req.ID), full)
	}
}

// admits: the request is admitted by its enqueue whatever a sweep does,
// with nobody waiting in its limits (after the supersede) and room for it
// beside every holder.
func (m *model) admits(req store.EnqueueRequest, st *supStep, now Instant) bool {
	if req.Replace && len(st.held) > 0 {
		return false
	}
	for _, name := range req.Names() {
		if l := m.limits[name]; l != nil && l.pol.Rate.N > 0 {
			return false // its window may be spent
		}
		size := m.size(name, req)
		if _, hi := m.waitingIn(name, st.victims, req.ID, now); hi > 0 || size == 0 || m.held(name)+req.Weighs() > size {
			return false
		}
	}
	return true
}

// victimOf is the supersede of this step that removes t, if any.
func (m *model) victimOf(t *mTicket) *supStep {
	for _, st := range m.sups {
		if st.victims[t.id] {
			return st
		}
	}
	return nil
}

// vanished explains a ticket missing from the snapshot that no sweep may
// have removed: true if it is a supersede's; else it fails the rule it breaks.
func (m *model) vanished(t *mTicket, now Instant) bool {
	if st := m.victimOf(t); st != nil {
		m.remove(t, goneRec{why: "superseded by " + short(st.id), by: st.id, sure: !m.mayReap(t, now), limits: t.limits})
		m.s.stats.Superseded++
		if h := t.owner; h != nil && h.phase == hWait && h.id == t.id {
			m.s.ring(h) // the store rings the superseded waiter's bell
		}
		return true
	}
	if m.expired(t, now) && m.keptAlive(t) {
		m.fail("S28", "waiting ticket %s of %s was swept %v after its deadline while its supervisor (pid %d) provably runs%s", short(t.id), ownerName(t.owner),
			now.Mono-m.expiry(t, now), t.owner.sup.pid, m.stepCalls())
		return false
	}
	if m.mayReap(t, now) {
		return false
	}
	for _, st := range m.sups {
		if st.held[t.id] {
			m.fail("S17", "held ticket %s of %s (key %q, limits %v) was removed by the supersede of %s%s", short(t.id), ownerName(t.owner),
				t.key, t.limits, short(st.id), m.stepCalls())
			// (With S17 ignored, the run goes on with what the store did.)
			m.remove(t, goneRec{why: "superseded, held, by " + short(st.id), by: st.id, sure: true})
			return true
		}
	}
	for _, st := range m.qfull {
		if st.victims[t.id] || st.held[t.id] {
			m.fail("S20", "ticket %s of %s vanished in the refused enqueue of %s", short(t.id), ownerName(t.owner), short(st.id))
			return false
		}
	}
	m.fail("S6", "ticket %s of %s (%s, slot %d) vanished while its lease has %v left%s", short(t.id), ownerName(t.owner),
		t.state, t.slot(), m.left(t, now), m.stepCalls())
	return false
}

// listed checks a ticket of the snapshot against this step's supersedes
// and refusals; false after a violation.
func (m *model) listed(id string, st store.Ticket) bool {
	for _, q := range m.qfull {
		if q.id == id && m.live[id] == nil {
			m.fail("S20", "the refused enqueue of %s wrote its ticket (%s, fence %d)", short(id), st.State, st.Fence)
			return false
		}
	}
	if t := m.live[id]; t != nil {
		if sup := m.victimOf(t); sup != nil {
			if st.State == store.Held && !sup.first {
				// Promoted by an earlier call of this step, before the
				// supersede: a held ticket, which it must not touch.
				delete(sup.victims, id)
				sup.held[id] = true
				return true
			}
			m.fail("S16", "ticket %s of %s (%s, key %q, limits %v) is still there after the supersede of %s (key %q, limits %v)",
				short(id), ownerName(t.owner), st.State, t.key, t.limits, short(sup.id), sup.key, sup.limits)
			return false
		}
	}
	return true
}

// asked checks that every held ticket of a replace's key sharing a limit
// with it that is still there was asked to stop.
func (m *model) asked() bool {
	for _, st := range m.sups {
		for _, id := range st.unasked {
			if t := m.live[id]; t != nil {
				m.fail("S18", "the replace of %s (key %q, limits %v) did not ask held %s of %s, of its key, to stop", short(st.id), st.key, st.limits,
					short(id), ownerName(t.owner))
				return false
			}
		}
	}
	return true
}

// admittedBeside checks S19 for the tickets this step admitted.
func (m *model) admittedBeside(promoted []*mTicket) bool {
	for _, p := range promoted {
		for _, id := range p.repl {
			if r := m.live[id]; r != nil {
				m.fail("S19", "ticket %s of %s was admitted while %s of %s, which it replaces, is still %s%s", short(p.id), ownerName(p.owner),
					short(id), ownerName(r.owner), r.state, m.stepCalls())
				return false
			}
		}
	}
	return true
}

// stops rings the bells of the holders this step asked to stop.
func (m *model) stops() {
	for _, st := range m.sups {
		for _, t := range m.sorted() {
			if t.stop == st.id && st.held[t.id] {
				if h := t.owner; h != nil && h.id == t.id && h.live() {
					m.s.ring(h)
				}
			}
		}
	}
}

// supersededErr checks what a Get or a Renew of a ticket that is gone
// says: the successor of a superseded one, and only of one.
func (m *model) supersededErr(o *op, id string) {
	var se *store.SupersededError
	g := m.gone[id]
	switch has := errors.As(o.err, &se); {
	case has && (g.by == "" || se.By.Ticket != g.by || se.ID != id):
		m.fail("S16", "%s of %s says %v; the model has it %s", o.kind, short(id), se, g.why)
	case has && m.owners[g.by] != nil && se.By.Pid != m.owners[g.by].sup.pid:
		m.fail("S16", "%s of %s names successor pid %d, not %d", o.kind, short(id), se.By.Pid, m.owners[g.by].sup.pid)
	case !has && g.by != "" && g.sure:
		m.fail("S16", "%s of %s, superseded by %s, does not name its successor: %v", o.kind, short(id), short(g.by), o.err)
	}
}

// replacedRuns checks S19 for h's running child while its ticket is held:
// no job it replaces still runs, unless that job's supervisor is stopped (it
// cannot stop its job; its lease runs out, as for any paused holder) or an
// operator removed its ticket. A ticket of h's id that waits is not the one
// its child was admitted by (a late duplicate of its enqueue, written again
// after the store's file was deleted, replaces what that enqueue names).
func (m *model) replacedRuns(h *holder, now Instant) {
	if t := m.live[h.id]; t == nil || t.state != store.Held {
		return
	}
	for _, id := range m.replace[h.id] {
		o := m.owners[id]
		if o == nil || o == h || o.id != id || !o.child.running || o.crashed || o.stoppedAt(now.Mono) || m.gone[id].force {
			continue
		}
		m.fail("S19", "%s's child runs beside %s's, the job its ticket %s replaces (ticket %s: %s)", h.name, o.name, short(h.id), short(id), m.state(id))
		return
	}
}

func (m *model) state(id string) string {
	if t := m.live[id]; t != nil {
		return string(t.state)
	}
	return m.gone[id].why
}

// heardStop checks S18 for h: once it has heard its stop request, its
// child is stopped before time moves on.
func (m *model) heardStop(h *holder, now Instant) {
	// A request that went with the store's file is not read back: the
	// lease stops the job (S2).
	if h.stopHeard && now.Mono > h.stopHeardAt && h.child.running && h.child.stopAt == 0 && !h.stoppedAt(now.Mono) && !m.gone[h.id].file {
		m.fail("S18", "%s heard at %v that %s replaces it (%s), and its child still runs without a SIGTERM", h.name,
			h.stopHeardAt-m.s.start, short(h.stopBy), h.stopHow)
	}
}

func shorts(ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = short(id)
	}
	return out
}

func sortedKeys(s map[string]bool) []string {
	out := make([]string, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// outcome checks how h's run ended against what became of its ticket: a
// superseded run says so, naming its successor, unless something else
// ended its wait first (a signal, its --wait, a lease that ran out); a
// replaced run names a ticket that replaces it.
func (m *model) outcome(h *holder, o gh.Outcome) {
	g := m.gone[h.id]
	switch {
	case o.Result == gh.Superseded && (g.by == "" || o.By.Ticket != g.by):
		m.fail("S16", "%s ends superseded by %s; its ticket %s was %s", h.name, short(o.By.Ticket), short(h.id), m.state(h.id))
	case g.by != "" && g.sure && o.Result != gh.Superseded && o.Result != gh.Signalled && o.Result != gh.Busy &&
		!(o.Result == gh.LostWaiting && errors.Is(o.Err, renew.ErrDeadline)):
		m.fail("S16", "%s's ticket %s was superseded by %s, and its run ends %s", h.name, short(h.id), short(g.by), h.exit)
	case o.Replaced != nil && !slices.Contains(m.replace[o.Replaced.Ticket], h.id):
		m.fail("S18", "%s ends replaced by %s, which does not replace its ticket %s", h.name, short(o.Replaced.Ticket), short(h.id))
	case o.Replaced != nil && !h.stopHeard && !h.stopAdmitted:
		m.fail("S18", "%s ends replaced by %s, but it never heard of it (a read on its bell or a nudge, a renewal, or its admission)", h.name, short(o.Replaced.Ticket))
	case o.Replaced == nil && h.stopHeard && heardByRead(h.stopHow) && o.Result == gh.Ran && !o.Lost && !h.stopDeferred:
		// Its bell (or a nudge) made it read its ticket, with the stop
		// request in it.
		// Rung while its job was being stopped already, it reads it once
		// the job is gone (gate/holder reads nothing that could hold up a
		// SIGKILL), and the ticket may be gone by then, or set back by a
		// restored copy.
		m.fail("S18", "%s heard by %s that %s replaces it, and its run ends %s, not replaced", h.name, h.stopHow, short(h.stopBy), h.exit)
	}
}

// logged checks the event log after a step that superseded or asked to
// stop: an event in each limit of each ticket concerned, naming the newer
// ticket (By), as slotctl log shows them.
func (m *model) logged() {
	if len(m.sups) == 0 {
		return
	}
	evs, err := m.s.checker.Events(m.s.ctx, "", 256)
	if err != nil {
		m.fail("S12", "events: %v", err)
		return
	}
	type entry struct{ kind, limit, ticket, by string }
	have := map[entry]bool{}
	for _, e := range evs {
		have[entry{e.Kind, e.Limit, e.Ticket, e.By}] = true
	}
	for _, st := range m.sups {
		for _, id := range sortedKeys(st.victims) {
			g := m.gone[id]
			if g.by != st.id || !g.sure {
				continue
			}
			for _, name := range g.limits {
				if !have[entry{"superseded", name, id, st.id}] {
					m.fail("S16", "no superseded event of %s in %s naming %s", short(id), name, short(st.id))
					return
				}
			}
		}
		for _, t := range m.sorted() {
			if t.stop != st.id || !st.held[t.id] {
				continue
			}
			for _, name := range t.limits {
				if !have[entry{"replaced", name, t.id, st.id}] {
					m.fail("S18", "no replaced event of %s in %s naming %s", short(t.id), name, short(st.id))
					return
				}
			}
		}
	}
}
