package cli

import (
	"math"
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// limitStats is what the event log says about one limit over a window
// (slotctl stats): its runs, their wait and hold times, how much of its
// capacity was held, and the runs that did not end normally.
type limitStats struct {
	Limit string
	Slots int // now: the log does not record resizes of the limit
	// Policy, Starts and Opens are the limit's scheduling policy and its
	// rate's state now, as the snapshot read them (store.Limit).
	Policy store.Policy
	Starts []time.Time
	Opens  time.Time
	// From and To bound the window of this limit: the requested window,
	// starting no earlier than the limit's creation or the oldest event the
	// store still keeps (a pruned log knows nothing before it).
	From, To time.Time
	Runs     int             // "admitted" events
	Waits    []time.Duration // Event.Waited of each, ascending
	Holds    []time.Duration // Event.Held of each held ticket removed, ascending
	// Kinds counts the other events: released, cancelled, busy, superseded,
	// replaced, reaped, lost, force-released.
	Kinds map[string]int
	// spans are the periods tickets held slots of the limit, whole:
	// HeldSlotSeconds and Timeline clip them to what they count.
	spans []heldSpan
}

// heldSpan is a ticket holding weight slots of a limit from start to end.
type heldSpan struct {
	start, end time.Time
	weight     int
}

// statsKinds are the event kinds stats counts, in the order shown.
var statsKinds = []string{string(store.Busy), string(store.Superseded), "replaced", string(store.Reaped), string(store.Lost),
	string(store.Released), string(store.Cancelled), string(store.ForceReleased)}

// HeldSlotSeconds is the slot-seconds held within [From, To].
func (s *limitStats) HeldSlotSeconds() float64 { return heldIn(s.spans, s.From, s.To) }

// AvailableSlotSeconds is Slots × the window's length; 0 for a paused limit.
func (s *limitStats) AvailableSlotSeconds() float64 {
	return float64(s.Slots) * max(s.To.Sub(s.From), 0).Seconds()
}

// Utilization is held over available slot-seconds; ok is false when
// nothing was available (a paused limit, an empty window).
func (s *limitStats) Utilization() (u float64, ok bool) {
	avail := s.AvailableSlotSeconds()
	if avail <= 0 {
		return 0, false
	}
	return s.HeldSlotSeconds() / avail, true
}

// Timeline is the utilization of each of cells equal intervals of [from,
// to] (the common axis of every limit); NaN for a cell wholly before the
// limit's own From or for a paused limit (no data).
func (s *limitStats) Timeline(from, to time.Time, cells int) []float64 {
	out := make([]float64, cells)
	step := to.Sub(from) / time.Duration(cells)
	for i := range out {
		a, b := from.Add(time.Duration(i)*step), from.Add(time.Duration(i+1)*step)
		if i == cells-1 {
			b = to
		}
		a = maxTime(a, s.From)
		if !b.After(a) || s.Slots == 0 {
			out[i] = math.NaN()
			continue
		}
		out[i] = heldIn(s.spans, a, b) / (float64(s.Slots) * b.Sub(a).Seconds())
	}
	return out
}

// heldIn is the slot-seconds of spans that fall within [from, to].
func heldIn(spans []heldSpan, from, to time.Time) float64 {
	var sum float64
	for _, sp := range spans {
		a, b := maxTime(sp.start, from), minTime(sp.end, to)
		if b.After(a) {
			sum += b.Sub(a).Seconds() * float64(sp.weight)
		}
	}
	return sum
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// computeStats reads the statistics of each limit of snap over [from,
// snap.Now] from events (oldest first, as Store.Events returns them). full
// says the log may have been pruned (it holds store.MaxEvents): no limit's
// window then starts before its oldest event.
//
// A held period comes from the event that removed the ticket (its time
// less Event.Held) or, for a ticket still held, from the snapshot (its
// Admitted time to now); its weight from the ticket's "admitted" event,
// then each "resized" event from its time on (docs/leases.md §2.1 item
// 12), ending at the removal's weight. Where the admitted event was pruned
// or lies before the log, the earliest weight known stands for the start.
func computeStats(events []store.Event, snap store.Snapshot, from time.Time, full bool) []limitStats {
	to := snap.Now
	out, index := statsWindows(events, snap, from, full)
	byTicket := ticketPoints{}
	for i := range events {
		byTicket.count(events, i, index, to)
	}
	still := map[heldKey]store.Ticket{}
	for _, t := range snap.Tickets {
		if t.State == store.Held {
			still[heldKey{t.Limit, t.ID}] = t
		}
	}
	for k := range still {
		if byTicket[k] == nil {
			byTicket[k] = &heldPoints{}
		}
	}
	for k, p := range byTicket {
		s := index[k.limit]
		start, end, endWeight, ok := p.period(still, k, to)
		if !ok {
			continue // waiting, or removed before it was ever held
		}
		s.spans = append(s.spans, spansOf(start, end, endWeight, p.admitted, p.resized)...)
	}
	for i := range out {
		sortStats(&out[i])
	}
	return out
}

// statsWindows is a limitStats for each limit of snap, with its window
// (see limitStats.From), and an index of them by name.
func statsWindows(events []store.Event, snap store.Snapshot, from time.Time, full bool) ([]limitStats, map[string]*limitStats) {
	out := make([]limitStats, len(snap.Limits))
	index := map[string]*limitStats{}
	for i, l := range snap.Limits {
		f := maxTime(from, l.Created)
		if full && len(events) > 0 {
			f = maxTime(f, events[0].Time)
		}
		out[i] = limitStats{Limit: l.Name, Slots: l.Slots, Policy: l.Policy, Starts: l.Starts, Opens: l.Opens, From: f, To: snap.Now, Kinds: map[string]int{}}
		index[l.Name] = &out[i]
	}
	return out, index
}

// heldKey is a ticket in one of its limits: a ticket of several limits
// holds a period in each.
type heldKey struct{ limit, ticket string }

// heldPoints are the events that bound a ticket's held period in a limit,
// and resize it.
type heldPoints struct {
	admitted *store.Event
	resized  []store.Event
	removed  *store.Event
}

// ticketPoints gathers the heldPoints of each ticket from the log.
type ticketPoints map[heldKey]*heldPoints

// at is e's ticket's points, added if new.
func (byTicket ticketPoints) at(e store.Event) *heldPoints {
	k := heldKey{e.Limit, e.Ticket}
	p := byTicket[k]
	if p == nil {
		p = &heldPoints{}
		byTicket[k] = p
	}
	return p
}

// count counts events[i] in its limit's statistics (index) when it lies
// in the limit's window (up to to), and keeps it among its ticket's points
// whether or not it does: a held period may start before the window.
func (byTicket ticketPoints) count(events []store.Event, i int, index map[string]*limitStats, to time.Time) {
	e := events[i]
	s := index[e.Limit]
	if s == nil {
		return
	}
	in := !e.Time.Before(s.From) && !e.Time.After(to)
	switch {
	case e.Kind == "admitted":
		byTicket.at(e).admitted = &events[i]
		if in {
			s.Runs++
			s.Waits = append(s.Waits, max(e.Waited, 0))
		}
	case e.Kind == store.Resized:
		p := byTicket.at(e)
		p.resized = append(p.resized, e)
	default:
		if in {
			s.Kinds[e.Kind]++
		}
		// The first event that removed the held ticket ends its span
		// (a "lost" after a reap of the same ticket counts once).
		if p := byTicket.at(e); e.Held > 0 && p.removed == nil {
			p.removed = &events[i]
			if in {
				s.Holds = append(s.Holds, e.Held)
			}
		}
	}
}

// period is the held period of ticket k, whole: from the event that
// removed it, or from the snapshot (still) for one still held, up to to.
// ok is false for a ticket that was never held.
func (p *heldPoints) period(still map[heldKey]store.Ticket, k heldKey, to time.Time) (start, end time.Time, endWeight int, ok bool) {
	switch t, held := still[k]; {
	case p.removed != nil:
		end, endWeight = p.removed.Time, eventWeight(*p.removed)
		start = end.Add(-p.removed.Held)
	case held:
		start, end, endWeight = t.Admitted, to, t.Weighs()
		if start.IsZero() {
			start = t.Created
		}
	default:
		return start, end, endWeight, false
	}
	if p.admitted != nil && p.admitted.Time.After(start) {
		start = p.admitted.Time // the same instant by another reading of the clock
	}
	return start, end, endWeight, true
}

// sortStats sorts a limit's waits, holds and spans: the order of the sum,
// not the map's, so the same figures each time.
func sortStats(s *limitStats) {
	slices.Sort(s.Waits)
	slices.Sort(s.Holds)
	slices.SortFunc(s.spans, func(a, b heldSpan) int {
		if c := a.start.Compare(b.start); c != 0 {
			return c
		}
		if c := a.end.Compare(b.end); c != 0 {
			return c
		}
		return a.weight - b.weight
	})
}

// spansOf cuts one held period at its resizes.
func spansOf(start, end time.Time, endWeight int, admitted *store.Event, resized []store.Event) []heldSpan {
	w := endWeight
	switch {
	case admitted != nil:
		w = eventWeight(*admitted)
	case len(resized) > 0:
		w = eventWeight(resized[0])
	}
	var out []heldSpan
	cur := start
	for _, r := range resized {
		if r.Time.Before(cur) || r.Time.After(end) {
			continue
		}
		if r.Time.After(cur) {
			out = append(out, heldSpan{cur, r.Time, w})
		}
		cur, w = r.Time, eventWeight(r)
	}
	if end.After(cur) {
		out = append(out, heldSpan{cur, end, w})
	}
	return out
}

// eventWeight is an event's weight (0 means 1).
func eventWeight(e store.Event) int { return max(e.Weight, 1) }

// percentile is the nearest-rank p-th percentile of sorted (0 < p <= 100):
// the smallest value that at least p% of the values do not exceed.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// limit is the limit s describes, as policyCell and policyJSONOf read it.
func (s *limitStats) limit() store.Limit {
	return store.Limit{Name: s.Limit, Slots: s.Slots, Policy: s.Policy, Starts: s.Starts, Opens: s.Opens}
}
