package policy

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
)

// The scheduling orders as PlanSettle applies them; the properties over
// random inputs are in plan_prop_test.go.
func TestPlanSettleOrders(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	type tk struct {
		id       string
		limits   []string
		held     bool
		weight   int
		priority int
		share    string
		age      time.Duration // created this long before now
	}
	prio := store.Policy{Order: store.ByPriority}
	fair := store.Policy{Order: store.Fair}
	tests := []struct {
		name     string
		slots    map[string]int
		policies map[string]store.Policy
		starts   map[string][]time.Time
		tickets  []tk
		admit    []string // ids admitted, in the plan's order
		starts2  map[string]int
	}{
		{
			name: "priority: the higher one first, whatever its age", slots: map[string]int{"l": 1},
			policies: map[string]store.Policy{"l": prio},
			tickets:  []tk{{id: "old", priority: 0}, {id: "new", priority: 5}},
			admit:    []string{"new"},
		},
		{
			name: "priority: ties in ticket order", slots: map[string]int{"l": 1},
			policies: map[string]store.Policy{"l": prio},
			tickets:  []tk{{id: "a", priority: 3}, {id: "b", priority: 3}},
			admit:    []string{"a"},
		},
		{
			name: "aging: ten minutes waited is ten points", slots: map[string]int{"l": 1},
			policies: map[string]store.Policy{"l": prio},
			tickets:  []tk{{id: "old", priority: 0, age: 10 * time.Minute}, {id: "new", priority: 9}},
			admit:    []string{"old"},
		},
		{
			name: "aging: its own period", slots: map[string]int{"l": 1},
			policies: map[string]store.Policy{"l": {Order: store.ByPriority, Aging: time.Hour}},
			tickets:  []tk{{id: "old", priority: 0, age: 10 * time.Minute}, {id: "new", priority: 1}},
			admit:    []string{"new"},
		},
		{
			name: "fair: the share holding fewer slots goes first", slots: map[string]int{"l": 2},
			policies: map[string]store.Policy{"l": fair},
			tickets: []tk{{id: "a0", share: "a", held: true}, {id: "a1", share: "a"}, {id: "a2", share: "a"},
				{id: "b1", share: "b"}},
			admit: []string{"b1"},
		},
		{
			name: "fair: turns between shares, ties in ticket order", slots: map[string]int{"l": 4},
			policies: map[string]store.Policy{"l": fair},
			tickets:  []tk{{id: "a1", share: "a"}, {id: "a2", share: "a"}, {id: "a3", share: "a"}, {id: "b1", share: "b"}, {id: "b2", share: "b"}},
			admit:    []string{"a1", "b1", "a2", "b2"},
		},
		{
			name: "fair: weights count", slots: map[string]int{"l": 3},
			policies: map[string]store.Policy{"l": fair},
			tickets:  []tk{{id: "a0", share: "a", held: true, weight: 2}, {id: "a1", share: "a"}, {id: "b1", share: "b"}},
			admit:    []string{"b1"},
		},
		{
			name: "rate: spent, nobody", slots: map[string]int{"l": 5},
			policies: map[string]store.Policy{"l": {Rate: store.Rate{N: 2, Per: time.Minute}}},
			starts:   map[string][]time.Time{"l": {now.Add(-50 * time.Second), now.Add(-10 * time.Second)}},
			tickets:  []tk{{id: "a"}, {id: "b"}},
		},
		{
			name: "rate: one start aged out, one admission, charged", slots: map[string]int{"l": 5},
			policies: map[string]store.Policy{"l": {Rate: store.Rate{N: 2, Per: time.Minute}}},
			starts:   map[string][]time.Time{"l": {now.Add(-70 * time.Second), now.Add(-10 * time.Second)}},
			tickets:  []tk{{id: "a", weight: 3}, {id: "b"}},
			admit:    []string{"a"},
			starts2:  map[string]int{"l": 2},
		},
		{
			name: "rate: a spent rate blocks the limit's other limits' waiters behind it", slots: map[string]int{"l": 5, "m": 5},
			policies: map[string]store.Policy{"l": {Rate: store.Rate{N: 1, Per: time.Minute}}},
			starts:   map[string][]time.Time{"l": {now.Add(-10 * time.Second)}},
			tickets:  []tk{{id: "lm", limits: []string{"l", "m"}}, {id: "m"}},
		},
		{
			name: "priority across limits: the head of m does not fit in l, so nobody passes it in m", slots: map[string]int{"l": 1, "m": 2},
			policies: map[string]store.Policy{"l": prio, "m": prio},
			tickets:  []tk{{id: "h", limits: []string{"l"}, held: true}, {id: "low", limits: []string{"m"}}, {id: "high", limits: []string{"m", "l"}, priority: 10}},
		},
		{
			name: "limits that disagree do not deadlock", slots: map[string]int{"l": 1, "m": 1},
			policies: map[string]store.Policy{"l": prio, "m": fair},
			tickets: []tk{{id: "mh", limits: []string{"m"}, share: "x", held: true}, {id: "x", limits: []string{"l", "m"}, share: "x"},
				{id: "y", limits: []string{"l", "m"}, share: "y", priority: 5}},
			// l puts y first (priority), m puts... y too (x's share holds a slot): no cycle,
			// both wait for m's holder.
		},
		{
			name: "a cycle between orders: the older ticket goes first", slots: map[string]int{"l": 2, "m": 2},
			policies: map[string]store.Policy{"l": prio, "m": fair},
			tickets: []tk{{id: "mh", limits: []string{"m"}, share: "y", held: true}, {id: "x", limits: []string{"l", "m"}, share: "x"},
				{id: "y", limits: []string{"l", "m"}, share: "y", priority: 5}},
			// l: y before x (priority); m: x before y (y's share holds a slot). Ticket order breaks
			// the tie: x, then y finds m full.
			admit: []string{"x"},
		},
		{
			name: "FIFO limit beside a priority one keeps ticket order", slots: map[string]int{"l": 1, "f": 1},
			policies: map[string]store.Policy{"l": prio},
			tickets:  []tk{{id: "f1", limits: []string{"f"}}, {id: "f2", limits: []string{"f", "l"}, priority: 9}},
			admit:    []string{"f1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := SettleInput{Slots: tc.slots, Policies: tc.policies, Starts: tc.starts, Now: now}
			used := map[string]int{}
			for i, k := range tc.tickets {
				lims := k.limits
				if lims == nil {
					lims = []string{"l"}
				}
				tt := store.Ticket{ID: k.id, Limit: lims[0], Limits: lims, Weight: k.weight, State: store.Waiting, Slot: -1,
					Fence: uint64(i + 1), Priority: k.priority, Share: k.share, Created: now.Add(-k.age)}
				if k.held {
					tt.State, tt.Indexes = store.Held, map[string][]int{}
					for _, l := range lims {
						for range tt.Weighs() {
							tt.Indexes[l] = append(tt.Indexes[l], used[l])
							used[l]++
						}
					}
					tt.Slot = tt.Indexes[lims[0]][0]
				}
				in.Tickets = append(in.Tickets, Queued{Ticket: tt})
			}
			plan := PlanSettle(in)
			var got []string
			for _, a := range plan.Admit {
				got = append(got, in.Tickets[a.Index].Ticket.ID)
			}
			if !slices.Equal(got, tc.admit) {
				t.Errorf("admitted %q, want %q", got, tc.admit)
			}
			for name, n := range tc.starts2 {
				if len(plan.Starts[name]) != n || plan.Starts[name][n-1] != now {
					t.Errorf("starts of %s after the plan: %v, want %d ending at now", name, plan.Starts[name], n)
				}
			}
			if tc.starts2 == nil && len(plan.Starts) > 0 && len(plan.Admit) == 0 {
				t.Errorf("starts %v without an admission", plan.Starts)
			}
		})
	}
}

