package policy

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/slotctl/slotctl/store"
)

func TestPlanSettle(t *testing.T) {
	held := func(id string, slot int) Queued {
		return Queued{Ticket: store.Ticket{ID: id, Limit: "l", State: store.Held, Slot: slot}}
	}
	waiting := func(id string) Queued {
		return Queued{Ticket: store.Ticket{ID: id, Limit: "l", State: store.Waiting, Slot: -1}}
	}
	expired := func(q Queued, why string) Queued { q.Expired = why; return q }
	in := func(limit string, q Queued) Queued { q.Ticket.Limit = limit; return q }
	fresh := func(q Queued) Queued { q.Fresh = true; return q }

	tests := []struct {
		name    string
		slots   map[string]int
		tickets []Queued
		dead    []string // ids the judge proves dead
		all     bool
		expJudg bool
		dry     bool
		want    SettlePlan
		asked   []string // ids shown to the judge, in order
	}{
		{
			name:    "nothing to do",
			slots:   map[string]int{"l": 2},
			tickets: []Queued{held("a", 0), held("b", 1), waiting("c")},
			want:    SettlePlan{},
			asked:   []string{"a", "b", "c"}, // contended: holders and the next in line
		},
		{
			name:  "empty limit",
			slots: map[string]int{"l": 2},
			want:  SettlePlan{},
		},
		{
			name:    "uncontended: nobody is judged",
			slots:   map[string]int{"l": 3},
			tickets: []Queued{held("a", 0), held("b", 1)},
			dead:    []string{"a"},
			want:    SettlePlan{},
		},
		{
			name:    "expiry frees a slot for the head waiter",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{expired(held("a", 0), "expired 3s ago"), waiting("b"), waiting("c")},
			want:    SettlePlan{Remove: []Remove{{0, "expired 3s ago"}}, Admit: []Admit{{Index: 1, Slot: 0}}},
		},
		{
			name:    "an expired waiter is removed and passes nobody",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{held("a", 0), expired(waiting("b"), "expired 1s ago"), waiting("c")},
			want:    SettlePlan{Remove: []Remove{{1, "expired 1s ago"}}},
			asked:   []string{"a", "c"},
		},
		{
			name:    "proof of death frees a contended slot",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{held("a", 0), waiting("b"), waiting("c")},
			dead:    []string{"a"},
			want:    SettlePlan{Remove: []Remove{{0, "dead"}}, Admit: []Admit{{Index: 1, Slot: 0}}},
			asked:   []string{"a", "b"}, // c is behind the next in line
		},
		{
			name:    "a dead ticket far back is left to its TTL",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{held("a", 0), waiting("b"), waiting("c")},
			dead:    []string{"c"},
			want:    SettlePlan{},
			asked:   []string{"a", "b"},
		},
		{
			name:    "reap judges everyone",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{held("a", 0), waiting("b"), waiting("c")},
			dead:    []string{"c"},
			all:     true,
			want:    SettlePlan{Remove: []Remove{{2, "dead"}}},
			asked:   []string{"a", "b", "c"},
		},
		{
			name:    "dry run: the judge is asked without act",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{expired(held("a", 0), "expired 2s ago"), waiting("b"), waiting("c")},
			dead:    []string{"a", "c"},
			all:     true,
			dry:     true,
			want:    SettlePlan{Remove: []Remove{{0, "expired 2s ago; dead"}, {2, "dead"}}, Admit: []Admit{{Index: 1, Slot: 0}}},
			asked:   []string{"a", "b", "c"},
		},
		{
			name:    "expired and dead: both said",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{expired(held("a", 0), "expired 2s ago"), waiting("b")},
			dead:    []string{"a"},
			expJudg: true,
			want:    SettlePlan{Remove: []Remove{{0, "expired 2s ago; dead"}}, Admit: []Admit{{Index: 1, Slot: 0}}},
			asked:   []string{"a"}, // b is alone once a expired: uncontended
		},
		{
			name:    "an expired ticket is not shown to the judge unless asked",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{expired(held("a", 0), "expired 2s ago"), waiting("b")},
			dead:    []string{"a"},
			want:    SettlePlan{Remove: []Remove{{0, "expired 2s ago"}}, Admit: []Admit{{Index: 1, Slot: 0}}},
		},
		{
			name:    "FIFO: a blocked head blocks those behind it",
			slots:   map[string]int{"l": 2},
			tickets: []Queued{held("a", 0), held("b", 1), waiting("c"), waiting("d")},
			want:    SettlePlan{},
			asked:   []string{"a", "b", "c", "d"},
		},
		{
			name:    "FIFO: admissions in queue order while slots are free",
			slots:   map[string]int{"l": 3},
			tickets: []Queued{held("a", 1), waiting("b"), waiting("c"), waiting("d")},
			want:    SettlePlan{Admit: []Admit{{Index: 1, Slot: 0}, {Index: 2, Slot: 2}}},
			asked:   []string{}, // 1 held of 3: not contended
		},
		{
			name:    "shrunk: nobody admitted while the holders are as many as the slots",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{held("a", 0), held("b", 1), held("c", 2), waiting("d")},
			want:    SettlePlan{},
			asked:   []string{"a", "b", "c", "d"},
		},
		{
			name:    "shrunk: a removal below the size still admits nobody",
			slots:   map[string]int{"l": 2},
			tickets: []Queued{expired(held("a", 0), "expired 1s ago"), held("b", 1), held("c", 2), waiting("d")},
			want:    SettlePlan{Remove: []Remove{{0, "expired 1s ago"}}},
			asked:   []string{"b", "c", "d"},
		},
		{
			name:    "shrunk: admitted once below the size, into the lowest free index",
			slots:   map[string]int{"l": 2},
			tickets: []Queued{expired(held("a", 0), "x"), expired(held("b", 1), "x"), held("c", 2), waiting("d"), waiting("e")},
			want:    SettlePlan{Remove: []Remove{{0, "x"}, {1, "x"}}, Admit: []Admit{{Index: 3, Slot: 0}}},
		},
		{
			name:    "slot index reuse: the freed index is taken first",
			slots:   map[string]int{"l": 3},
			tickets: []Queued{held("a", 0), expired(held("b", 1), "x"), held("c", 2), waiting("d")},
			want:    SettlePlan{Remove: []Remove{{1, "x"}}, Admit: []Admit{{Index: 3, Slot: 1}}},
		},
		{
			name:    "paused limit admits nobody",
			slots:   map[string]int{"l": 0},
			tickets: []Queued{waiting("a")},
			want:    SettlePlan{},
			asked:   []string{}, // next in line: the first 0 waiters
		},
		{
			name:    "a fresh ticket is admitted but not judged",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{held("a", 0), fresh(waiting("b"))},
			dead:    []string{"b"},
			all:     true,
			want:    SettlePlan{},
			asked:   []string{"a"},
		},
		{
			name:    "a fresh ticket takes a free slot",
			slots:   map[string]int{"l": 1},
			tickets: []Queued{fresh(waiting("a"))},
			want:    SettlePlan{Admit: []Admit{{Index: 0, Slot: 0}}},
		},
		{
			name:  "limits are counted apart; an unknown limit is left alone",
			slots: map[string]int{"l": 1, "m": 1},
			tickets: []Queued{held("a", 0), in("m", waiting("b")), waiting("c"),
				in("x", expired(waiting("d"), "x"))},
			want:  SettlePlan{Admit: []Admit{{Index: 1, Slot: 0}}},
			asked: []string{"a", "c"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			asked := []string{}
			judge := func(tk store.Ticket, act bool) (string, bool) {
				if act == tc.dry {
					t.Errorf("judge asked about %s with act=%v in a dry run=%v", tk.ID, act, tc.dry)
				}
				asked = append(asked, tk.ID)
				for _, id := range tc.dead {
					if id == tk.ID {
						return "dead", true
					}
				}
				return "", false
			}
			got := PlanSettle(SettleInput{Slots: tc.slots, Tickets: tc.tickets, Judge: judge, All: tc.all, JudgeExpired: tc.expJudg, DryRun: tc.dry})
			for i, a := range got.Admit { // one limit, weight 1: Slot says it all
				if want := []int{a.Slot}; reflect.DeepEqual(a.Indexes, map[string][]int{tc.tickets[a.Index].Ticket.Limit: want}) {
					got.Admit[i].Indexes = nil
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan = %s, want %s", show(got), show(tc.want))
			}
			if tc.asked == nil {
				tc.asked = []string{}
			}
			if !reflect.DeepEqual(asked, tc.asked) {
				t.Errorf("judge asked about %v, want %v", asked, tc.asked)
			}
		})
	}
}

// Without a judge only expiry removes.
func TestPlanSettleNoJudge(t *testing.T) {
	got := PlanSettle(SettleInput{Slots: map[string]int{"l": 1}, All: true, JudgeExpired: true, Tickets: []Queued{
		{Ticket: store.Ticket{ID: "a", Limit: "l", State: store.Held}},
		{Ticket: store.Ticket{ID: "b", Limit: "l", State: store.Waiting, Slot: -1}, Expired: "gone"},
	}})
	want := SettlePlan{Remove: []Remove{{1, "gone"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("plan = %s, want %s", show(got), show(want))
	}
	if got.Empty() || !(SettlePlan{}).Empty() {
		t.Errorf("Empty is wrong")
	}
}

// An expired holder whose orphaned job runs on is kept (Keep), and its
// slot with it: the waiter behind it is not admitted beside the job. One
// the judge proves dead (a reap that killed the job) is removed, and an
// expired ticket Keep does not vouch for goes as before.
func TestPlanSettleKeep(t *testing.T) {
	tickets := []Queued{
		{Ticket: store.Ticket{ID: "orphan", Limit: "l", State: store.Held}, Expired: "expired 1s ago"},
		{Ticket: store.Ticket{ID: "late", Limit: "m", State: store.Held}, Expired: "expired 2s ago"},
		{Ticket: store.Ticket{ID: "w", Limit: "l", State: store.Waiting, Slot: -1}},
	}
	keep := func(t store.Ticket) bool { return t.ID == "orphan" }
	for _, tc := range []struct {
		name  string
		judge store.Judge
		want  SettlePlan
	}{
		{"kept", nil, SettlePlan{Remove: []Remove{{1, "expired 2s ago"}}}},
		{"killed by a reap", func(t store.Ticket, act bool) (string, bool) { return "orphaned job killed", t.ID == "orphan" && act },
			SettlePlan{Remove: []Remove{{0, "expired 1s ago; orphaned job killed"}, {1, "expired 2s ago"}}, Admit: []Admit{{Index: 2, Slot: 0, Indexes: map[string][]int{"l": {0}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanSettle(SettleInput{Slots: map[string]int{"l": 1, "m": 1}, Tickets: tickets, Judge: tc.judge, JudgeExpired: true, Keep: keep})
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan = %s, want %s", show(got), show(tc.want))
			}
		})
	}
}

func show(p SettlePlan) string { return fmt.Sprintf("remove %v admit %v", p.Remove, p.Admit) }

func TestPlanSettleSeveralLimits(t *testing.T) {
	tk := func(id string, state store.State, w int, limits ...string) Queued {
		q := Queued{Ticket: store.Ticket{ID: id, Limit: limits[0], Limits: limits, Weight: w, State: state, Slot: -1}}
		return q
	}
	held := func(q Queued, ix map[string][]int) Queued {
		q.Ticket.State, q.Ticket.Indexes = store.Held, ix
		q.Ticket.Slot = ix[q.Ticket.Limit][0]
		return q
	}
	tests := []struct {
		name    string
		slots   map[string]int
		tickets []Queued
		want    []Admit
	}{{
		name:    "atomic: room in one limit is not enough",
		slots:   map[string]int{"a": 1, "b": 1},
		tickets: []Queued{held(tk("x", store.Held, 1, "b"), map[string][]int{"b": {0}}), tk("t", store.Waiting, 1, "a", "b"), tk("u", store.Waiting, 1, "a")},
		want:    nil, // t waits for b, and u is behind t in a
	}, {
		name:    "both limits free: one admission takes both",
		slots:   map[string]int{"a": 1, "b": 2},
		tickets: []Queued{tk("t", store.Waiting, 1, "a", "b"), tk("u", store.Waiting, 1, "b")},
		want:    []Admit{{Index: 0, Slot: 0, Indexes: map[string][]int{"a": {0}, "b": {0}}}, {Index: 1, Slot: 1, Indexes: map[string][]int{"b": {1}}}},
	}, {
		name:    "a heavy head is not overtaken",
		slots:   map[string]int{"a": 4},
		tickets: []Queued{held(tk("h", store.Held, 3, "a"), map[string][]int{"a": {0, 1, 2}}), tk("heavy", store.Waiting, 2, "a"), tk("light", store.Waiting, 1, "a")},
		want:    nil,
	}, {
		name:    "weights take the lowest free indexes",
		slots:   map[string]int{"a": 4},
		tickets: []Queued{held(tk("h", store.Held, 1, "a"), map[string][]int{"a": {0}}), held(tk("i", store.Held, 1, "a"), map[string][]int{"a": {2}}), tk("w", store.Waiting, 2, "a")},
		want:    []Admit{{Index: 2, Slot: 1, Indexes: map[string][]int{"a": {1, 3}}}},
	}, {
		name:    "weight above a shrunk limit waits and blocks",
		slots:   map[string]int{"a": 1},
		tickets: []Queued{tk("w", store.Waiting, 2, "a"), tk("v", store.Waiting, 1, "a")},
		want:    nil,
	}, {
		name:  "a blocked ticket blocks only its own limits",
		slots: map[string]int{"a": 1, "b": 2, "c": 1},
		tickets: []Queued{held(tk("x", store.Held, 1, "a"), map[string][]int{"a": {0}}), tk("t", store.Waiting, 1, "a", "b"), tk("u", store.Waiting, 1, "b"),
			tk("v", store.Waiting, 1, "c")},
		want: []Admit{{Index: 3, Slot: 0, Indexes: map[string][]int{"c": {0}}}},
	}, {
		name:    "a limit the input does not size: never admitted, blocks the others",
		slots:   map[string]int{"a": 2},
		tickets: []Queued{tk("t", store.Waiting, 1, "a", "zz"), tk("u", store.Waiting, 1, "a")},
		want:    nil,
	}, {
		name:  "a removal of a ticket of two limits frees both",
		slots: map[string]int{"a": 1, "b": 1},
		tickets: []Queued{func() Queued {
			q := held(tk("x", store.Held, 1, "a", "b"), map[string][]int{"a": {0}, "b": {0}})
			q.Expired = "expired 1s ago"
			return q
		}(), tk("t", store.Waiting, 1, "a"), tk("u", store.Waiting, 1, "b")},
		want: []Admit{{Index: 1, Slot: 0, Indexes: map[string][]int{"a": {0}}}, {Index: 2, Slot: 0, Indexes: map[string][]int{"b": {0}}}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanSettle(SettleInput{Slots: tc.slots, Tickets: tc.tickets})
			if !reflect.DeepEqual(got.Admit, tc.want) {
				t.Errorf("admit = %v, want %v", got.Admit, tc.want)
			}
		})
	}
}

// A replacing ticket waits for the tickets it replaces, however much room
// there is, and blocks the tickets behind it meanwhile.
func TestPlanSettleReplaces(t *testing.T) {
	old := Queued{Ticket: store.Ticket{ID: "old", Limit: "l", State: store.Held, Slot: 0, Key: "main"}}
	repl := Queued{Ticket: store.Ticket{ID: "new", Limit: "l", State: store.Waiting, Slot: -1, Key: "main", Replaces: []string{"old"}}}
	other := Queued{Ticket: store.Ticket{ID: "other", Limit: "l", State: store.Waiting, Slot: -1}}
	got := PlanSettle(SettleInput{Slots: map[string]int{"l": 3}, Tickets: []Queued{old, repl, other}})
	if !got.Empty() {
		t.Errorf("with the replaced holder live: plan %s, want nothing", show(got))
	}
	old.Expired = "expired 1s ago"
	got = PlanSettle(SettleInput{Slots: map[string]int{"l": 3}, Tickets: []Queued{old, repl, other}})
	want := []Admit{{Index: 1, Slot: 0, Indexes: map[string][]int{"l": {0}}}, {Index: 2, Slot: 1, Indexes: map[string][]int{"l": {1}}}}
	if !reflect.DeepEqual(got.Admit, want) || len(got.Remove) != 1 {
		t.Errorf("once the replaced holder is gone: plan %s, want it removed and both admitted", show(got))
	}
	got = PlanSettle(SettleInput{Slots: map[string]int{"l": 3}, Tickets: []Queued{repl, other}})
	if len(got.Admit) != 2 {
		t.Errorf("a replaced ticket already released: plan %s, want both admitted", show(got))
	}
}

// TestPlanSettleLine: the quiet waiters that the plan leaves in line (the
// waiters whose weight ahead, after its admissions and removals, is under a
// limit's size) are listed, once, and no others.
func TestPlanSettleLine(t *testing.T) {
	held := func(id string, ix int) Queued {
		return Queued{Ticket: store.Ticket{ID: id, Limit: "l", State: store.Held, Slot: ix}}
	}
	quiet := func(id string, w int) Queued {
		return Queued{Ticket: store.Ticket{ID: id, Limit: "l", State: store.Waiting, Slot: -1, Weight: w, Quiet: true}, Quiet: true}
	}
	lined := func(id string) Queued {
		return Queued{Ticket: store.Ticket{ID: id, Limit: "l", State: store.Waiting, Slot: -1}}
	}
	for _, tc := range []struct {
		name    string
		slots   int
		tickets []Queued
		line    []int
		admit   int
	}{
		{"the next two of a full limit of two", 2, []Queued{held("h1", 0), held("h2", 1), quiet("w1", 1), quiet("w2", 1), quiet("w3", 1)}, []int{2, 3}, 0},
		{"lined already: not again", 2, []Queued{held("h1", 0), held("h2", 1), lined("w1"), quiet("w2", 1), quiet("w3", 1)}, []int{3}, 0},
		{"a heavy waiter fills the line", 2, []Queued{held("h1", 0), held("h2", 1), quiet("w1", 2), quiet("w2", 1)}, []int{2}, 0},
		{"after an admission the line moves up", 2, []Queued{held("h1", 0), quiet("w1", 1), quiet("w2", 1), quiet("w3", 1), quiet("w4", 1)}, []int{2, 3}, 1},
		{"a dead holder's removal", 1, []Queued{{Ticket: store.Ticket{ID: "h", Limit: "l", State: store.Held}, Expired: "expired 1s ago"}, quiet("w1", 1), quiet("w2", 1)}, []int{2}, 1},
		{"paused: nobody is in line", 0, []Queued{quiet("w1", 1)}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanSettle(SettleInput{Slots: map[string]int{"l": tc.slots}, Tickets: tc.tickets})
			if !reflect.DeepEqual(got.Line, tc.line) || len(got.Admit) != tc.admit {
				t.Errorf("line %v, %d admitted; want line %v, %d admitted", got.Line, len(got.Admit), tc.line, tc.admit)
			}
		})
	}
}
