package policy

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/slotctl/slotctl/store"
)

// TestPlanResizeProperties checks the resize planner's promises on random
// limits and holders (docs/leases.md §2.1 item 12): a shrink keeps the
// ticket's lowest indexes; a growth takes nothing while a ticket waits in
// one of its limits (whose lease runs), else as much as every limit has free
// (expired holders' slots are not: only a removal frees; never past a
// size, never beyond MaxWeight), the lowest free indexes, the same number
// in each limit, none held by another ticket.
func TestPlanResizeProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := []string{"a", "b", "c"}
		slots := map[string]int{}
		used := map[string]map[int]bool{}
		held := map[string]int{}
		for _, n := range names {
			slots[n] = rapid.IntRange(0, 6).Draw(t, "size "+n)
			used[n] = map[int]bool{}
		}
		// take gives a ticket of limits ls and weight w free indexes, any
		// of them (holders may hold any; a limit may have shrunk since).
		take := func(ls []string, w int) map[string][]int {
			ix := map[string][]int{}
			for _, l := range ls {
				for len(ix[l]) < w {
					i := rapid.IntRange(0, 7).Draw(t, "index")
					for used[l][i] {
						i++ // the first free one from there
					}
					used[l][i] = true
					ix[l] = append(ix[l], i)
				}
				slices.Sort(ix[l])
				held[l] += w
			}
			return ix
		}
		myLimits := rapid.SliceOfNDistinct(rapid.SampledFrom(names), 1, 3, rapid.ID).Draw(t, "my limits")
		myW := rapid.IntRange(1, 3).Draw(t, "my weight")
		me := store.Ticket{ID: "me", Limit: myLimits[0], Limits: myLimits, Weight: myW, State: store.Held, Indexes: take(myLimits, myW)}
		me.Slot = me.Indexes[myLimits[0]][0]
		var others []Queued
		waiters := map[string]bool{}
		for i := range rapid.IntRange(0, 5).Draw(t, "others") {
			ls := rapid.SliceOfNDistinct(rapid.SampledFrom(names), 1, 3, rapid.ID).Draw(t, "limits")
			w := rapid.IntRange(1, 2).Draw(t, "weight")
			o := store.Ticket{ID: fmt.Sprint(i), Limit: ls[0], Limits: ls, Weight: w, State: store.Waiting, Slot: -1}
			q := Queued{Ticket: o}
			if rapid.IntRange(0, 3).Draw(t, "expired") == 0 {
				q.Expired = "expired" // holds what it holds; waits for nothing
			}
			if rapid.Bool().Draw(t, "held") {
				q.Ticket.State, q.Ticket.Indexes = store.Held, take(ls, w)
				q.Ticket.Slot = q.Ticket.Indexes[ls[0]][0]
			} else if q.Expired == "" {
				for _, l := range ls {
					waiters[l] = true
				}
			}
			others = append(others, q)
		}
		want := rapid.IntRange(1, 9).Draw(t, "want")
		maxW := rapid.IntRange(0, 5).Draw(t, "max weight")
		w, ix := PlanResize(ResizeInput{Ticket: me, Weight: want, Slots: slots, Tickets: others, MaxWeight: maxW})
		for _, l := range myLimits {
			if len(ix[l]) != w || !slices.IsSorted(ix[l]) || len(slices.Compact(slices.Clone(ix[l]))) != w {
				t.Fatalf("weight %d with indexes %v in %q: want %d ascending distinct", w, ix[l], l, w)
			}
		}
		if len(ix) != len(myLimits) {
			t.Fatalf("indexes in %d limits, the ticket has %d", len(ix), len(myLimits))
		}
		if want <= myW {
			if w != want {
				t.Fatalf("a shrink from %d to %d ends at %d", myW, want, w)
			}
			for _, l := range myLimits {
				if !slices.Equal(ix[l], me.Indexes[l][:w]) {
					t.Fatalf("a shrink keeps %v of %v in %q: want the lowest", ix[l], me.Indexes[l], l)
				}
			}
			return
		}
		room := want - myW
		if maxW > 0 {
			room = min(room, max(maxW-myW, 0))
		}
		for _, l := range myLimits {
			if waiters[l] {
				room = 0
			}
			room = min(room, max(slots[l]-held[l], 0))
		}
		if w != myW+room {
			t.Fatalf("a growth from %d toward %d (max %d) ends at %d, want %d (sizes %v, held %v, waiters in %v)", myW, want, maxW, w, myW+room, slots, held, waiters)
		}
		for _, l := range myLimits {
			var added []int
			for _, i := range ix[l] {
				if !slices.Contains(me.Indexes[l], i) {
					added = append(added, i)
				}
			}
			for _, i := range me.Indexes[l] {
				if !slices.Contains(ix[l], i) {
					t.Fatalf("a growth gave up index %d of %q", i, l)
				}
			}
			// The lowest free ones: every index below the highest added is used.
			for i := 0; len(added) > 0 && i < added[len(added)-1]; i++ {
				if !used[l][i] && !slices.Contains(added, i) {
					t.Fatalf("growth took %v in %q, but %d was free", added, l, i)
				}
			}
			for _, i := range added {
				if used[l][i] {
					t.Fatalf("growth took index %d of %q, which is held", i, l)
				}
			}
		}
	})
}
