package store

import (
	"reflect"
	"slices"
	"testing"
)

func TestSnapshotAddLimit(t *testing.T) {
	var s Snapshot
	in := []Ticket{
		{ID: "w2", State: Waiting, Fence: 5, Slot: -1},
		{ID: "h", State: Held, Fence: 3},
		{ID: "w1", State: Waiting, Fence: 1, Slot: -1},
	}
	kept := slices.Clone(in)
	s.AddLimit(Limit{Name: "a", Slots: 1, Held: 9}, in)
	s.AddLimit(Limit{Name: "b"}, nil)
	if !reflect.DeepEqual(in, kept) {
		t.Errorf("AddLimit changed the caller's tickets: %+v, was %+v", in, kept)
	}
	var ids []string
	var pos []int
	for _, tk := range s.Tickets {
		ids, pos = append(ids, tk.ID), append(pos, tk.Position)
	}
	if want := []string{"h", "w1", "w2"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("tickets %v, want %v: held first, then waiting, each by fence", ids, want)
	}
	if want := []int{0, 1, 2}; !reflect.DeepEqual(pos, want) {
		t.Errorf("positions %v, want %v", pos, want)
	}
	if want := []Limit{{Name: "a", Slots: 1, Held: 1, Waiting: 2}, {Name: "b"}}; !reflect.DeepEqual(s.Limits, want) {
		t.Errorf("limits %+v, want %+v", s.Limits, want)
	}
}
