package policy

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/slotctl/slotctl/store"
)

// TestPlanSettleProperties checks the planner's promises on random queues of
// tickets of several limits and weights: no limit over its size, no index
// taken twice, admission all-or-nothing, strict FIFO across limits, and
// liveness (a waiter that no older waiter blocks and that fits is admitted).
func TestPlanSettleProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := []string{"a", "b", "c", "d"}
		slots := map[string]int{}
		for _, n := range names {
			slots[n] = rapid.IntRange(0, 4).Draw(t, "size "+n)
		}
		used := map[string]map[int]bool{}
		heldSlots := map[string]int{}
		for _, n := range names {
			used[n] = map[int]bool{}
		}
		var in []Queued
		count := rapid.IntRange(0, 12).Draw(t, "tickets")
		for i := range count {
			ls := rapid.SliceOfNDistinct(rapid.SampledFrom(names), 1, 3, rapid.ID).Draw(t, "limits")
			w := rapid.IntRange(1, 3).Draw(t, "weight")
			q := Queued{Ticket: store.Ticket{ID: fmt.Sprint(i), Limit: ls[0], Limits: ls, Weight: w, State: store.Waiting, Slot: -1}}
			if rapid.Bool().Draw(t, "held") {
				// A holder that fitted when it was admitted.
				ix := map[string][]int{}
				ok := true
				for _, l := range ls {
					if heldSlots[l]+w > slots[l] {
						ok = false
					}
				}
				if ok {
					for _, l := range ls {
						for j := 0; len(ix[l]) < w; j++ {
							if !used[l][j] {
								used[l][j] = true
								ix[l] = append(ix[l], j)
							}
						}
						heldSlots[l] += w
					}
					q.Ticket.State, q.Ticket.Indexes, q.Ticket.Slot = store.Held, ix, ix[ls[0]][0]
				}
			}
			if rapid.IntRange(0, 5).Draw(t, "expired") == 0 {
				q.Expired = "expired"
			}
			in = append(in, q)
		}
		plan := PlanSettle(SettleInput{Slots: slots, Tickets: in})
		gone := map[int]bool{}
		for _, r := range plan.Remove {
			if in[r.Index].Expired == "" {
				t.Fatalf("removed live ticket %d", r.Index)
			}
			gone[r.Index] = true
		}
		for i, q := range in {
			if q.Expired != "" && !gone[i] {
				t.Fatalf("expired ticket %d kept", i)
			}
		}
		admitted := map[int]Admit{}
		for _, a := range plan.Admit {
			admitted[a.Index] = a
		}
		// After the plan: held slots and indexes per limit.
		after := map[string]map[int]int{} // limit -> index -> ticket
		load := map[string]int{}
		for _, n := range names {
			after[n] = map[int]int{}
		}
		take := func(i int, l string, ix []int, w int) {
			if len(ix) != w {
				t.Fatalf("ticket %d holds %v in %s, weight %d", i, ix, l, w)
			}
			for _, x := range ix {
				if other, dup := after[l][x]; dup {
					t.Fatalf("index %d of %s held by %d and %d", x, l, other, i)
				}
				after[l][x] = i
			}
			load[l] += w
		}
		for i, q := range in {
			if gone[i] {
				continue
			}
			if q.Ticket.State == store.Held {
				for _, l := range q.Ticket.Names() {
					take(i, l, q.Ticket.In(l), q.Ticket.Weighs())
				}
			} else if a, ok := admitted[i]; ok {
				if len(a.Indexes) != len(q.Ticket.Names()) {
					t.Fatalf("ticket %d admitted to %v of %v", i, a.Indexes, q.Ticket.Names())
				}
				for _, l := range q.Ticket.Names() {
					take(i, l, a.Indexes[l], q.Ticket.Weighs())
					if slices.Max(a.Indexes[l]) >= slots[l] {
						t.Fatalf("ticket %d takes index %v of %s, size %d", i, a.Indexes[l], l, slots[l])
					}
				}
			}
		}
		for _, l := range names {
			if load[l] > max(slots[l], heldSlots[l]) {
				t.Fatalf("limit %s: %d slots held of %d", l, load[l], slots[l])
			}
		}
		// FIFO and liveness, in queue order.
		waitingIn := map[string]bool{} // an older waiter (not admitted) waits here
		for i, q := range in {
			if gone[i] || q.Ticket.State == store.Held {
				continue
			}
			_, ok := admitted[i]
			blocked := false
			for _, l := range q.Ticket.Names() {
				blocked = blocked || waitingIn[l]
			}
			if ok && blocked {
				t.Fatalf("ticket %d admitted past an older waiter", i)
			}
			if !ok && !blocked {
				// Nobody older waits in its limits: it must be short of room.
				room := true
				for _, l := range q.Ticket.Names() {
					room = room && load[l]+q.Ticket.Weighs() <= slots[l]
				}
				if room {
					t.Fatalf("ticket %d fits and no older ticket waits in its limits, yet was not admitted", i)
				}
			}
			if !ok {
				for _, l := range q.Ticket.Names() {
					waitingIn[l] = true
				}
			}
		}
	})
}

