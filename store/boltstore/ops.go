package boltstore

import (
	"context"
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
		lim, ok, err := x.limit(req.Limit)
		if err != nil {
			return err
		}
		if !ok {
			lim = limitRec{Slots: req.Slots, Created: x.now.Wall}
			if err := x.putLimit(req.Limit, lim); err != nil {
				return err
			}
		} else if req.CheckSlots && lim.Slots != req.Slots {
			return &store.SlotsConflictError{Limit: req.Limit, Have: lim.Slots, Want: req.Slots}
		}
		fence, err := x.next(keySeq)
		if err != nil {
			return err
		}
		r := ticketRec{ID: req.ID, Limit: req.Limit, State: store.Waiting, Fence: fence, Slot: -1, TTL: req.TTL,
			DeadlineBoot: x.now.Boot, DeadlineMono: x.now.Mono + req.TTL, Created: x.now.Wall, Holder: req.Holder,
			BellUID: ownUID()} // the enqueuer is the waiter: its Watch made the bell
		if err := x.putTicket(r); err != nil {
			return err
		}
		ir := idRec{V: formatVersion, Limit: req.Limit, Fence: fence}
		if err := x.bucket(bucketIDs).Put([]byte(req.ID), encode(&ir)); err != nil {
			return err
		}
		recs, _, err := x.settle(req.Limit, false)
		if err != nil {
			return err
		}
		out, _ = x.viewIn(recs, req.ID)
		return nil
	})
	return out, err
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
	} else if ok {
		return fmt.Errorf("%w: ticket %s was %s", store.ErrNotFound, id, t.Reason)
	}
	return fmt.Errorf("%w: ticket %s", store.ErrNotFound, id)
}

// Renew implements [store.Store]. A renewal of a waiting ticket also sweeps
// its limit, so that waiters free a dead holder's slot within its TTL even
// when nobody runs reap.
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
			lost = fmt.Errorf("%w: %w", store.ErrLost, x.notFound(t.ID))
			return nil
		}
		if r.Fence != t.Fence {
			lost = fmt.Errorf("%w: ticket %s has fence %d, not %d", store.ErrLost, t.ID, r.Fence, t.Fence)
			return nil
		}
		// The renewer is alive by definition: only the clock judges it here
		// (and the judge only adds what it knows of an expired one).
		ev := x.expiry(r)
		gone := ev != ""
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
			_, _, err := x.settle(r.Limit, false)
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
		// A waiter's renewal also settles its limit, so that waiters free a
		// dead holder's slot within its TTL even when nothing else happens;
		// most of the time there is nothing to settle, and that is cheap to see.
		if quiet, err := x.quiet(r.Limit); err != nil {
			return err
		} else if quiet {
			pos, err := x.position(r)
			if err != nil {
				return err
			}
			out = x.view(r, pos)
			return nil
		}
		recs, _, err := x.settle(r.Limit, false)
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
			if why == store.Lost && t.Limit != "" {
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
		_, _, err = x.settle(r.Limit, false)
		return err
	})
	return removed, err
}

// Cancel implements [store.Store]: Release with store.Cancelled.
func (s *Store) Cancel(ctx context.Context, t store.Ticket) (bool, error) {
	return s.Release(ctx, t, store.Cancelled)
}

// Snapshot implements [store.Store].
func (s *Store) Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error) {
	var out store.Snapshot
	err := s.view(ctx, func(x *txn) error {
		out = store.Snapshot{Now: x.now.Wall, Limits: []store.Limit{}, Tickets: []store.Ticket{}}
		names, err := x.limitNames(limits)
		if err != nil {
			return err
		}
		for _, name := range names {
			lim, ok, err := x.limit(name)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
			}
			recs, err := x.tickets(name)
			if err != nil {
				return err
			}
			ts := make([]store.Ticket, len(recs))
			for i, r := range recs {
				ts[i] = x.view(r, 0)
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
		}
		lim.Slots = slots
		if err := x.putLimit(name, lim); err != nil {
			return err
		}
		recs, _, err := x.settle(name, false)
		if err != nil {
			return err
		}
		out = store.Limit{Name: name, Slots: slots, Created: lim.Created}
		for _, r := range recs {
			if r.State == store.Held {
				out.Held++
			} else {
				out.Waiting++
			}
		}
		return nil
	})
	return out, err
}

// RemoveLimit implements [store.Store].
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
		for _, r := range recs {
			if err := x.remove(r, store.ForceReleased, "limit removed"); err != nil {
				return err
			}
		}
		if b, _ := x.queue(name, false); b != nil {
			if err := x.bucket(bucketQueue).DeleteBucket([]byte(name)); err != nil {
				return err
			}
		}
		return x.bucket(bucketLimits).Delete([]byte(name))
	})
}

// recordOf is the record form of a caller's ticket, for logging only.
func recordOf(t store.Ticket) ticketRec {
	return ticketRec{ID: t.ID, Limit: t.Limit, State: t.State, Fence: t.Fence, Slot: t.Slot, Holder: t.Holder}
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

// Reap implements [store.Store].
func (s *Store) Reap(ctx context.Context, o store.ReapOptions) ([]store.Removal, error) {
	dryRun, limits := o.DryRun, o.Limits
	for _, l := range limits {
		if err := store.CheckLimitName(l); err != nil {
			return nil, err
		}
	}
	removed := []store.Removal{}
	each := func(x *txn, fn func(name string) error) error {
		names, err := x.limitNames(limits)
		if err != nil {
			return err
		}
		for _, name := range names {
			if _, ok, err := x.limit(name); err != nil {
				return err
			} else if !ok {
				return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
			}
			if err := fn(name); err != nil {
				return err
			}
		}
		return nil
	}
	if dryRun {
		if s.mut.Has(mutation.BlindReap) || s.mut.Has(mutation.StaleVerdict) { // mutation (test-only): remember this scan
			s.mutResetScan()
		}
		err := s.view(ctx, func(x *txn) error {
			return each(x, func(name string) error {
				lim, _, err := x.limit(name)
				if err != nil {
					return err
				}
				recs, err := x.tickets(name)
				if err != nil {
					return err
				}
				in := x.settleInput(name, lim.Slots, recs)
				in.All, in.DryRun, in.Judge = true, true, s.dead
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
		})
		if err != nil {
			return nil, err
		}
		return removed, nil
	}
	err := s.update(ctx, func(x *txn) error {
		removed = removed[:0]
		return each(x, func(name string) error {
			_, r, err := x.settle(name, true)
			removed = append(removed, r...)
			if err == nil && x.s.mut.Has(mutation.BlindReap) { // mutation (test-only): free a slot per ticket the scan listed (A2)
				err = x.mutBlindReap(name, r)
			}
			return err
		})
	})
	if err != nil {
		return nil, err // rolled back: nothing was removed
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
