package cli

import (
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
)

func ones(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

func TestEstimateWait(t *testing.T) {
	m := time.Minute
	five := []time.Duration{4 * m, 2 * m, 3 * m, 10 * m, 3 * m} // median 3m
	for _, c := range []struct {
		name    string
		holds   []time.Duration
		elapsed []time.Duration
		ahead   []int
		weight  int
		slots   int
		want    time.Duration
		ok      bool
	}{
		{"too few runs", five[:4], nil, nil, 1, 1, 0, false},
		{"paused", five, nil, nil, 1, 0, 0, false},
		{"heavier than the limit", five, nil, nil, 3, 2, 0, false},
		{"first, holder 1m in", five, []time.Duration{m}, nil, 1, 1, 2 * m, true},
		{"third, one slot", five, []time.Duration{m}, ones(2), 1, 1, 2*m + 3*m + 3*m, true},
		// past the median: the holds longer than 3m30s are 4m and 10m, so
		// 30s or 6m30s more: the lower median, 30s
		{"holder past the median", five, []time.Duration{3*m + 30*time.Second}, nil, 1, 1, 30 * time.Second, true},
		{"holder past every recent hold: nothing to go by", five, []time.Duration{20 * m}, nil, 1, 1, 0, false},
		// two slots, holders 1m and 2m in: they free at 2m and at 1m (the
		// holds above 2m less 2m: 1m, 1m, 2m, 8m); the waiters ahead take
		// those, and free them again at 4m and 5m.
		{"third, two slots", five, []time.Duration{m, 2 * m}, ones(2), 1, 2, 4 * m, true},
		{"fourth, two slots", five, []time.Duration{m, 2 * m}, ones(3), 1, 2, 5 * m, true},
		// a slot no one holds frees now (a heavier ticket ahead waits for two)
		{"free slot", five, []time.Duration{m}, nil, 1, 2, 0, true},
		{"even count: lower median", []time.Duration{m, 2 * m, 3 * m, 4 * m, 5 * m, 6 * m}, nil, ones(1), 1, 1, 3 * m, true},
		// weights: slots free at 1m and 2m; a waiter of weight 2 needs both (2m)
		{"weight 2 first", five, []time.Duration{m, 2 * m}, nil, 2, 2, 2 * m, true},
		// a weight-2 waiter ahead takes both at 2m and holds them to 5m; then ours
		{"behind a weight 2", five, []time.Duration{m, 2 * m}, []int{2}, 1, 2, 5 * m, true},
		{"a waiter ahead heavier than the limit", five, nil, []int{3}, 1, 2, 0, false},
	} {
		got, ok := estimateWait(c.holds, c.elapsed, c.ahead, c.weight, c.slots)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: estimateWait = %v %v, want %v %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// TestEstimateIn reads the holders and the waiters ahead from a snapshot:
// a ticket of weight 2 holds two slots, the ticket's own position counts,
// and waiters behind it do not.
func TestEstimateIn(t *testing.T) {
	m := time.Minute
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	holds := []time.Duration{3 * m, 3 * m, 3 * m, 3 * m, 3 * m}
	l := store.Limit{Name: "b", Slots: 3}
	snap := store.Snapshot{Now: now, Limits: []store.Limit{l}, Tickets: []store.Ticket{
		{ID: "h1", Limit: "b", State: store.Held, Weight: 2, Admitted: now.Add(-m)}, // two slots free at 2m
		{ID: "h2", Limit: "b", State: store.Held, Admitted: now.Add(-2 * m)},        // one at 1m
		{ID: "w1", Limit: "b", State: store.Waiting, Position: 1},                   // takes 1m, to 4m
		{ID: "me", Limit: "b", State: store.Waiting, Position: 2, Weight: 2},        // needs 2: 2m and 2m
		{ID: "w3", Limit: "b", State: store.Waiting, Position: 3, Weight: 3},        // behind: no matter
	}}
	got, ok := estimateIn(holds, snap, l, snap.Tickets[3])
	if !ok || got != 2*m {
		t.Errorf("estimateIn = %v %v, want 2m", got, ok)
	}
	if _, ok := estimateIn(holds, snap, l, store.Ticket{ID: "gone"}); ok {
		t.Errorf("an estimate for a ticket not in the queue")
	}
}

func TestApproxDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                 "~1s",
		400 * time.Millisecond:            "~1s",
		45 * time.Second:                  "~45s",
		59*time.Second + time.Millisecond: "~1m",
		4*time.Minute + 20*time.Second:    "~4m",
		2*time.Hour + 7*time.Minute:       "~2h10m",
		3 * time.Hour:                     "~3h",
		80 * time.Hour:                    "~3d",
	} {
		if got := approxDuration(d); got != want {
			t.Errorf("approxDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestEstimateInHeads: from a snapshot of the heads only (store.Heads) the
// ticket's place is its own Position, the first waiter counts its weight,
// and a waiter ahead that the snapshot does not list counts as weight 1.
func TestEstimateInHeads(t *testing.T) {
	m := time.Minute
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	holds := []time.Duration{3 * m, 3 * m, 3 * m, 3 * m, 3 * m}
	l := store.Limit{Name: "b", Slots: 3, Held: 3, Waiting: 3}
	snap := store.Snapshot{Now: now, Limits: []store.Limit{l}, Tickets: []store.Ticket{
		{ID: "h1", Limit: "b", State: store.Held, Weight: 2, Admitted: now.Add(-m)}, // two slots free at 2m
		{ID: "h2", Limit: "b", State: store.Held, Admitted: now.Add(-2 * m)},        // one at 1m
		{ID: "w1", Limit: "b", State: store.Waiting, Position: 1, Weight: 2},        // takes 1m and 2m, to 5m
	}}
	// Second in line, not listed: weight 1, takes h1's other slot at 2m, to 5m.
	me := store.Ticket{ID: "me", Limit: "b", State: store.Waiting, Position: 3}
	got, ok := estimateIn(holds, snap, l, me)
	if !ok || got != 5*m {
		t.Errorf("estimateIn = %v %v, want 5m", got, ok)
	}
}