// A rated limit's plan charges every admission, and only the limits it admits to.
func TestPlanChargesEachAdmission(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	in := SettleInput{Slots: map[string]int{"l": 10, "m": 10}, Now: now,
		Policies: map[string]store.Policy{"l": {Rate: store.Rate{N: 3, Per: time.Minute}}, "m": {Rate: store.Rate{N: 3, Per: time.Minute}}}}
	for i := range 5 {
		in.Tickets = append(in.Tickets, Queued{Ticket: store.Ticket{ID: fmt.Sprint(i), Limit: "l", State: store.Waiting, Slot: -1, Fence: uint64(i + 1)}})
	}
	plan := PlanSettle(in)
	if len(plan.Admit) != 3 || len(plan.Starts["l"]) != 3 {
		t.Fatalf("admitted %d with starts %v, want 3 and 3", len(plan.Admit), plan.Starts["l"])
	}
	if _, ok := plan.Starts["m"]; ok {
		t.Fatalf("m charged %v without an admission", plan.Starts["m"])
	}
	if !slices.Equal(plan.Wake, []int{3}) {
		t.Fatalf("woken %v, want [3]: the waiter left first in the limit whose rate the plan spent", plan.Wake)
	}
}

// BenchmarkPlanSettle1000 is one settle of a limit of 10 slots, 9 held and
// 1,000 waiting, under each order: the planner's cost alone (the store's
// is BenchmarkAdmit1000 in store/boltstore).
func BenchmarkPlanSettle1000(b *testing.B) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, pol := range []store.Policy{{}, {Order: store.ByPriority}, {Order: store.Fair}, {Rate: store.Rate{N: 100, Per: time.Minute}}} {
		b.Run(pol.String(), func(b *testing.B) {
			in := SettleInput{Slots: map[string]int{"l": 10}, Now: now, Policies: map[string]store.Policy{"l": pol}}
			for i := range 1009 {
				t := store.Ticket{ID: fmt.Sprint(i), Limit: "l", State: store.Waiting, Slot: -1, Fence: uint64(i + 1),
					Priority: i % 7, Share: fmt.Sprint("user", i%13), Created: now.Add(-time.Duration(i) * time.Second)}
				if i < 9 {
					t.State, t.Slot = store.Held, i
				}
				in.Tickets = append(in.Tickets, Queued{Ticket: t})
			}
			for b.Loop() {
				if p := PlanSettle(in); len(p.Admit) != 1 {
					b.Fatalf("admitted %d, want 1", len(p.Admit))
				}
			}
		})
	}
}
