package sim

import (
	"reflect"

	"github.com/slotctl/slotctl/store"
)

// counted checks S22 after a step that called the store: no counter of any
// limit went back (docs/leases.md §2.8; the simulation never removes a limit).
func (m *model) counted() {
	cs, err := m.s.checker.Counts(m.s.ctx)
	if err != nil {
		m.fail("S12", "counts: %v", err)
		return
	}
	if m.counts == nil {
		m.counts = map[string]store.Counts{}
	}
	for _, c := range cs {
		if prev, ok := m.counts[c.Limit]; ok {
			if what, back := wentBack(prev, c); back {
				m.fail("S22", "counts of %s: %s went back (%+v, then %+v)", c.Limit, what, prev, c)
				return
			}
		}
		m.counts[c.Limit] = c
	}
}

// wentBack names a counter of cur below prev's.
func wentBack(prev, cur store.Counts) (string, bool) {
	for _, f := range []struct {
		name      string
		prev, cur uint64
	}{
		{"admitted", prev.Admitted, cur.Admitted}, {"released", prev.Released, cur.Released},
		{"cancelled", prev.Cancelled, cur.Cancelled}, {"busy", prev.Busy, cur.Busy},
		{"superseded", prev.Superseded, cur.Superseded}, {"replaced", prev.Replaced, cur.Replaced},
		{"reaped", prev.Reaped, cur.Reaped}, {"lost", prev.Lost, cur.Lost},
		{"force-released", prev.ForceReleased, cur.ForceReleased},
		{"wait count", prev.Wait.Count, cur.Wait.Count}, {"hold count", prev.Hold.Count, cur.Hold.Count},
	} {
		if f.cur < f.prev {
			return f.name, true
		}
	}
	if cur.Wait.Sum < prev.Wait.Sum || cur.Hold.Sum < prev.Hold.Sum {
		return "a histogram's sum", true
	}
	return "", false
}

// countsAgree checks S22 at quiescence: each limit's counts are the tally
// of its log, every event counted once, in the step that logged it, through
// crashes, lost answers and late duplicates (when the log still holds every
// event: fewer than store.MaxEvents).
func (m *model) countsAgree() {
	evs, err := m.s.checker.Events(m.s.ctx, "", store.MaxEvents)
	if err != nil {
		m.fail("S12", "events: %v", err)
		return
	}
	if len(evs) >= store.MaxEvents {
		return
	}
	want := map[string]*store.Counts{}
	for _, e := range evs {
		if want[e.Limit] == nil {
			want[e.Limit] = &store.Counts{Limit: e.Limit}
		}
		want[e.Limit].Add(e)
	}
	cs, err := m.s.checker.Counts(m.s.ctx)
	if err != nil {
		m.fail("S12", "counts: %v", err)
		return
	}
	for _, c := range cs {
		w := want[c.Limit]
		if w == nil {
			w = &store.Counts{Limit: c.Limit}
		}
		norm := func(c store.Counts) store.Counts {
			if c.Wait.Count == 0 {
				c.Wait.Buckets = nil
			}
			if c.Hold.Count == 0 {
				c.Hold.Buckets = nil
			}
			return c
		}
		if !reflect.DeepEqual(norm(c), norm(*w)) {
			m.fail("S22", "counts of %s: %+v; the log says %+v", c.Limit, c, *w)
			return
		}
	}
}
