package policy

import (
	"context"
	"fmt"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// Resize implements [store.Store]. What a growth can take is read first,
// writing nothing, so that a growth with nothing to take (the common case
// while others wait) costs no write.
func (s *Store) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	if err := store.CheckID(t.ID); err != nil {
		return store.Ticket{}, err
	}
	if weight < 1 || weight > store.MaxSlots {
		return store.Ticket{}, fmt.Errorf("%w: weight %d: want 1..%d slots", store.ErrInvalid, weight, store.MaxSlots)
	}
	var a resizeAnswer
	err := s.view(ctx, func(x *step) error {
		var err error
		a, err = x.resize(t, weight, false)
		return err
	})
	if err == nil && a.lost == nil && a.change {
		err = s.update(ctx, func(x *step) error {
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

// resizeAnswer is what a resize tells its caller: the ticket as it is, why
// it is lost, and whether the step changes it.
type resizeAnswer struct {
	t      store.Ticket
	lost   error
	change bool
}

// resize plans a resize of t toward weight and, with write, carries it out.
func (x *step) resize(t store.Ticket, weight int, write bool) (resizeAnswer, error) {
	r, lost, err := x.lookupOwn(t)
	if err != nil || lost != nil {
		return resizeAnswer{lost: lost}, err
	}
	if ev := x.expiry(r); ev != "" {
		return resizeAnswer{lost: fmt.Errorf("%w: ticket %s %s", store.ErrLost, t.ID, ev)}, nil
	}
	if r.State != store.Held {
		return resizeAnswer{}, fmt.Errorf("%w: ticket %s is waiting: only a held ticket can be resized", store.ErrInvalid, t.ID)
	}
	switch {
	case weight == r.Weighs():
		return resizeAnswer{t: x.view(r, 0)}, nil
	case weight < r.Weighs() && !write:
		return resizeAnswer{t: x.view(r, 0), change: true}, nil // a shrink always happens
	case weight < r.Weighs():
		return x.shrink(r, weight)
	}
	in := ResizeInput{Ticket: x.view(r, 0), Weight: weight, Slots: map[string]int{}, Mutations: x.o.Mutations,
		MaxWeight: store.MaxTicketSlots / len(r.Names())}
	if x.o.MaxWeight != nil {
		in.MaxWeight = min(in.MaxWeight, x.o.MaxWeight(len(r.Names())))
	}
	seen := map[uint64]bool{}
	for _, name := range r.Names() {
		if lim, ok, err := x.tx.Limit(name); err != nil {
			return resizeAnswer{}, err
		} else if ok {
			in.Slots[name] = lim.Slots
		}
		q, err := x.tx.Queue(name)
		if err != nil {
			return resizeAnswer{}, err
		}
		for _, o := range q {
			if !seen[o.Fence] {
				seen[o.Fence] = true
				in.Tickets = append(in.Tickets, Queued{Ticket: x.view(o, 0), Expired: x.expiry(o)})
			}
		}
	}
	w, ix := PlanResize(in)
	if w == r.Weighs() {
		return resizeAnswer{t: x.view(r, 0)}, nil
	}
	if write {
		if err := x.resized(&r, w, ix); err != nil {
			return resizeAnswer{}, err
		}
	}
	return resizeAnswer{t: x.view(r, 0), change: true}, nil // unwritten: the write answers
}

// shrink frees r's highest indexes and admits, in the same step, the
// waiters that makes room for.
func (x *step) shrink(r Rec, weight int) (resizeAnswer, error) {
	recs, names, err := x.gather(r.Names())
	if err != nil {
		return resizeAnswer{}, err
	}
	w, ix := PlanResize(ResizeInput{Ticket: x.view(r, 0), Weight: weight, Mutations: x.o.Mutations})
	if err := x.resized(&r, w, ix); err != nil {
		return resizeAnswer{}, err
	}
	for i := range recs {
		if recs[i].Fence == r.Fence {
			recs[i] = r // the settle plans on what this step wrote
		}
	}
	a := resizeAnswer{t: x.view(r, 0), change: true}
	if x.o.Mutations.Has(mutation.ResizeNoSettle) { // mutation (test-only): the freed slots wait for another write
		return a, nil
	}
	_, _, err = x.settleOn(recs, names, false, r.ID)
	return a, err
}

// resized writes r at weight w with indexes ix, and logs it.
func (x *step) resized(r *Rec, w int, ix map[string][]int) error {
	r.Limits, r.Weight, r.Indexes = r.Names(), w, ix
	r.Slot = ix[r.Limit][0]
	if err := x.put(*r); err != nil {
		return err
	}
	r.Compact()
	return x.log(eventOf{kind: store.Resized}, *r)
}
