package cli

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// The admission estimate of run's waiting line ("3rd in queue, ~4m"): from
// the limit's recent hold times, read once a waiting line is
// shown (never on the uncontended path) and again at most every
// estimateRefresh while it is.
const (
	estimateRuns    = 20  // the newest hold times it takes
	estimateMin     = 5   // fewer than this: no estimate
	estimateEvents  = 200 // the newest events of the limit it reads for them
	estimateRefresh = 30 * time.Second
)

// recentHolds is the Event.Held of the newest removals of held tickets of
// limit (at most estimateRuns of them).
func recentHolds(ctx context.Context, st store.Store, limit string) []time.Duration {
	events, err := st.Events(ctx, limit, estimateEvents)
	if err != nil {
		return nil
	}
	var out []time.Duration
	for i := len(events) - 1; i >= 0 && len(out) < estimateRuns; i-- {
		if e := events[i]; e.Kind != "admitted" && e.Held > 0 {
			out = append(out, e.Held)
		}
	}
	return out
}

// estimateWait says when a waiter of weight slots in a limit of slots slots
// will be admitted, behind the waiters ahead of it (their weights, in queue
// order), given the limit's recent hold times and how long each held slot
// has been held (elapsed). A slot held for e is expected to be held for the
// median of h - e over the recent holds h longer than e (at e = 0, the
// median hold); a slot no one holds is free now. In queue order each
// waiter takes the first slots to free, as many as it weighs, when the
// last of them frees, and holds them for the median hold; the estimate is
// when the waiter's own turn comes. No estimate (ok false) with fewer than
// estimateMin hold times, a paused limit, a waiter heavier than the limit,
// or a holder that has held longer than every recent hold (nothing says
// when it will end).
func estimateWait(holds, elapsed []time.Duration, ahead []int, weight, slots int) (eta time.Duration, ok bool) {
	if len(holds) < estimateMin || slots < 1 || weight < 1 || weight > slots {
		return 0, false
	}
	median := lowerMedian(holds)
	free := make(durationHeap, 0, slots)
	for i := range slots {
		var r time.Duration
		if i < len(elapsed) {
			var rest []time.Duration
			for _, h := range holds {
				if h > elapsed[i] {
					rest = append(rest, h-elapsed[i])
				}
			}
			if len(rest) == 0 {
				return 0, false
			}
			r = lowerMedian(rest)
		}
		free = append(free, r)
	}
	heap.Init(&free)
	take := func(w int) time.Duration { // the time the first w slots to free are all free
		var at time.Duration
		for range w {
			at = max(at, heap.Pop(&free).(time.Duration))
		}
		return at
	}
	for _, w := range ahead {
		if w < 1 || w > slots {
			return 0, false
		}
		at := take(w)
		for range w {
			heap.Push(&free, at+median)
		}
	}
	return take(weight), true
}

// estimateIn is the estimate for ticket t in limit l of snap: the held
// slots' elapsed times and the weights of the waiters ahead of t there. A
// snapshot of the heads only (store.Heads) lists no waiter but the first:
// t's place is then its own Position, and a waiter ahead that snap does not
// list is taken to weigh 1.
func estimateIn(holds []time.Duration, snap store.Snapshot, l store.Limit, t store.Ticket) (time.Duration, bool) {
	pos := placeIn(snap, l, t)
	if pos < 1 {
		return 0, false
	}
	var elapsed []time.Duration
	weights := make([]int, pos-1) // of the waiters ahead, by place
	for i := range weights {
		weights[i] = 1
	}
	for _, x := range snap.Tickets {
		if x.Limit != l.Name {
			continue
		}
		switch {
		case x.State == store.Held:
			e := time.Duration(0) // not known: as if just admitted
			if !x.Admitted.IsZero() {
				e = max(snap.Now.Sub(x.Admitted), 0)
			}
			for range x.Weighs() {
				elapsed = append(elapsed, e)
			}
		case x.Position >= 1 && x.Position < pos:
			weights[x.Position-1] = x.Weighs()
		}
	}
	return estimateWait(holds, elapsed, weights, t.Weighs(), l.Slots)
}

