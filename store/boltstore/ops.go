package boltstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// Enqueue implements [store.Store].
func (s *Store) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	if err := req.Check(); err != nil {
		return store.Ticket{}, err
	}
	var out store.Ticket
	err := s.update(ctx, func(x *txn) error {
		if t, ok, err := x.tombstone(req.ID); err != nil {
			return err
		} else if ok && t.By != nil {
			return fmt.Errorf("%w: %w", store.ErrRemoved, &store.SupersededError{ID: req.ID, By: *t.By})
		} else if ok {
			return fmt.Errorf("%w: ticket %s was %s", store.ErrRemoved, req.ID, t.Reason)
		}
		if r, ok, err := x.lookup(req.ID); err != nil {
			return err
		} else if ok {
			// A retry of a create that committed: the same ticket, unchanged.
			pos, err := x.position(r)
			if err != nil {
				return err
			}
			out = x.view(r, pos)
			return nil
		}
		// Every limit is checked before any is created: a refused request
		// writes nothing (the transaction rolls back anyway).
		names, w := req.Names(), req.Weighs()
		sizes := make([]int, len(names))
		made := make([]bool, len(names))
		for i, name := range names {
			lim, ok, err := x.limit(name)
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
			if made[i] {
				if err := x.putLimit(name, limitRec{Slots: sizes[i], Created: x.now.Wall}); err != nil {
					return err
				}
				if err := x.dropCounts(name); err != nil { // a new limit counts from zero
					return err
				}
			}
		}
		fence, err := x.next(keySeq)
		if err != nil {
			return err
		}
		r := ticketRec{ID: req.ID, Limit: names[0], Limits: names, Weight: w, State: store.Waiting, Fence: fence, Slot: -1, TTL: req.TTL,
			DeadlineBoot: x.now.Boot, DeadlineMono: x.now.Mono + req.TTL, Created: x.now.Wall, Holder: req.Holder,
			BellUID: ownUID(), // the enqueuer is the waiter: its Watch made the bell
			Key:     req.Key,
			Quiet:   !x.s.loud, // until its settle finds it in line, or admits it
		}
		if err := x.putTicket(r); err != nil {
			return err
		}
		ir := idRec{V: formatVersion, Limit: names[0], Fence: fence}
		if err := x.bucket(bucketIDs).Put([]byte(req.ID), encode(&ir)); err != nil {
			return err
		}
		// The closure of its limits, read once: the supersede decides on
		// these very records, and the settle plans on what it leaves.
		recs, lnames, err := x.gather(names)
		if err != nil {
			return err
		}
		if req.Supersede || req.Replace {
			if recs, err = x.supersede(recs, r, req); err != nil {
				return err
			}
		}
		if recs, _, err = x.settleOn(recs, lnames, false, req.ID); err != nil {
			return err
		}
		out, _ = x.viewIn(recs, req.ID)
		if req.MaxWaiting != nil && out.State == store.Waiting {
			// Refused: the error rolls back the whole step (docs/leases.md
			// §2.1 item 10), the supersede and the ticket with it.
			if err := queueFull(recs, r, *req.MaxWaiting); err != nil {
				out = store.Ticket{}
				return err
			}
		}
		return nil
	})
	return out, err
}

