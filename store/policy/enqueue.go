package policy

import (
	"cmp"
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
	if req.Supersede && s.o.Mutations.Has(mutation.SupersedeFirst) { // mutation (test-only): the supersede in a step of its own, first
		if err := s.update(ctx, func(x *step) error { return x.mutSupersedeFirst(req) }); err != nil {
			return store.Ticket{}, err
		}
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
	if t, ok, err := x.existing(req.ID); err != nil || ok {
		return t, err
	}
	if err := x.makeLimits(req); err != nil {
		return store.Ticket{}, err
	}
	r, err := x.newTicket(req)
	if err != nil {
		return store.Ticket{}, err
	}
	// The closure of its limits, read once: the supersede decides on these
	// very records, and the settle plans on what it leaves.
	recs, lnames, err := x.gather(req.Names())
	if err != nil {
		return store.Ticket{}, err
	}
	if req.Supersede || req.Replace {
		if recs, err = x.supersede(recs, r, req); err != nil || x.full {
			if err != nil {
				return store.Ticket{}, err
			}
			return x.superseding(recs, lnames, r, req)
		}
	}
	settled, _, err := x.settleOn(recs, lnames, false, req.ID)
	if err != nil {
		return store.Ticket{}, err
	}
	out, _ := x.viewIn(settled, req.ID)
	switch {
	case req.MaxWaiting == nil:
		return out, nil
	case x.full:
		// Cut short: refused or not on the whole settle's plan.
		return out, x.queueFullPlanned(recs, lnames, r, *req.MaxWaiting)
	case out.State == store.Waiting:
		// Refused: the error rolls back the whole step, the supersede and
		// the ticket with it.
		return out, queueFull(settled, r, *req.MaxWaiting)
	}
	return out, nil
}

// existing answers an enqueue of an id the store has seen: refused once
// removed, the same ticket, unchanged, while live (a retry of a create
// that committed). ok is false for a new id.
func (x *step) existing(id string) (store.Ticket, bool, error) {
	if t, ok, err := x.tx.Tomb(id); err != nil {
		return store.Ticket{}, true, err
	} else if ok && t.By != nil {
		return store.Ticket{}, true, fmt.Errorf("%w: %w", store.ErrRemoved, &store.SupersededError{ID: id, By: *t.By})
	} else if ok {
		return store.Ticket{}, true, fmt.Errorf("%w: ticket %s was %s", store.ErrRemoved, id, t.Reason)
	}
	r, ok, err := x.tx.Lookup(id)
	if err != nil || !ok {
		return store.Ticket{}, ok, err
	}
	t, err := x.viewOf(r)
	return t, true, err
}

// newTicket writes req's ticket, waiting.
func (x *step) newTicket(req store.EnqueueRequest) (Rec, error) {
	fence, err := x.tx.NextFence()
	if err != nil {
		return Rec{}, err
	}
	names := req.Names()
	r := Rec{ID: req.ID, Limit: names[0], Limits: names, Weight: req.Weighs(), State: store.Waiting, Fence: fence, Slot: -1,
		TTL: req.TTL, Created: x.now.Wall, Holder: req.Holder, BellUID: x.o.BellUID, Key: req.Key,
		Priority: req.Priority, Share: req.Share,
		Quiet: x.o.Quiet, // until its settle finds it in line, or admits it
	}
	x.extend(&r, req.TTL)
	return r, x.put(r)
}

// superseding answers an enqueue whose supersede did not fit in its step:
// its ticket is written, marked, and the settles after this step carry the
// supersede on before they admit. Max-waiting counts its limits as they
// will be, without the waiters it supersedes.
func (x *step) superseding(recs []Rec, lnames []string, r Rec, req store.EnqueueRequest) (store.Ticket, error) {
	x.more = lnames
	out, _ := x.viewIn(recs, req.ID)
	if req.MaxWaiting == nil {
		return out, nil
	}
	left := slices.DeleteFunc(slices.Clone(recs), func(o Rec) bool { return o.ID != r.ID && x.supersedes(r, o) })
	return out, queueFull(left, r, *req.MaxWaiting)
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

// queueFullPlanned is queueFull on what the settle of recs (the closure
// names, before the settle) plans, for a step that could not carry it all
// out: r admitted is never refused.
func (x *step) queueFullPlanned(recs []Rec, names []string, r Rec, max int) error {
	in, err := x.planInput(recs, names)
	if err != nil {
		return err
	}
	for i := range in.Tickets {
		in.Tickets[i].Fresh = in.Tickets[i].Ticket.ID == r.ID
	}
	plan := PlanSettle(in)
	out := make([]bool, len(recs))
	for _, a := range plan.Admit {
		if recs[a.Index].ID == r.ID {
			return nil
		}
		out[a.Index] = true
	}
	for _, rm := range plan.Remove {
		out[rm.Index] = true
	}
	left := recs[:0:0]
	for i, o := range recs {
		if !out[i] {
			left = append(left, o)
		}
	}
	return queueFull(left, r, max)
}

// supersede carries out req.Supersede and req.Replace for r, the ticket
// just written, on recs (the closure of its limits, r among them) in the
// enqueue's own step: every older waiting ticket of r's key that shares a
// limit with it is removed as Superseded; with Replace every such held
// ticket gets a stop request naming r, and r waits for them (Replaces).
// Held tickets are never removed. It returns recs as they are now.
//
// On a backend whose steps are bounded (Bounded) and too small for all of
// it, r is written marked (Rec.Superseding) with its whole Replaces, the
// stop requests first, then as many removals as fit: the settles after
// carry on (carryOn) and admit none of those waiters meanwhile. Whichever
// step fails, no run is stopped or superseded for a ticket that was never
// written.
func (x *step) supersede(recs []Rec, r Rec, req store.EnqueueRequest) ([]Rec, error) {
	if len(req.Holder.Host) > MaxHost || !store.IsPrintable(req.Holder.Host) {
		return nil, fmt.Errorf("%w: host %q: want at most %d printable characters", store.ErrInvalid, req.Holder.Host, MaxHost)
	}
	by := store.SuccessorOf(store.Ticket{ID: r.ID, Holder: r.Holder})
	self, stop, drop := x.keyed(recs, r, req.Replace)
	for _, i := range stop {
		r.Replaces = append(r.Replaces, recs[i].ID)
	}
	if len(r.Replaces) > MaxReplaces {
		return nil, fmt.Errorf("%w: --replace would stop %d running tickets of key %q: at most %d", store.ErrInvalid, len(r.Replaces), r.Key, MaxReplaces)
	}
	gone := make([]bool, len(recs))
	for _, i := range stop {
		if x.full = !x.fits(recs[i]); x.full {
			break
		}
		if err := x.stop(&recs[i], by); err != nil {
			return nil, err
		}
	}
	for _, i := range drop {
		if x.full = x.full || !x.fits(recs[i]); x.full {
			break
		}
		if err := x.remove(recs[i], store.Superseded, "", &by); err != nil {
			return nil, err
		}
		gone[i] = true
	}
	if (len(r.Replaces) > 0 || x.full) && self >= 0 {
		me := &recs[self] // as read back, so that the settle writes what it read
		me.Replaces, me.Superseding = r.Replaces, x.full
		if err := x.put(*me); err != nil {
			return nil, err
		}
	}
	return x.unapplied(recs, gone), nil
}

// keyed finds in recs r itself (self) and the older tickets of r's key
// sharing one of its limits: the held ones a replace asks to stop, the
// waiting ones it removes.
func (x *step) keyed(recs []Rec, r Rec, replace bool) (self int, stop, drop []int) {
	self = -1
	for i, o := range recs {
		if o.Fence == r.Fence {
			self = i
			continue
		}
		if o.Key != r.Key || o.Fence > r.Fence || !slices.ContainsFunc(r.Names(), o.Has) {
			continue
		}
		held := o.State == store.Held
		if held && x.o.Mutations.Has(mutation.SupersedeHeld) { // mutation (test-only): a supersede removes a running job too
			held = false
		}
		switch {
		case !held:
			drop = append(drop, i)
		case replace:
			stop = append(stop, i)
		}
	}
	return self, stop, drop
}

// stop asks the held ticket o to stop for the newer run by (--replace):
// a newer replace overwrites an older one's request.
func (x *step) stop(o *Rec, by store.Successor) error {
	stop := by
	o.Stop = &stop
	if err := x.put(*o); err != nil {
		return err
	}
	if err := x.log(eventOf{kind: "replaced", by: by.Ticket}, *o); err != nil {
		return err
	}
	x.tx.Ring(*o) // its holder keeps its bell open while the job runs
	return nil
}

// carryOn goes on with the supersedes that did not fit in their
// enqueue's step (Rec.Superseding), newest first (a newer one removes an
// older marked one): as the enqueue does, it removes the older waiting
// tickets of the marked one's key sharing one of its limits, and asks the
// held ones it Replaces to stop unless it or another live run did
// already; once nothing is left it clears the mark. A ticket whose lease
// is over supersedes nothing more. Out of room (x.full), the settle must
// admit nothing: those waiters are not gone yet.
func (x *step) carryOn(recs []Rec) ([]Rec, error) {
	var marked []int
	for i, m := range recs {
		if m.Superseding && x.expiry(m) == "" {
			marked = append(marked, i)
		}
	}
	if len(marked) == 0 {
		return recs, nil
	}
	slices.SortFunc(marked, func(a, b int) int { return cmp.Compare(recs[b].Fence, recs[a].Fence) })
	gone := make([]bool, len(recs))
	for _, mi := range marked {
		if gone[mi] {
			continue // superseded by a newer one here
		}
		if err := x.carryOnOf(recs, gone, mi); err != nil || x.full {
			return x.unapplied(recs, gone), err
		}
	}
	return x.unapplied(recs, gone), nil
}

// carryOnOf carries on the supersede of recs[mi], as far as there is room
// (x.full), and clears its mark when it is done; gone marks what it removes.
func (x *step) carryOnOf(recs []Rec, gone []bool, mi int) error {
	m := recs[mi]
	by := store.SuccessorOf(store.Ticket{ID: m.ID, Holder: m.Holder})
	for i, o := range recs {
		if gone[i] || !x.supersedes(m, o) {
			continue
		}
		if x.full = !x.fits(o); x.full {
			return nil
		}
		if err := x.remove(o, store.Superseded, "", &by); err != nil {
			return err
		}
		gone[i] = true
	}
	for _, id := range m.Replaces {
		hi := slices.IndexFunc(recs, func(o Rec) bool { return o.ID == id })
		if hi < 0 || gone[hi] || !x.askable(recs, gone, recs[hi], m) {
			continue
		}
		if x.full = !x.fits(recs[hi]); x.full {
			return nil
		}
		if err := x.stop(&recs[hi], by); err != nil {
			return err
		}
	}
	if x.full = !x.fits(m); x.full {
		return nil
	}
	recs[mi].Superseding = false
	return x.put(recs[mi])
}

// askable reports whether the held ticket h, which the marked m replaces,
// is still to be asked to stop: live, and asked by neither m nor another
// live run.
func (x *step) askable(recs []Rec, gone []bool, h, m Rec) bool {
	if h.State != store.Held || x.expiry(h) != "" {
		return false
	}
	if h.Stop == nil {
		return true
	}
	if h.Stop.Ticket == m.ID {
		return false
	}
	i := slices.IndexFunc(recs, func(o Rec) bool { return o.ID == h.Stop.Ticket })
	return i < 0 || gone[i] || x.expiry(recs[i]) != ""
}

// supersedes reports whether the marked ticket m supersedes o: o is an
// older live waiting ticket of m's key sharing one of its limits.
func (x *step) supersedes(m, o Rec) bool {
	return o.Fence < m.Fence && o.State == store.Waiting && o.Key == m.Key &&
		slices.ContainsFunc(m.Names(), o.Has) && x.expiry(o) == ""
}