// propLimits are the limits the policy properties draw tickets of.
var propLimits = []string{"a", "b", "c", "d"}

// propAgings are the agings they draw: the default, and short ones that
// reorder waiters within the few minutes a case spans.
var propAgings = []time.Duration{0, time.Second, 10 * time.Second}

// drawPolicies draws each limit's policy. mode "priority" orders every
// limit by priority with one aging, "fair" makes every limit fair, "fifo"
// keeps ticket order everywhere (spelled "" or "fifo", with an aging that
// must not matter), "mixed" draws each limit's order. rated draws rates.
func drawPolicies(t *rapid.T, mode string, rated bool) map[string]store.Policy {
	aging := rapid.SampledFrom(propAgings).Draw(t, "aging")
	pols := map[string]store.Policy{}
	for _, n := range propLimits {
		var p store.Policy
		switch mode {
		case "priority":
			p.Order, p.Aging = store.ByPriority, aging
		case "fair":
			p.Order = store.Fair
		case "fifo":
			p.Order = rapid.SampledFrom([]store.Order{"", store.FIFO}).Draw(t, "fifo "+n)
			p.Aging = rapid.SampledFrom(propAgings).Draw(t, "aging "+n)
		default:
			p.Order = rapid.SampledFrom([]store.Order{"", store.ByPriority, store.Fair}).Draw(t, "order "+n)
			if p.Order == store.ByPriority {
				p.Aging = rapid.SampledFrom(propAgings).Draw(t, "aging "+n)
			}
		}
		if rated && rapid.Bool().Draw(t, "rated "+n) {
			p.Rate = store.Rate{N: rapid.IntRange(1, 3).Draw(t, "rate "+n), Per: time.Duration(rapid.IntRange(5, 30).Draw(t, "per "+n)) * time.Second}
		}
		pols[n] = p
	}
	return pols
}

// propQueue is a store's state as the policy properties evolve it: the
// tickets in fence order, the rated limits' starts, the clock.
type propQueue struct {
	slots   map[string]int
	pols    map[string]store.Policy
	starts  map[string][]time.Time
	now     time.Time
	tickets []Queued
	n       int // tickets ever added, for ids
}