// queueFull refuses r, left waiting by its enqueue's settle, when one of its
// limits has max waiting tickets besides it (recs: the closure after the
// settle, r among them).
func queueFull(recs []ticketRec, r ticketRec, max int) error {
	for _, name := range r.names() {
		n := 0
		for _, o := range recs {
			if o.State == store.Waiting && o.Fence != r.Fence && o.has(name) {
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
// enqueue's own step (docs/leases.md §2.1 item 10): every older waiting
// ticket of r's key that shares a limit with it is removed as Superseded;
// with Replace every such held ticket gets a stop request naming r, and r
// waits for them (Replaces). Held tickets are never removed. It returns recs
// as they are now.
func (x *txn) supersede(recs []ticketRec, r ticketRec, req store.EnqueueRequest) ([]ticketRec, error) {
	if err := checkSuccessorHost(req.Holder.Host); err != nil {
		return nil, err
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
		if o.Key != r.Key || o.Fence > r.Fence || !slices.ContainsFunc(r.names(), o.has) {
			live = append(live, o)
			continue
		}
		held := o.State == store.Held
		if held && x.s.mut.Has(mutation.SupersedeHeld) { // mutation (test-only): a supersede removes a running job too (R2)
			held = false
		}
		switch {
		case !held:
			if err := x.removeBy(o, store.Superseded, "", &by); err != nil {
				return nil, err
			}
		case req.Replace:
			stop := by
			o.Stop = &stop // a newer replace overwrites an older one's request
			if err := x.putTicket(o); err != nil {
				return nil, err
			}
			if err := x.eventBy(eventOf{kind: "replaced", by: r.ID}, o); err != nil {
				return nil, err
			}
			x.rings = append(x.rings, refOf(o)) // its holder keeps its bell open while the job runs
			r.Replaces = append(r.Replaces, o.ID)
			live = append(live, o)
		default:
			live = append(live, o)
		}
	}
	if len(r.Replaces) > maxReplaces {
		return nil, fmt.Errorf("%w: --replace would stop %d running tickets of key %q: at most %d", store.ErrInvalid, len(r.Replaces), r.Key, maxReplaces)
	}
	if len(r.Replaces) > 0 && self >= 0 {
		me := &live[self] // as read back, so that the settle writes what it read
		me.Replaces = r.Replaces
		if err := x.putTicket(*me); err != nil {
			return nil, err
		}
	}
	return live, nil
}

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, id string) (store.Ticket, error) {
	var out store.Ticket
	err := s.view(ctx, func(x *txn) error {
		r, ok, err := x.lookup(id)
		if err != nil {
			return err
		}
		if !ok {
			return x.notFound(id)
		}
		pos, err := x.position(r)
		if err != nil {
			return err
		}
		out = x.view(r, pos)
		return nil
	})
	return out, err
}

func (x *txn) notFound(id string) error {
	if t, ok, err := x.tombstone(id); err != nil {
		return err
	} else if ok && t.By != nil {
		// docs/leases.md §2.1 item 10: a superseded waiter learns who took its place.
		return fmt.Errorf("%w: %w", store.ErrNotFound, &store.SupersededError{ID: id, By: *t.By})
	} else if ok {
		return fmt.Errorf("%w: ticket %s was %s", store.ErrNotFound, id, t.Reason)
	}
	return fmt.Errorf("%w: ticket %s", store.ErrNotFound, id)
}

// Renew implements [store.Store]. A renewal of a waiting ticket also sweeps
// its limits (and the limits their tickets reach, see txn.gather), so that
// waiters free a dead holder's slot within its TTL even when nobody runs reap.
func (s *Store) Renew(ctx context.Context, t store.Ticket, ttl time.Duration) (store.Ticket, error) {
	if err := store.CheckTTL(ttl); err != nil {
		return store.Ticket{}, err
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
				return err // a tombstone it cannot read: the store's error, not a lost lease
			}
			lost = fmt.Errorf("%w: %w", store.ErrLost, err)
			return nil
		}
		if r.Fence != t.Fence {
			lost = fmt.Errorf("%w: ticket %s has fence %d, not %d", store.ErrLost, t.ID, r.Fence, t.Fence)
			return nil
		}
		// The renewer is alive by definition: only the clock judges it here
		// (and the judge only adds what it knows of an expired one). A
		// waiter holds no slot: its late renewal is accepted while its
		// ticket is still here (docs/leases.md rule 17).
		ev := x.expiry(r)
		gone := ev != "" && r.State == store.Held
		if gone {
			ev, _ = store.Verdict(store.Queued{Ticket: x.view(r, 0), Expired: ev}, x.s.dead, true)
		}
		if x.s.mut.Has(mutation.RenewExpired) { // mutation (test-only): renew an expired, unswept ticket (A7)
			gone = false
		}
		if gone {
			if err := x.remove(r, store.Reaped, ev); err != nil {
				return err
			}
			lost = fmt.Errorf("%w: ticket %s %s", store.ErrLost, t.ID, ev)
			_, _, err := x.settle(r.names(), false)
			return err
		}
		r.DeadlineMono, r.TTL, r.Renewed = x.now.Mono+ttl, ttl, x.now.Wall
		if err := x.putTicket(r); err != nil {
			return err
		}
		if r.State == store.Held {
			out = x.view(r, 0) // held: no queue position to count
			return nil
		}
		// A waiter's renewal also settles its limits, so that waiters free a
		// dead holder's slot within its TTL even when nothing else happens;
		// most of the time there is nothing to settle, and that is cheap to see.
		if quiet, err := x.quiet(r.names()); err != nil {
			return err
		} else if quiet {
			pos, err := x.position(r)
			if err != nil {
				return err
			}
			out = x.view(r, pos)
			return nil
		}
		recs, _, err := x.settle(r.names(), false)
		if err != nil {
			return err
		}
		var found bool
		if out, found = x.viewIn(recs, t.ID); !found {
			// The sweep judged this very holder dead (a late request from a
			// process that has since died): its removal stands, and the
			// renewal is lost like any other.
			lost = fmt.Errorf("%w: ticket %s was reaped: its holder is dead", store.ErrLost, t.ID)
		}
		return nil
	})
	if err == nil {
		err = lost
	}
	return out, err
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, t store.Ticket, why store.Reason) (bool, error) {
	var removed bool
	err := s.update(ctx, func(x *txn) error {
		if err := store.CheckID(t.ID); err != nil {
			return err
		}
		r, ok, err := x.lookup(t.ID)
		if err != nil {
			return err
		}
		if !ok {
			if x.s.mut.Has(mutation.ReleaseCounter) { // mutation (test-only): a missing ticket still frees a slot (A4)
				if err := x.mutFreeOne(t.Limit); err != nil {
					return err
				}
			}
			if x.s.mut.Has(mutation.ReleaseNoCompare) { // mutation (test-only): remove whoever holds t's slot now (A10)
				if err := x.mutReleaseSlot(t, why); err != nil {
					return err
				}
			}
			if why == store.Lost && store.CheckLimits(t.Names()) == nil && store.CheckWeight(t.Weight) == nil {
				// Reaped or released by someone else: log that its holder
				// noticed, for "when did it go away".
				if err := x.event(string(store.Lost), recordOf(t), "holder presumed its lease lost"); err != nil {
					return err
				}
			}
			if _, dead, err := x.tombstone(t.ID); err != nil || dead {
				return err
			}
			return x.addTombstone(t.ID, why) // cancel before create: refuse the create when it lands
		}
		if t.Fence != 0 && r.Fence != t.Fence {
			return nil
		}
		if err := x.remove(r, why, ""); err != nil {
			return err
		}
		removed = true
		_, _, err = x.settle(r.names(), false)
		return err
	})
	return removed, err
}

