package jobserver

import (
	"github.com/slotctl/slotctl/store"
)

// A view is what one Snapshot says about the ticket's limits, reduced to
// what the server decides on.
type view struct {
	// free is the fewest free slots in any of the ticket's limits (<= 0
	// when one is full, paused or shrunk below its holders).
	free int
	// waiting: a ticket waits in one of the limits. Nobody grows then
	// (policy.PlanResize: waiters go first).
	waiting bool
	// need is how many slots the head waiter of one of the limits still
	// lacks there (its weight less the free slots): what to give back for
	// it. 0 when no waiter lacks room in the limits this ticket shares
	// with it (it waits for another limit: giving back would not help).
	need int
	// share is this ticket's fair share: the fewest, over its limits, of
	// the limit's slots divided by its live tickets, rounded up.
	share int
	// excess is what to give back for a fairer split: the slots above its
	// share in a full limit where another holder is below the share
	// rounded down (a build that could use more), else 0.
	excess int
	// size is the smallest size of the ticket's limits.
	size int
	// gone: the snapshot does not list the ticket (released, reaped).
	gone bool
	// holders are the ids of the other held tickets (a new one resets the
	// server's backoff of rebalancing).
	holders map[string]bool
}

// look reduces snap, read for the limits of ticket me, to a view. me's own
// weight is taken from the snapshot when it lists it (it is the store's).
func look(snap store.Snapshot, me store.Ticket) view {
	v := view{free: store.MaxSlots + 1, share: store.MaxSlots + 1, size: store.MaxSlots + 1, holders: map[string]bool{}}
	weight := me.Weighs()
	v.gone = true
	for _, t := range snap.Tickets {
		if t.ID == me.ID {
			weight, v.gone = t.Weighs(), false
		}
	}
	for _, name := range me.Names() {
		var lim store.Limit
		found := false
		for _, l := range snap.Limits {
			if l.Name == name {
				lim, found = l, true
			}
		}
		if !found {
			v.free, v.share, v.size = 0, 1, 1
			continue
		}
		v.size = min(v.size, max(lim.Slots, 1))
		free := lim.Slots - lim.Held
		v.free = min(v.free, free)
		live := 0
		var head *store.Ticket
		var others []store.Ticket
		for i, t := range snap.Tickets {
			if t.Limit != name || t.Expired() {
				continue
			}
			live++
			switch {
			case t.State == store.Waiting:
				v.waiting = true
				if head == nil || t.Fence < head.Fence {
					head = &snap.Tickets[i]
				}
			case t.ID != me.ID:
				others = append(others, t)
				v.holders[t.ID] = true
			}
		}
		if head != nil {
			v.need = max(v.need, head.Weighs()-max(free, 0))
		}
		live = max(live, 1)
		share := max((lim.Slots+live-1)/live, 1)
		v.share = min(v.share, share)
		floor := lim.Slots / live
		if free <= 0 && weight > share {
			for _, t := range others {
				if t.Weighs() < floor {
					v.excess = max(v.excess, weight-share)
					break
				}
			}
		}
	}
	if v.free > store.MaxSlots {
		v.free = 0
	}
	return v
}