func newPropQueue(slots map[string]int, pols map[string]store.Policy) *propQueue {
	return &propQueue{slots: slots, pols: pols, starts: map[string][]time.Time{}, now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
}

// add draws a ticket created now: its limits, weight up to maxWeight,
// priority and share; held (seated at the lowest free indexes) when asked
// and it fits beside the holders, expired when asked.
func (q *propQueue) add(t *rapid.T, maxWeight int, held, expired bool) {
	ls := rapid.SliceOfNDistinct(rapid.SampledFrom(propLimits), 1, 3, rapid.ID).Draw(t, "limits")
	w := rapid.IntRange(1, maxWeight).Draw(t, "weight")
	tk := store.Ticket{ID: fmt.Sprint(q.n), Limit: ls[0], Limits: ls, Weight: w, State: store.Waiting, Slot: -1,
		Fence: uint64(q.n + 1), Created: q.now,
		Priority: rapid.IntRange(-5, 5).Draw(t, "priority"), Share: rapid.SampledFrom([]string{"s", "t", "u"}).Draw(t, "share")}
	q.n++
	if held {
		used, load := q.used()
		fits := true
		for _, l := range ls {
			fits = fits && load[l]+w <= q.slots[l]
		}
		if fits {
			tk.Indexes = map[string][]int{}
			for _, l := range ls {
				for j := 0; len(tk.Indexes[l]) < w; j++ {
					if !used[l][j] {
						tk.Indexes[l] = append(tk.Indexes[l], j)
					}
				}
			}
			tk.State, tk.Slot, tk.Admitted = store.Held, tk.Indexes[ls[0]][0], q.now
		}
	}
	qd := Queued{Ticket: tk}
	if expired {
		qd.Expired = "expired"
	}
	q.tickets = append(q.tickets, qd)
}

// used is the indexes held in each limit, and the slots.
func (q *propQueue) used() (map[string]map[int]bool, map[string]int) {
	used, load := map[string]map[int]bool{}, map[string]int{}
	for _, n := range propLimits {
		used[n] = map[int]bool{}
	}
	for _, qd := range q.tickets {
		if qd.Ticket.State != store.Held {
			continue
		}
		for _, l := range qd.Ticket.Names() {
			for _, x := range qd.Ticket.In(l) {
				used[l][x] = true
			}
			load[l] += qd.Ticket.Weighs()
		}
	}
	return used, load
}

func (q *propQueue) input() SettleInput {
	return SettleInput{Slots: q.slots, Policies: q.pols, Starts: q.starts, Now: q.now, Tickets: slices.Clone(q.tickets)}
}

// apply makes the plan's admissions, removals and starts the queue's.
func (q *propQueue) apply(plan SettlePlan) {
	for _, a := range plan.Admit {
		tk := &q.tickets[a.Index].Ticket
		tk.State, tk.Indexes, tk.Slot, tk.Admitted = store.Held, a.Indexes, a.Slot, q.now
	}
	gone := map[int]bool{}
	for _, r := range plan.Remove {
		gone[r.Index] = true
	}
	var keep []Queued
	for i, qd := range q.tickets {
		if !gone[i] {
			keep = append(keep, qd)
		}
	}
	q.tickets = keep
	for n, st := range plan.Starts {
		q.starts[n] = st
	}
}

// checkPlan checks what every plan promises, whatever the policies: the
// expired tickets removed and only they, each admission to all of the
// ticket's limits at indexes within its size, never one index
// twice, no limit over its size; each rated limit admits no more than its
// rate allows, and its new starts count each admission once.
func checkPlan(t *rapid.T, in SettleInput, plan SettlePlan) {
	gone := map[int]bool{}
	for _, r := range plan.Remove {
		if in.Tickets[r.Index].Expired == "" {
			t.Fatalf("removed live ticket %d", r.Index)
		}
		gone[r.Index] = true
	}
	for i, qd := range in.Tickets {
		if qd.Expired != "" && !gone[i] {
			t.Fatalf("expired ticket %d kept", i)
		}
	}
	after := map[string]map[int]int{}
	load, admitted := map[string]int{}, map[string]int{}
	take := func(i int, l string, ix []int, w int) {
		if len(ix) != w {
			t.Fatalf("ticket %d holds %v in %s, weight %d", i, ix, l, w)
		}
		if after[l] == nil {
			after[l] = map[int]int{}
		}
		for _, x := range ix {
			if other, dup := after[l][x]; dup {
				t.Fatalf("index %d of %s held by %d and %d", x, l, other, i)
			}
			after[l][x] = i
		}
		load[l] += w
	}
	for _, a := range plan.Admit {
		qd := in.Tickets[a.Index]
		if gone[a.Index] || qd.Ticket.State == store.Held {
			t.Fatalf("admitted ticket %d, which is %s (removed %v)", a.Index, qd.Ticket.State, gone[a.Index])
		}
		if len(a.Indexes) != len(qd.Ticket.Names()) {
			t.Fatalf("ticket %d admitted to %v of %v", a.Index, a.Indexes, qd.Ticket.Names())
		}
		for _, l := range qd.Ticket.Names() {
			take(a.Index, l, a.Indexes[l], qd.Ticket.Weighs())
			if slices.Max(a.Indexes[l]) >= in.Slots[l] {
				t.Fatalf("ticket %d takes indexes %v of %s, size %d", a.Index, a.Indexes[l], l, in.Slots[l])
			}
			admitted[l]++
		}
	}
	for i, qd := range in.Tickets {
		if !gone[i] && qd.Ticket.State == store.Held {
			for _, l := range qd.Ticket.Names() {
				take(i, l, qd.Ticket.In(l), qd.Ticket.Weighs())
			}
		}
	}
	for l, n := range load {
		if n > in.Slots[l] {
			t.Fatalf("limit %s: %d slots held of %d", l, n, in.Slots[l])
		}
	}
	for l, pol := range in.Policies {
		tokens := pol.Tokens(in.Starts[l], in.Now)
		if tokens >= 0 && admitted[l] > tokens {
			t.Fatalf("limit %s (rate %s): %d admitted with %d admissions left", l, pol.Rate, admitted[l], tokens)
		}
		st, charged := plan.Starts[l]
		switch {
		case admitted[l] == 0 || pol.Rate.N == 0:
			if charged {
				t.Fatalf("limit %s (rate %s): starts %v after %d admissions", l, pol.Rate, st, admitted[l])
			}
		case len(st) != min(pol.Rate.N, len(pol.InWindow(in.Starts[l], in.Now))+admitted[l]) || !st[len(st)-1].Equal(in.Now):
			t.Fatalf("limit %s (rate %s, starts %v at %v): %d admitted, new starts %v; want one per admission, at now", l, pol.Rate, in.Starts[l], in.Now, admitted[l], st)
		}
	}
}

// checkOrderKept checks that when the limits' orders agree (one order of
// all the waiters keeps each limit's), no waiter is admitted while one
// ahead of it in one of its limits still waits. It returns whether they
// agreed. Each limit's order is its policy's at now among the tickets the
// plan keeps.
func checkOrderKept(t *rapid.T, in SettleInput, plan SettlePlan) bool {
	gone := map[int]bool{}
	for _, r := range plan.Remove {
		gone[r.Index] = true
	}
	admitted := map[int]bool{}
	for _, a := range plan.Admit {
		admitted[a.Index] = true
	}
	var seqs [][]int
	for _, l := range propLimits {
		var held, waiting []*store.Ticket
		var idx []int
		for i := range in.Tickets {
			tk := &in.Tickets[i].Ticket
			if gone[i] || !slices.Contains(tk.Names(), l) {
				continue
			}
			if tk.State == store.Held {
				held = append(held, tk)
			} else {
				waiting, idx = append(waiting, tk), append(idx, i)
			}
		}
		var seq []int
		for _, j := range in.Policies[l].Arrange(held, waiting, in.Now) {
			seq = append(seq, idx[j])
		}
		seqs = append(seqs, seq)
	}
	// The orders agree when "a before b" in any of them has no cycle.
	before := map[int][]int{}
	indeg := map[int]int{}
	for _, seq := range seqs {
		for k := 1; k < len(seq); k++ {
			before[seq[k-1]] = append(before[seq[k-1]], seq[k])
			indeg[seq[k]]++
		}
	}
	var ready []int
	nodes := map[int]bool{}
	for _, seq := range seqs {
		for _, i := range seq {
			if !nodes[i] && indeg[i] == 0 {
				ready = append(ready, i)
			}
			nodes[i] = true
		}
	}
	placed := 0
	for len(ready) > 0 {
		i := ready[0]
		ready = ready[1:]
		placed++
		for _, j := range before[i] {
			if indeg[j]--; indeg[j] == 0 {
				ready = append(ready, j)
			}
		}
	}
	if placed < len(nodes) {
		return false
	}
	for si, seq := range seqs {
		for k, i := range seq {
			if !admitted[i] {
				continue
			}
			for _, j := range seq[:k] {
				if !admitted[j] {
					t.Fatalf("ticket %d admitted while %d, ahead of it in %s (%s), waits", i, j, propLimits[si], in.Policies[propLimits[si]])
				}
			}
		}
	}
	return true
}

// checkLive checks that a settle with nobody held, waiters that each fit
// their limits' sizes and no rate spent admits somebody: no set of waiters
// deadlocks, whatever the orders.
func checkLive(t *rapid.T, in SettleInput, plan SettlePlan) {
	gone := map[int]bool{}
	for _, r := range plan.Remove {
		gone[r.Index] = true
	}
	waiters := 0
	for i, qd := range in.Tickets {
		if gone[i] {
			continue
		}
		if qd.Ticket.State == store.Held {
			return
		}
		for _, l := range qd.Ticket.Names() {
			if qd.Ticket.Weighs() > in.Slots[l] || in.Policies[l].Tokens(in.Starts[l], in.Now) == 0 {
				return
			}
		}
		waiters++
	}
	if waiters > 0 && len(plan.Admit) == 0 {
		t.Fatalf("%d waiters, nothing held, each fits and no rate is spent, yet nobody admitted", waiters)
	}
}

// TestPlanSettlePolicyProperties checks one settle of a random queue under
// random policies (each order, weights, several limits, rates): what every
// plan promises (checkPlan); where the limits' orders agree, always so when
// all are priority limits of one aging, no waiter passes one ahead of it
// (checkOrderKept); and no deadlock (checkLive).
func TestPlanSettlePolicyProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		mode := rapid.SampledFrom([]string{"mixed", "priority", "fair"}).Draw(t, "mode")
		slots := map[string]int{}
		for _, n := range propLimits {
			slots[n] = rapid.IntRange(0, 4).Draw(t, "size "+n)
		}
		q := newPropQueue(slots, drawPolicies(t, mode, rapid.Bool().Draw(t, "rates")))
		for _, n := range propLimits {
			if p := q.pols[n]; p.Rate.N > 0 {
				for range rapid.IntRange(0, p.Rate.N).Draw(t, "starts "+n) {
					q.starts[n] = append(q.starts[n], q.now.Add(time.Duration(rapid.IntRange(0, 40).Draw(t, "start"))*time.Second))
				}
				slices.SortFunc(q.starts[n], func(a, b time.Time) int { return a.Compare(b) })
			}
		}
		nobody := rapid.IntRange(0, 3).Draw(t, "nobody held") == 0
		for range rapid.IntRange(0, 12).Draw(t, "tickets") {
			q.now = q.now.Add(time.Duration(rapid.IntRange(0, 20).Draw(t, "gap")) * time.Second)
			q.add(t, 3, !nobody && rapid.Bool().Draw(t, "held"), rapid.IntRange(0, 5).Draw(t, "expired") == 0)
		}
		q.now = q.now.Add(time.Duration(rapid.IntRange(0, 120).Draw(t, "wait")) * time.Second)
		in := q.input()
		plan := PlanSettle(in)
		checkPlan(t, in, plan)
		if agreed := checkOrderKept(t, in, plan); !agreed && mode == "priority" {
			t.Fatalf("priority limits of one aging disagree on the order of their waiters")
		}
		checkLive(t, in, plan)
	})
}