// Cancel implements [store.Store]: Release with store.Cancelled.
func (s *Store) Cancel(ctx context.Context, t store.Ticket) (bool, error) {
	return s.Release(ctx, t, store.Cancelled)
}

// Snapshot implements [store.Store]: a ticket of several limits is listed
// under each (store.Snapshot.AddLimit).
func (s *Store) Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error) {
	var out store.Snapshot
	err := s.view(ctx, func(x *txn) error {
		out = store.Snapshot{Now: x.now.Wall, Limits: []store.Limit{}, Tickets: []store.Ticket{}}
		names, err := x.limitNames(limits)
		if err != nil {
			return err
		}
		var multi copies
		for _, name := range names {
			lim, ok, err := x.limit(name)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
			}
			var ts []store.Ticket
			err = x.readQueue(name, func(r ticketRec, raw []byte) error {
				if len(r.Limits) > 1 {
					if multi == nil {
						multi = copies{}
					}
					if _, err := multi.seen(&r, raw, name, 0); err != nil {
						return err
					}
				}
				ts = append(ts, x.view(r, 0))
				return nil
			})
			if err != nil {
				return err
			}
			out.AddLimit(store.Limit{Name: name, Slots: lim.Slots, Created: lim.Created}, ts)
		}
		return nil
	})
	return out, err
}

