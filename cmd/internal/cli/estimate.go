package cli

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// The admission estimate of run's waiting line ("3rd in queue, ~4m", SPEC
// §2.9): from the limit's recent hold times, read once a waiting line is
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

// estimateWait says when the waiter at position (1-based) of a limit of
// slots slots will be admitted, given the limit's recent hold times and how
// long each current holder has held (elapsed). A holder that has held for e
// is expected to go on for the median of h - e over the recent holds h
// longer than e (at e = 0, the median hold); each waiter ahead takes the
// next slot to free and holds it for the median hold; the waiter's turn is
// the position-th slot to free. No estimate (ok false) with fewer than
// estimateMin hold times, a paused limit, no position, or a holder that has
// held longer than every recent hold (nothing says when it will end).
func estimateWait(holds []time.Duration, elapsed []time.Duration, position, slots int) (eta time.Duration, ok bool) {
	if len(holds) < estimateMin || position < 1 || slots < 1 {
		return 0, false
	}
	median := lowerMedian(holds)
	free := make(durationHeap, 0, slots)
	for i := range slots {
		var r time.Duration // a slot no one holds (a heavier ticket ahead waits for more) frees now
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
	for range position - 1 { // the waiters ahead take the slots that free first
		t := heap.Pop(&free).(time.Duration)
		heap.Push(&free, t+median)
	}
	return free[0], true
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

// estimate is the ", ~4m" of the waiting line of a ticket at position in
// the one limit of snap, or "" when there is no estimate.
func (s *statusLine) estimate(ctx context.Context, snap store.Snapshot, position int) string {
	if len(snap.Limits) != 1 {
		return ""
	}
	now := time.Now()
	if s.f.Now != nil {
		now = s.f.Now()
	}
	if s.holdsAt.IsZero() || now.Sub(s.holdsAt) >= estimateRefresh {
		s.holds, s.holdsAt = recentHolds(ctx, s.st, snap.Limits[0].Name), now
	}
	var elapsed []time.Duration
	for _, x := range snap.Tickets {
		if x.State == store.Held && !x.Admitted.IsZero() {
			for range x.Weighs() {
				elapsed = append(elapsed, max(snap.Now.Sub(x.Admitted), 0))
			}
		}
	}
	eta, ok := estimateWait(s.holds, elapsed, position, snap.Limits[0].Slots)
	if !ok {
		return ""
	}
	return ", " + approxDuration(eta)
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
