package sim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/slotctl/slotctl/store"
)

// A job's weight changes while it runs (Store.Resize, docs/leases.md §2.1
// item 12: a jobserver's extra slots). The rule (docs/leases.md,
// "Simulation invariants"):
//
//	S21 a resize answers the held ticket of its holder, same id and fence:
//	    a shrink to exactly the weight asked, keeping the lowest indexes;
//	    a growth to between the old weight and the one asked, keeping its
//	    indexes and adding others, and none at all while a ticket waits in
//	    one of its limits (a waiter is never overtaken); a waiting ticket is
//	    refused as invalid, a gone or expired one as lost
//
// The growth's room is S1's (slots held ≤ size, indexes below it); the
// shrink's promotion is L3's (the step that made the room admitted the head).

// A growth is one resize of this step that took slots: the waiters of its
// limits at the time (the model's), none of which may still wait after the
// step (S21).
type growth struct {
	t       *mTicket
	waiters []*mTicket
	added   map[string][]int // the indexes it took, per limit
}

// resizeOne is a job that grows or shrinks its ticket while its child runs
// (a jobserver: tokens taken, tokens given back), toward a weight of 1 to
// one above its largest limit's configured size. false if no job runs.
func (s *sim) resizeOne() bool {
	var hs []*holder
	for _, h := range s.holders {
		if h.live() && h.phase == hRun && h.child.running && h.leased && !h.lost && !h.paused {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return false
	}
	h := hs[s.resizeRng.IntN(len(hs))]
	top := 1
	for _, name := range h.limits {
		top = max(top, s.size(name))
	}
	w := 1 + s.resizeRng.IntN(top+1)
	t := h.ticket
	res, err := h.c.Resize(s.ctx, t, w)
	s.stats.Resizes++
	s.tracef("%s resizes %s from %d toward %d: %s", h.name, short(t.ID), h.weight, w, resized(res, err))
	if err == nil && !h.crashed {
		h.ticket, h.weight = res, res.Weighs()
	}
	return true
}

func resized(t store.Ticket, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("weight %d, %s", t.Weighs(), t.SlotsVar())
}

// resize learns a resize's answer (S21).
func (m *model) resize(o *op, now Instant) {
	id, want := o.t.ID, o.slots
	t := m.live[id]
	live := t != nil && t.fence == o.t.Fence && (!m.expired(t, now) || m.near(t, now))
	switch {
	case errors.Is(o.err, store.ErrInvalid):
		if !live || t.state == store.Held {
			m.fail("S21", "resize of %s to %d refused as invalid: %v; the model has it %v", short(id), want, o.err, describe(t))
		}
		return
	case errors.Is(o.err, store.ErrLost):
		if live && !m.sweptBefore(t, now) {
			m.fail("S21", "resize by %s of live ticket %s refused as lost: %v", o.who, short(id), o.err)
		}
		return
	case o.err != nil:
		m.fail("S12", "resize by %s failed: %v", o.who, o.err)
		return
	case t == nil:
		m.fail("S7", "resize by %s of ticket %s accepted, but it is not live (%s)", o.who, short(id), m.gone[id].why)
		return
	case !live:
		m.fail("S7", "resize by %s of ticket %s accepted, but it is of fence %d or expired", o.who, short(id), t.fence)
		return
	case o.res.ID != id || o.res.Fence != t.fence || o.res.State != store.Held:
		m.fail("S21", "resize of %s answered ticket %s fence %d %s, want the held ticket of fence %d", short(id), short(o.res.ID), o.res.Fence, o.res.State, t.fence)
		return
	}
	got := o.res.Weighs()
	if t.state != store.Held {
		// Promoted by an earlier call of this step: the snapshot shows where.
		t.weight = got
		return
	}
	old := t.weight
	switch {
	case want <= old && got != want:
		m.fail("S21", "a shrink of %s from %d to %d ends at weight %d", short(id), old, want, got)
		return
	case want > old && (got < old || got > want):
		m.fail("S21", "a growth of %s from %d toward %d ends at weight %d", short(id), old, want, got)
		return
	}
	for _, name := range t.limits {
		before, after := t.slots[name], o.res.In(name)
		keep := min(got, old)
		if len(after) != got || !increasing(after) || !slices.Equal(before[:keep], after[:keep]) && got <= old ||
			got > old && !subset(before, after) {
			m.fail("S21", "a resize of %s from %d to %d holds %v of %s, was %v: want its lowest kept by a shrink, all kept by a growth",
				short(id), old, got, after, name, before)
			return
		}
	}
	switch {
	case got < old:
		m.shrank = true
		m.s.stats.Shrunk++
	case got > old:
		m.s.stats.Grown++
	case want > old:
		m.s.stats.GrowthRefused++
	}
	if got > old {
		g := growth{t: t, added: map[string][]int{}}
		for _, name := range t.limits {
			for _, i := range o.res.In(name) {
				if !slices.Contains(t.slots[name], i) {
					g.added[name] = append(g.added[name], i)
				}
			}
		}
		for _, w := range m.sorted() {
			if w.state != store.Held && w.shares(t.limits) && !m.mayReap(w, now) {
				g.waiters = append(g.waiters, w)
			}
		}
		m.grew = append(m.grew, g)
	}
	t.weight = got
	for _, name := range t.limits {
		t.slots[name] = slices.Clone(o.res.In(name))
	}
	m.view("resize", o.res, t)
}

// grown checks this step's growths once the snapshot has shown what the
// step admitted: no waiter of its limits at the time still waits (it was
// waiting when the ticket grew past it), and the indexes it took are below
// its limits' sizes.
func (m *model) grown(promoted []*mTicket) {
	if m.shrank {
		m.s.stats.ShrinkAdmits += len(promoted)
	}
	for _, g := range m.grew {
		for _, w := range g.waiters {
			if m.live[w.id] == w && w.state != store.Held {
				m.fail("S21", "ticket %s of %s grew to weight %d in %v while ticket %s of %s (fence %d, weight %d, limits %v) waits%s",
					short(g.t.id), ownerName(g.t.owner), g.t.weight, g.t.limits, short(w.id), ownerName(w.owner), w.fence, w.weight, w.limits, m.stepCalls())
				return
			}
		}
		if m.live[g.t.id] != g.t {
			continue
		}
		for _, name := range g.t.limits {
			// What it held before may lie above a size shrunk since
			// (shrinking evicts nobody); what it takes may not.
			if l := m.limits[name]; l != nil {
				if ix := g.added[name]; len(ix) > 0 && ix[len(ix)-1] >= l.slots {
					m.fail("S1", "ticket %s grew by slots %v of %s, which has %d", short(g.t.id), ix, name, l.slots)
					return
				}
			}
		}
	}
}

// subset: every index of a is in b.
func subset(a, b []int) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func describe(t *mTicket) string {
	if t == nil {
		return "gone"
	}
	return string(t.state)
}
