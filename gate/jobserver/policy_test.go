package jobserver

import (
	"reflect"
	"testing"

	"github.com/slotctl/slotctl/store"
)

// look's arithmetic on hand-made snapshots of one limit of 6.
func TestLook(t *testing.T) {
	me := store.Ticket{ID: "me", Limit: "cpu", State: store.Held, Weight: 5, Fence: 1}
	held := func(id string, w int) store.Ticket {
		return store.Ticket{ID: id, Limit: "cpu", State: store.Held, Weight: w, Fence: 2, Remaining: 1}
	}
	waiting := func(id string, w int, fence uint64) store.Ticket {
		return store.Ticket{ID: id, Limit: "cpu", State: store.Waiting, Weight: w, Fence: fence, Slot: -1, Remaining: 1}
	}
	mine := me
	mine.Remaining = 1
	snap := func(heldSlots int, tickets ...store.Ticket) store.Snapshot {
		n := 0
		for _, tk := range tickets {
			if tk.State == store.Waiting {
				n++
			}
		}
		return store.Snapshot{Limits: []store.Limit{{Name: "cpu", Slots: 6, Held: heldSlots, Waiting: n}}, Tickets: append([]store.Ticket{mine}, tickets...)}
	}
	for _, tc := range []struct {
		name string
		snap store.Snapshot
		want view
	}{
		{"alone, one free", snap(5), view{free: 1, share: 6, size: 6}},
		{"a build below its share in a full limit", snap(6, held("b", 1)), view{free: 0, share: 3, excess: 2, size: 6}},
		{"limit not full: nothing to give", snap(5, waiting("w", 1, 3)), view{free: 1, waiting: true, share: 3, size: 6}},
		{"a waiter that lacks room", snap(6, held("b", 1), waiting("w", 2, 3)), view{free: 0, waiting: true, need: 2, share: 2, excess: 3, size: 6}},
		{"the head waiter decides; the other holder is at its floor", snap(6, held("b", 1), waiting("w2", 1, 4), waiting("w1", 3, 3)),
			view{free: 0, waiting: true, need: 3, share: 2, size: 6}},
		{"gone", store.Snapshot{Limits: []store.Limit{{Name: "cpu", Slots: 6}}}, view{free: 6, share: 6, size: 6, gone: true}},
	} {
		got := look(tc.snap, me)
		got.holders = nil
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
