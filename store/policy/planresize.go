package policy

import (
	"slices"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// The resize policy, once for every backend (docs/leases.md §2.1 item 12): a
// backend reads the held ticket and the live tickets of its limits, hands
// them to PlanResize and writes the result in the same atomic step; a shrink
// then settles the ticket's limits as a release does.

// ResizeInput is what a resize decides on.
type ResizeInput struct {
	// Ticket is the held ticket as stored: its limits, weight and indexes.
	Ticket store.Ticket
	// Weight is the weight asked for (at least 1).
	Weight int
	// Slots is the size of each of the ticket's limits, by name; a limit
	// missing here gives no room.
	Slots map[string]int
	// Tickets are the tickets of those limits (any others are ignored,
	// the ticket itself too), as the step that writes read them, each with
	// the store's verdict on its lease (Queued.Expired). An expired holder
	// still holds its slots (only its removal frees them, docs/leases.md
	// rule 2); an expired waiter waits for nothing, and blocks no growth.
	Tickets []Queued
	// MaxWeight, when above 0, bounds the weight a growth may reach (a
	// backend's own bound on a ticket's size: etcdstore's keys per ticket).
	MaxWeight int
	// Mutations is test-only (internal/mutation); nil in every real resize.
	Mutations mutation.Set
}

// PlanResize decides a resize of in.Ticket toward in.Weight and returns the
// weight it ends with and its slot indexes in each of its limits
// (ascending, weight of them). A shrink always happens and keeps the
// ticket's lowest indexes, freeing its highest. A growth takes, in every
// one of its limits at once, the lowest free indexes, as many as are free
// in all of them (never more than a limit's size holds: a limit shrunk below
// its holders, or paused, gives none), and none at all while any ticket
// whose lease runs waits in one of its limits: waiters go first, so a
// growth never overtakes the queue (docs/leases.md H4). The weight may
// therefore end anywhere between the old one and in.Weight. A growth
// decides on what it reads and removes nothing: it needs no settle, and
// sweeps nobody a reaper or a waiter would not have swept anyway.
func PlanResize(in ResizeInput) (int, map[string][]int) {
	t := in.Ticket
	cur := t.Weighs()
	want := in.Weight
	if in.MaxWeight > 0 && want > cur {
		want = max(cur, min(want, in.MaxWeight))
	}
	out := make(map[string][]int, len(t.Names()))
	if want <= cur {
		for _, name := range t.Names() {
			ix := t.In(name)
			out[name] = slices.Clone(ix[:min(want, len(ix))])
		}
		return want, out
	}
	room := want - cur
	used := make(map[string]map[int]bool, len(t.Names()))
	for _, name := range t.Names() {
		size, ok := in.Slots[name]
		if !ok {
			room = 0
			continue
		}
		used[name] = map[int]bool{}
		held := 0
		for _, q := range in.Tickets {
			o := q.Ticket
			if !slices.Contains(o.Names(), name) {
				continue
			}
			if o.State != store.Held {
				if o.ID != t.ID && q.Expired == "" && !in.Mutations.Has(mutation.ResizePastWaiter) { // mutation (test-only): a growth overtakes the queue (docs/leases.md H4)
					room = 0
				}
				continue
			}
			if o.ID == t.ID {
				continue // counted below, from the ticket as asked
			}
			held += o.Weighs()
			for _, ix := range o.In(name) {
				used[name][ix] = true
			}
		}
		held += cur
		for _, ix := range t.In(name) {
			used[name][ix] = true
		}
		if in.Mutations.Has(mutation.ResizeOverSize) { // mutation (test-only): a growth takes slots the limit does not have (docs/leases.md H5)
			size = max(size, held+room)
		}
		room = min(room, max(size-held, 0))
	}
	for _, name := range t.Names() {
		ix := slices.Clone(t.In(name))
		for next := 0; len(ix) < cur+room; next++ {
			if !used[name][next] {
				ix = append(ix, next)
			}
		}
		slices.Sort(ix)
		out[name] = ix
	}
	return cur + room, out
}