// SetLimit implements [store.Store].
func (s *Store) SetLimit(ctx context.Context, name string, slots int) (store.Limit, error) {
	if err := store.CheckLimitName(name); err != nil {
		return store.Limit{}, err
	}
	if err := store.CheckSlots(slots); err != nil {
		return store.Limit{}, err
	}
	var out store.Limit
	err := s.update(ctx, func(x *txn) error {
		lim, ok, err := x.limit(name)
		if err != nil {
			return err
		}
		if !ok {
			lim.Created = x.now.Wall
			if err := x.dropCounts(name); err != nil { // a new limit counts from zero
				return err
			}
		}
		lim.Slots = slots
		if err := x.putLimit(name, lim); err != nil {
			return err
		}
		recs, _, err := x.settle([]string{name}, false)
		if err != nil {
			return err
		}
		out = store.Limit{Name: name, Slots: slots, Created: lim.Created}
		for _, r := range recs {
			switch {
			case !r.has(name):
			case r.State == store.Held:
				out.Held += r.weight() // slots, not tickets
			default:
				out.Waiting++
			}
		}
		return nil
	})
	return out, err
}

// RemoveLimit implements [store.Store]. With force, every ticket naming
// the limit is removed entirely, and the other limits they named are
// settled: their slots there are free now.
func (s *Store) RemoveLimit(ctx context.Context, name string, force bool) error {
	if err := store.CheckLimitName(name); err != nil {
		return err
	}
	return s.update(ctx, func(x *txn) error {
		if _, ok, err := x.limit(name); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
		}
		recs, err := x.tickets(name)
		if err != nil {
			return err
		}
		if len(recs) > 0 && !force {
			return fmt.Errorf("%w: limit %q has %d tickets", store.ErrLimitInUse, name, len(recs))
		}
		var others []string
		for _, r := range recs {
			if err := x.remove(r, store.ForceReleased, "limit removed"); err != nil {
				return err
			}
			for _, l := range r.names() {
				if l != name && !slices.Contains(others, l) {
					others = append(others, l)
				}
			}
		}
		if b, _ := x.queue(name, false); b != nil {
			if err := x.bucket(bucketQueue).DeleteBucket([]byte(name)); err != nil {
				return err
			}
		}
		if err := x.bucket(bucketLimits).Delete([]byte(name)); err != nil {
			return err
		}
		if err := x.dropCounts(name); err != nil {
			return err
		}
		if len(others) == 0 {
			return nil
		}
		_, _, err = x.settle(others, false)
		return err
	})
}

// recordOf is the record form of a caller's ticket, for logging only.
func recordOf(t store.Ticket) ticketRec {
	r := ticketRec{ID: t.ID, Limit: t.Names()[0], Limits: t.Names(), Weight: t.Weighs(), State: t.State, Fence: t.Fence, Slot: t.Slot, Holder: t.Holder}
	if t.State == store.Held { // only indexes a record could hold: the event is read back as strictly
		r.Indexes = map[string][]int{}
		for _, name := range r.Limits {
			ix := t.In(name)
			if len(ix) != r.Weight || slices.ContainsFunc(ix, func(n int) bool { return n < 0 || n >= store.MaxSlots }) {
				ix = nil
			}
			r.Indexes[name] = ix
		}
	}
	return r
}

// SetChild implements [store.Store].
func (s *Store) SetChild(ctx context.Context, t store.Ticket, pgid int, pgidStart uint64) (store.Ticket, error) {
	var out store.Ticket
	var lost error
	err := s.update(ctx, func(x *txn) error {
		r, ok, err := x.lookup(t.ID)
		if err != nil {
			return err
		}
		if !ok || r.Fence != t.Fence {
			lost = fmt.Errorf("%w: ticket %s is gone", store.ErrLost, t.ID)
			return nil
		}
		if r.DeadlineBoot != x.now.Boot || x.now.Mono >= r.DeadlineMono {
			lost = fmt.Errorf("%w: ticket %s expired", store.ErrLost, t.ID)
			return nil
		}
		r.Holder.Pgid, r.Holder.PgidStart = pgid, pgidStart
		if err := x.putTicket(r); err != nil {
			return err
		}
		pos, err := x.position(r)
		if err != nil {
			return err
		}
		out = x.view(r, pos)
		return nil
	})
	if err == nil {
		err = lost
	}
	return out, err
}