// TestPlanSettleRateWindows settles a queue again and again at increasing
// times, holders leaving and waiters coming between settles, each settle's
// starts written back as a backend does: no rated limit ever admits more
// than its N in any window of its length; every settle keeps checkPlan's
// promises and checkLive's; and in the end, holders released and time
// passing, everyone is admitted.
func TestPlanSettleRateWindows(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		mode := rapid.SampledFrom([]string{"mixed", "priority", "fair"}).Draw(t, "mode")
		slots := map[string]int{}
		for _, n := range propLimits {
			slots[n] = rapid.IntRange(3, 4).Draw(t, "size "+n)
		}
		q := newPropQueue(slots, drawPolicies(t, mode, true))
		admissions := map[string][]time.Time{}
		settle := func() {
			in := q.input()
			plan := PlanSettle(in)
			checkPlan(t, in, plan)
			checkOrderKept(t, in, plan)
			checkLive(t, in, plan)
			for _, a := range plan.Admit {
				for _, l := range in.Tickets[a.Index].Ticket.Names() {
					if q.pols[l].Rate.N > 0 {
						admissions[l] = append(admissions[l], q.now)
					}
				}
			}
			q.apply(plan)
		}
		for range rapid.IntRange(1, 10).Draw(t, "steps") {
			q.now = q.now.Add(time.Duration(rapid.IntRange(0, 15).Draw(t, "gap")) * time.Second)
			var keep []Queued
			for _, qd := range q.tickets {
				if qd.Ticket.State != store.Held || !rapid.Bool().Draw(t, "release") {
					keep = append(keep, qd)
				}
			}
			q.tickets = keep
			for range rapid.IntRange(0, 3).Draw(t, "arrivals") {
				q.add(t, 3, false, false)
			}
			settle()
		}
		// Drain: release everyone held, let every window slide.
		left := len(q.tickets)
		for round := 0; slices.ContainsFunc(q.tickets, func(qd Queued) bool { return qd.Ticket.State != store.Held }); round++ {
			if round > left {
				t.Fatalf("after %d rounds of releases, tickets still wait", round)
			}
			var waiting []Queued
			for _, qd := range q.tickets {
				if qd.Ticket.State != store.Held {
					waiting = append(waiting, qd)
				}
			}
			q.tickets = waiting
			q.now = q.now.Add(31 * time.Second)
			settle()
		}
		for l, ts := range admissions {
			r := q.pols[l].Rate
			for i := range ts {
				in := 0
				for _, u := range ts[:i+1] {
					if ts[i].Sub(u) < r.Per {
						in++
					}
				}
				if in > r.N {
					t.Fatalf("limit %s (rate %s): %d admissions in the %v up to %v (%v)", l, r, in, r.Per, ts[i], ts)
				}
			}
		}
	})
}

// TestPlanSettleFIFOIsPlain checks that limits that are all FIFO without
// a rate, however spelled and whatever their aging, plan exactly as with
// no policies at all, priorities, shares and clock notwithstanding.
func TestPlanSettleFIFOIsPlain(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		slots := map[string]int{}
		for _, n := range propLimits {
			slots[n] = rapid.IntRange(0, 4).Draw(t, "size "+n)
		}
		q := newPropQueue(slots, drawPolicies(t, "fifo", false))
		for range rapid.IntRange(0, 12).Draw(t, "tickets") {
			q.now = q.now.Add(time.Duration(rapid.IntRange(0, 20).Draw(t, "gap")) * time.Second)
			q.add(t, 3, rapid.Bool().Draw(t, "held"), rapid.IntRange(0, 5).Draw(t, "expired") == 0)
		}
		q.now = q.now.Add(time.Hour)
		in := q.input()
		got := PlanSettle(in)
		in.Policies, in.Starts, in.Now = nil, nil, time.Time{}
		if want := PlanSettle(in); !reflect.DeepEqual(got, want) {
			t.Fatalf("with FIFO policies %v: plan %+v; with none: %+v", q.pols, got, want)
		}
	})
}
