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
func (s *Store) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	if err := store.CheckID(t.ID); err != nil {
		return store.Ticket{}, err
	}
	if weight < 1 || weight > store.MaxSlots {
		return store.Ticket{}, fmt.Errorf("%w: weight %d: want 1..%d slots", store.ErrInvalid, weight, store.MaxSlots)
	}
	var out store.Ticket
	var lost error
	err := s.update(ctx, func(x *txn) error {
		r, ok, err := x.lookup(t.ID)
		if err != nil {
			return err
		}
		if !ok {
			err := x.notFound(t.ID)
			if !errors.Is(err, store.ErrNotFound) {
				return err
			}
			lost = fmt.Errorf("%w: %w", store.ErrLost, err)
			return nil
		}
		if r.Fence != t.Fence {
			lost = fmt.Errorf("%w: ticket %s has fence %d, not %d", store.ErrLost, t.ID, r.Fence, t.Fence)
			return nil
		}
		if ev := x.expiry(r); ev != "" {
			lost = fmt.Errorf("%w: ticket %s %s", store.ErrLost, t.ID, ev)
			return nil
		}
		if r.State != store.Held {
			return fmt.Errorf("%w: ticket %s is waiting: only a held ticket can be resized", store.ErrInvalid, t.ID)
		}
		if weight == r.weight() {
			out = x.view(r, 0)
			return nil
		}
		recs, names, err := x.gather(r.names())
		if err != nil {
			return err
		}
		if weight < r.weight() {
			w, ix := store.PlanResize(store.ResizeInput{Ticket: x.view(r, 0), Weight: weight, Mutations: x.s.mut})
			if err := x.resized(&r, w, ix); err != nil {
				return err
			}
			for i := range recs {
				if recs[i].Fence == r.Fence {
					recs[i] = r // the settle plans on what this step wrote
				}
			}
			out = x.view(r, 0)
			if x.s.mut.Has(mutation.ResizeNoSettle) { // mutation (test-only): the freed slots wait for another write (L3)
				return nil
			}
			// As a release does. The resizer is alive by definition (as a
			// renewer is): its own ticket is neither judged nor removed.
			_, _, err := x.settleOn(recs, names, false, r.ID)
			return err
		}
		in := store.ResizeInput{Ticket: x.view(r, 0), Weight: weight, Slots: map[string]int{}, Mutations: x.s.mut}
		for _, name := range r.names() {
			if lim, ok, err := x.limit(name); err != nil {
				return err
			} else if ok {
				in.Slots[name] = lim.Slots
			}
		}
		for _, o := range recs {
			in.Tickets = append(in.Tickets, store.Queued{Ticket: x.view(o, 0), Expired: x.expiry(o)})
		}
		if w, ix := store.PlanResize(in); w != r.weight() {
			if err := x.resized(&r, w, ix); err != nil {
				return err
			}
		}
		out = x.view(r, 0)
		return nil
	})
	if err == nil {
		err = lost
	}
	return out, err
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
