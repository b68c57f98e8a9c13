package policy

import (
	"context"
	"fmt"
	"slices"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// Enqueue implements [store.Store].
func (s *Store) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	if err := req.Check(); err != nil {
		return store.Ticket{}, err
	}
	var out store.Ticket
	var tx Tx
	more, err := s.updateMore(ctx, func(x *step) error {
		var err error
		tx = x.tx
		out, err = x.enqueue(req)
		return err
	})
	if lf, ok := tx.(LateFence); ok && err == nil {
		out.Fence = lf.Fence(out.Fence)
	}
	if more && err == nil {
		// Settled again after its step: as it stands now.
		if t, gerr := s.Get(ctx, req.ID); gerr == nil {
			out = t
		}
	}
	return out, err
}

func (x *step) enqueue(req store.EnqueueRequest) (store.Ticket, error) {
	if t, ok, err := x.tx.Tomb(req.ID); err != nil {
		return store.Ticket{}, err
	} else if ok && t.By != nil {
		return store.Ticket{}, fmt.Errorf("%w: %w", store.ErrRemoved, &store.SupersededError{ID: req.ID, By: *t.By})
	} else if ok {
		return store.Ticket{}, fmt.Errorf("%w: ticket %s was %s", store.ErrRemoved, req.ID, t.Reason)
	}
	if r, ok, err := x.tx.Lookup(req.ID); err != nil {
		return store.Ticket{}, err
	} else if ok {
		return x.viewOf(r) // a retry of a create that committed: the same ticket, unchanged
	}
	names := req.Names()
	if err := x.makeLimits(req); err != nil {
		return store.Ticket{}, err
	}
	fence, err := x.tx.NextFence()
	if err != nil {
		return store.Ticket{}, err
	}
	r := Rec{ID: req.ID, Limit: names[0], Limits: names, Weight: req.Weighs(), State: store.Waiting, Fence: fence, Slot: -1,
		TTL: req.TTL, Created: x.now.Wall, Holder: req.Holder, BellUID: x.o.BellUID, Key: req.Key,
		Priority: req.Priority, Share: req.Share,
		Quiet: x.o.Quiet, // until its settle finds it in line, or admits it
	}
	x.extend(&r, req.TTL)
	if err := x.put(r); err != nil {
		return store.Ticket{}, err
	}
	// The closure of its limits, read once: the supersede decides on these
	// very records, and the settle plans on what it leaves.
	recs, lnames, err := x.gather(names)
	if err != nil {
		return store.Ticket{}, err
	}
	if req.Supersede || req.Replace {
		if recs, err = x.supersede(recs, r, req); err != nil {
			return store.Ticket{}, err
		}
	}
	if recs, _, err = x.settleOn(recs, lnames, false, req.ID); err != nil {
		return store.Ticket{}, err
	}
	out, _ := x.viewIn(recs, req.ID)
	if req.MaxWaiting != nil && out.State == store.Waiting {
		// Refused: the error rolls back the whole step, the supersede and
		// the ticket with it.
		if err := queueFull(recs, r, *req.MaxWaiting); err != nil {
			return store.Ticket{}, err
		}
	}
	return out, nil
}

// makeLimits checks every limit of req before it creates any (a refused
// request writes nothing), then creates the missing ones with req's size.
func (x *step) makeLimits(req store.EnqueueRequest) error {
	names, w := req.Names(), req.Weighs()
	sizes := make([]int, len(names))
	made := make([]bool, len(names))
	for i, name := range names {
		lim, ok, err := x.tx.Limit(name)
		if err != nil {
			return err
		}
		if !ok {
			sizes[i], made[i] = req.SizeOf(name), true
			continue
		}
		if req.CheckSlots && lim.Slots != req.Slots {
			return &store.SlotsConflictError{Limit: name, Have: lim.Slots, Want: req.Slots}
		}
		sizes[i] = lim.Slots
	}
	for i, name := range names {
		if err := store.CheckWeightFits(name, sizes[i], w); err != nil {
			return err
		}
	}
	for i, name := range names {
		if !made[i] {
			continue
		}
		if err := x.tx.PutLimit(name, LimitRec{Slots: sizes[i], Created: x.now.Wall}); err != nil {
			return err
		}
		if err := x.tx.PutCounts(store.Counts{Limit: name}); err != nil { // a new limit counts from zero
			return err
		}
	}
	return nil
}

// queueFull refuses r, left waiting by its enqueue's settle, when one of its
// limits has max waiting tickets besides it (recs: the closure after the
// settle, r among them).
func queueFull(recs []Rec, r Rec, max int) error {
	for _, name := range r.Names() {
		n := 0
		for _, o := range recs {
			if o.State == store.Waiting && o.Fence != r.Fence && o.Has(name) {
				n++
			}
		}
		if n >= max {
			return &store.QueueFullError{Limit: name, Waiting: n, Max: max}
		}
	}
	return nil
}

// supersede carries out req.Supersede and req.Replace for r, the ticket
// just written, on recs (the closure of its limits, r among them) in the
// enqueue's own step: every older waiting ticket of r's key that shares a
// limit with it is removed as Superseded; with Replace every such held
// ticket gets a stop request naming r, and r waits for them (Replaces).
// Held tickets are never removed. It returns recs as they are now.
func (x *step) supersede(recs []Rec, r Rec, req store.EnqueueRequest) ([]Rec, error) {
	if len(req.Holder.Host) > MaxHost || !store.IsPrintable(req.Holder.Host) {
		return nil, fmt.Errorf("%w: host %q: want at most %d printable characters", store.ErrInvalid, req.Holder.Host, MaxHost)
	}
	by := store.SuccessorOf(store.Ticket{ID: r.ID, Holder: r.Holder})
	self := -1
	live := recs[:0:0]
	for _, o := range recs {
		if o.Fence == r.Fence {
			self = len(live)
			live = append(live, o)
			continue
		}
		if o.Key != r.Key || o.Fence > r.Fence || !slices.ContainsFunc(r.Names(), o.Has) {
			live = append(live, o)
			continue
		}
		held := o.State == store.Held
		if held && x.o.Mutations.Has(mutation.SupersedeHeld) { // mutation (test-only): a supersede removes a running job too
			held = false
		}
		switch {
		case !held:
			if err := x.remove(o, store.Superseded, "", &by); err != nil {
				return nil, err
			}
		case req.Replace:
			stop := by
			o.Stop = &stop // a newer replace overwrites an older one's request
			if err := x.put(o); err != nil {
				return nil, err
			}
			if err := x.log(eventOf{kind: "replaced", by: r.ID}, o); err != nil {
				return nil, err
			}
			x.tx.Ring(o) // its holder keeps its bell open while the job runs
			r.Replaces = append(r.Replaces, o.ID)
			live = append(live, o)
		default:
			live = append(live, o)
		}
	}
	if len(r.Replaces) > MaxReplaces {
		return nil, fmt.Errorf("%w: --replace would stop %d running tickets of key %q: at most %d", store.ErrInvalid, len(r.Replaces), r.Key, MaxReplaces)
	}
	if len(r.Replaces) > 0 && self >= 0 {
		me := &live[self] // as read back, so that the settle writes what it read
		me.Replaces = r.Replaces
		if err := x.put(*me); err != nil {
			return nil, err
		}
	}
	return live, nil
}