// Reap implements [store.Store]. A reap of some limits sweeps their
// tickets (each ticket of several limits entirely) and settles the closure
// of those limits (see txn.gather) in the same step; tickets of the other
// limits there are neither judged nor removed, only admitted.
func (s *Store) Reap(ctx context.Context, o store.ReapOptions) ([]store.Removal, error) {
	for _, l := range o.Limits {
		if err := store.CheckLimitName(l); err != nil {
			return nil, err
		}
	}
	// input is the planner's input of a reap: the closure of the swept
	// limits, every swept ticket judged (All), the others left alone.
	input := func(x *txn) ([]string, []ticketRec, store.SettleInput, error) {
		names, err := x.limitNames(o.Limits)
		if err != nil {
			return nil, nil, store.SettleInput{}, err
		}
		for _, name := range names {
			if _, ok, err := x.limit(name); err != nil {
				return nil, nil, store.SettleInput{}, err
			} else if !ok {
				return nil, nil, store.SettleInput{}, fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
			}
		}
		recs, in, err := x.settleInput(names)
		if err != nil {
			return nil, nil, in, err
		}
		in.All = true
		if len(o.Limits) > 0 {
			others := map[string]bool{}
			for i := range in.Tickets {
				q := &in.Tickets[i]
				if !slices.ContainsFunc(q.Ticket.Names(), func(l string) bool { return slices.Contains(names, l) }) {
					q.Expired, others[q.Ticket.ID] = "", true
				}
			}
			if judge := in.Judge; judge != nil && len(others) > 0 {
				in.Judge = func(t store.Ticket, act bool) (string, bool) {
					if others[t.ID] {
						return "", false
					}
					return judge(t, act)
				}
			}
		}
		return names, recs, in, nil
	}
	removed := []store.Removal{}
	if o.DryRun {
		if s.mut.Has(mutation.BlindReap) || s.mut.Has(mutation.StaleVerdict) { // mutation (test-only): remember this scan
			s.mutResetScan()
		}
		err := s.view(ctx, func(x *txn) error {
			_, recs, in, err := input(x)
			if err != nil {
				return err
			}
			in.DryRun = true
			gone := make([]bool, len(recs))
			for _, rm := range store.PlanSettle(in).Remove {
				gone[rm.Index] = true
				removed = append(removed, store.Removal{Ticket: in.Tickets[rm.Index].Ticket, Reason: store.Reaped, Evidence: rm.Evidence})
			}
			if s.mut.Has(mutation.BlindReap) || s.mut.Has(mutation.StaleVerdict) { // mutation (test-only): remember this scan
				for i, r := range recs {
					s.mutNoteScan(r, gone[i])
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return removed, nil
	}
	err := s.update(ctx, func(x *txn) error {
		names, recs, in, err := input(x)
		if err != nil {
			return err
		}
		if x.s.mut.Has(mutation.StaleVerdict) { // mutation (test-only): judge on the deadlines an earlier scan read (A1)
			x.mutStaleVerdict(&in)
		}
		_, rm, err := x.apply(recs, store.PlanSettle(in), "")
		if err != nil {
			return err
		}
		removed = rm
		if x.s.mut.Has(mutation.BlindReap) { // mutation (test-only): free a slot per ticket the scan listed (A2)
			for _, name := range names {
				if err := x.mutBlindReap(name, rm); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err // rolled back: nothing was removed
	}
	if removed == nil {
		removed = []store.Removal{}
	}
	return removed, nil
}

// Events implements [store.Store].
func (s *Store) Events(ctx context.Context, limit string, n int) ([]store.Event, error) {
	if limit != "" {
		if err := store.CheckLimitName(limit); err != nil {
			return nil, err
		}
	}
	out := []store.Event{}
	err := s.view(ctx, func(x *txn) error {
		b := x.bucket(bucketEvents)
		if b == nil || n <= 0 {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Last(); k != nil && len(out) < n; k, v = c.Prev() {
			var e eventRec
			if err := decode(v, &e); err != nil {
				return fmt.Errorf("event %x: %w", k, err)
			}
			if limit == "" || e.Limit == limit {
				out = append(out, e.Event)
			}
		}
		slices.Reverse(out)
		return nil
	})
	return out, err
}

// limitNames is the named limits, sorted and each once, or all the store's
// limits when none is named.
func (x *txn) limitNames(limits []string) ([]string, error) {
	names := slices.Clone(limits)
	if len(names) == 0 {
		if b := x.bucket(bucketLimits); b != nil {
			err := b.ForEach(func(k, _ []byte) error {
				if !store.ValidLimitName(string(k)) { // a name from the file, checked as a request's
					return fmt.Errorf("%w: limit named %q", store.ErrCorrupt, k)
				}
				names = append(names, string(k))
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