// placeIn is waiting ticket t's place in the queue of limit l of snap:
// where snap lists it there, else its own Position when t is read under
// l; 0 when it does not wait there.
func placeIn(snap store.Snapshot, l store.Limit, t store.Ticket) int {
	pos := 0
	if t.Limit == l.Name && t.State == store.Waiting {
		pos = t.Position
	}
	for _, x := range snap.Tickets {
		if x.Limit == l.Name && x.ID == t.ID && x.State == store.Waiting {
			pos = x.Position
		}
	}
	return pos
}

// estimateRated is estimateIn with l's rate: no earlier than the rate lets
// the waiter at t's place in (store.Policy.Opens). Without an estimate
// from the holds, the rate alone is the estimate for a first waiter that
// has room: nothing but the rate keeps it out.
func estimateRated(holds []time.Duration, snap store.Snapshot, l store.Limit, t store.Ticket) (time.Duration, bool) {
	e, ok := estimateIn(holds, snap, l, t)
	pos := placeIn(snap, l, t)
	r := rateWait(l, snap.Now, pos)
	if !ok {
		if r > 0 && pos == 1 && l.Slots-l.Held >= t.Weighs() {
			return r, true
		}
		return 0, false
	}
	return max(e, r), true
}

// estimate is the ", ~4m" of the waiting line of ticket t in the limits of
// snap that keep it waiting (names; all of snap's when nil): the latest of
// its estimates there (each no earlier than the limit's rate allows), or
// "" when one of them has none.
func (s *statusLine) estimate(ctx context.Context, snap store.Snapshot, t store.Ticket, names map[string]bool) string {
	now := time.Now()
	if s.f.Now != nil {
		now = s.f.Now()
	}
	if s.holdsAt.IsZero() || now.Sub(s.holdsAt) >= estimateRefresh {
		s.holds, s.holdsAt = map[string][]time.Duration{}, now
	}
	var eta time.Duration
	n := 0
	for _, l := range snap.Limits {
		if names != nil && !names[l.Name] {
			continue
		}
		holds, ok := s.holds[l.Name]
		if !ok {
			holds = recentHolds(ctx, s.st, l.Name)
			s.holds[l.Name] = holds
		}
		e, ok := estimateRated(holds, snap, l, t)
		if !ok {
			return ""
		}
		eta, n = max(eta, e), n+1
	}
	if n == 0 {
		return ""
	}
	return ", " + approxDuration(eta)
}

// lowerMedian is the middle value of ds (the lower of the two middle ones
// of an even count); ds is not changed.
func lowerMedian(ds []time.Duration) time.Duration {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[(len(sorted)-1)/2]
}

// approxDuration is an estimate as the waiting line shows it: ~45s, ~4m, ~2h10m, ~3d.
func approxDuration(d time.Duration) string {
	secs := max(int((d+time.Second-1)/time.Second), 1) // rounded up: "~0s" is never true
	switch {
	case secs < 60:
		return fmt.Sprintf("~%ds", secs)
	case d < time.Hour:
		return fmt.Sprintf("~%dm", int(d.Round(time.Minute)/time.Minute))
	case d < 48*time.Hour:
		d = d.Round(10 * time.Minute)
		if m := int(d/time.Minute) % 60; m != 0 {
			return fmt.Sprintf("~%dh%02dm", int(d/time.Hour), m)
		}
		return fmt.Sprintf("~%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("~%dd", int(d.Round(24*time.Hour)/(24*time.Hour)))
}

// durationHeap is a min-heap of durations.
type durationHeap []time.Duration

func (h durationHeap) Len() int           { return len(h) }
func (h durationHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h durationHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *durationHeap) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *durationHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
