package boltstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// Resize implements [store.Store] in one transaction (docs/leases.md §2.1
// item 12). A shrink rewrites the ticket (every copy, one per limit queue)
// with its lowest indexes and settles the closure of its limits as a
// release does, so the waiters it makes room for are admitted in the same
// step. A growth takes what store.PlanResize finds free in all of its
// limits, and writes nothing else (an expired waiter is in nobody's way;
// an expired holder's slots are freed by the sweep that removes it).
//
// A resize that changes nothing (the weight it has, a growth behind a
// waiter or in a full limit: what a jobserver asking for more finds most of
// the time) is answered by a read-only transaction: no commit, no fsync. A
// change is decided again, on the state the writing transaction reads
// (docs/leases.md rule 3).
func (s *Store) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	if err := store.CheckID(t.ID); err != nil {
		return store.Ticket{}, err
	}
	if weight < 1 || weight > store.MaxSlots {
		return store.Ticket{}, fmt.Errorf("%w: weight %d: want 1..%d slots", store.ErrInvalid, weight, store.MaxSlots)
	}
	var a resizeAnswer
	err := s.view(ctx, func(x *txn) error {
		var err error
		a, err = x.resize(t, weight, false)
		return err
	})
	if err == nil && a.lost == nil && a.change {
		err = s.update(ctx, func(x *txn) error {
			var err error
			a, err = x.resize(t, weight, true)
			return err
		})
	}
	if err == nil {
		err = a.lost
	}
	return a.t, err
}

// resizeAnswer is what a resize decides: the ticket as it now is (or, not
// written yet, would be), the ErrLost of a ticket that is not the caller's
// live one, and whether anything changes.
type resizeAnswer struct {
	t      store.Ticket
	lost   error
	change bool
}

// resize decides the resize of t toward weight on this transaction's
// state and, with write, carries it out.
func (x *txn) resize(t store.Ticket, weight int, write bool) (resizeAnswer, error) {
	r, ok, err := x.lookup(t.ID)
	if err != nil {
		return resizeAnswer{}, err
	}
	if !ok {
		err := x.notFound(t.ID)
		if !errors.Is(err, store.ErrNotFound) {
			return resizeAnswer{}, err
		}
		return resizeAnswer{lost: fmt.Errorf("%w: %w", store.ErrLost, err)}, nil
	}
	if r.Fence != t.Fence {
		return resizeAnswer{lost: fmt.Errorf("%w: ticket %s has fence %d, not %d", store.ErrLost, t.ID, r.Fence, t.Fence)}, nil
	}
	if ev := x.expiry(r); ev != "" {
		return resizeAnswer{lost: fmt.Errorf("%w: ticket %s %s", store.ErrLost, t.ID, ev)}, nil
	}
	if r.State != store.Held {
		return resizeAnswer{}, fmt.Errorf("%w: ticket %s is waiting: only a held ticket can be resized", store.ErrInvalid, t.ID)
	}
	switch {
	case weight == r.weight():
		return resizeAnswer{t: x.view(r, 0)}, nil
	case weight < r.weight() && !write:
		return resizeAnswer{t: x.view(r, 0), change: true}, nil // a shrink always happens
	case weight < r.weight():
		return x.shrink(r, weight)
	}
	in := store.ResizeInput{Ticket: x.view(r, 0), Weight: weight, Slots: map[string]int{}, Mutations: x.s.mut,
		MaxWeight: store.MaxTicketSlots / len(r.names())}
	seen := map[uint64]bool{}
	for _, name := range r.names() {
		if lim, ok, err := x.limit(name); err != nil {
			return resizeAnswer{}, err
		} else if ok {
			in.Slots[name] = lim.Slots
		}
		// Its own limits are all a growth decides on (not their closure:
		// it admits nobody), each ticket of several of them once.
		err := x.readQueue(name, func(o ticketRec, _ []byte) error {
			if !seen[o.Fence] {
				seen[o.Fence] = true
				in.Tickets = append(in.Tickets, store.Queued{Ticket: x.view(o, 0), Expired: x.expiry(o)})
			}
			return nil
		})
		if err != nil {
			return resizeAnswer{}, err
		}
	}
	w, ix := store.PlanResize(in)
	if w == r.weight() {
		return resizeAnswer{t: x.view(r, 0)}, nil
	}
	if write {
		if err := x.resized(&r, w, ix); err != nil {
			return resizeAnswer{}, err
		}
	}
	return resizeAnswer{t: x.view(r, 0), change: true}, nil // unwritten: the write answers
}

// shrink shrinks held ticket r to weight, keeping its lowest indexes, and
// settles the closure of its limits as a release does.
func (x *txn) shrink(r ticketRec, weight int) (resizeAnswer, error) {
	recs, names, err := x.gather(r.names())
	if err != nil {
		return resizeAnswer{}, err
	}
	w, ix := store.PlanResize(store.ResizeInput{Ticket: x.view(r, 0), Weight: weight, Mutations: x.s.mut})
	if err := x.resized(&r, w, ix); err != nil {
		return resizeAnswer{}, err
	}
	for i := range recs {
		if recs[i].Fence == r.Fence {
			recs[i] = r // the settle plans on what this step wrote
		}
	}
	a := resizeAnswer{t: x.view(r, 0), change: true}
	if x.s.mut.Has(mutation.ResizeNoSettle) { // mutation (test-only): the freed slots wait for another write (L3)
		return a, nil
	}
	// The resizer is alive by definition (as a renewer is): its own ticket
	// is neither judged nor removed.
	_, _, err = x.settleOn(recs, names, false, r.ID)
	return a, err
}

// resized rewrites held ticket r with weight w and slot indexes ix (w of
// them in each of its limits), the same bytes in the queue of each, and
// logs a store.Resized event in each limit with the new weight.
func (x *txn) resized(r *ticketRec, w int, ix map[string][]int) error {
	r.Limits, r.Weight, r.Indexes = r.names(), w, ix
	r.Slot = ix[r.Limit][0]
	if err := x.putTicket(*r); err != nil {
		return err
	}
	if len(r.Limits) == 1 && w == 1 {
		// Stored as a ticket of one limit and weight 1 is (putTicket): its
		// slot its index, and so in memory too, as a read would give it.
		r.Limits, r.Weight, r.Indexes = nil, 0, nil
	}
	return x.event(store.Resized, *r, "")
}
