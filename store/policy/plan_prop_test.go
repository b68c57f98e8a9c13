package policy

import (
	"fmt"
	"slices"
	"testing"

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
