package policy

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// SetPolicy implements [store.Store].
func (s *Store) SetPolicy(ctx context.Context, name string, ch store.PolicyChange) (store.Limit, error) {
	if err := store.CheckLimitName(name); err != nil {
		return store.Limit{}, err
	}
	var out store.Limit
	err := s.update(ctx, func(x *step) error {
		lim, ok, err := x.tx.Limit(name)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
		}
		was := lim.Policy
		lim.Policy = lim.Policy.Apply(ch)
		if err := lim.Policy.Check(); err != nil {
			return err
		}
		if lim.Policy.Rate != was.Rate {
			lim.Starts = lim.Policy.Charge(lim.Starts, x.now.Wall, 0) // a new window keeps what the old one counted, up to its N
		}
		if err := x.tx.PutLimit(name, lim); err != nil {
			return err
		}
		if _, _, err := x.settle([]string{name}, false); err != nil {
			return err
		}
		out, err = x.limitView(name)
		return err
	})
	return out, err
}

// limitView is limit name as a Snapshot lists it, read in this step.
func (x *step) limitView(name string) (store.Limit, error) {
	lim, _, err := x.tx.Limit(name)
	if err != nil {
		return store.Limit{}, err
	}
	q, err := x.tx.Queue(name)
	if err != nil {
		return store.Limit{}, err
	}
	ts := make([]store.Ticket, len(q))
	for i, r := range q {
		ts[i] = x.view(r, 0)
	}
	snap := store.Snapshot{Now: x.now.Wall}
	snap.AddLimit(limitOf(name, lim), ts)
	return snap.Limits[0], nil
}

// limitOf is the stored limit as a Snapshot lists it, before its tickets
// are counted (store.Snapshot.AddLimit).
func limitOf(name string, l LimitRec) store.Limit {
	return store.Limit{Name: name, Slots: l.Slots, Created: l.Created, Policy: l.Policy, Starts: l.Starts}
}

// starts is the rate starts a settle of limit name counts: the limit's
// record as this step read it.
func (x *step) starts(name string, lim LimitRec) []time.Time {
	if x.o.Mutations.Has(mutation.RateStale) { // mutation (test-only): count the rate on this handle's earlier read (P2)
		return x.s.stale.swap(name, lim.Starts)
	}
	return lim.Starts
}

// charge writes the new rate starts of the limits a settle admitted to, in
// the settle's step.
func (x *step) charge(starts map[string][]time.Time) error {
	for name, st := range starts {
		lim, ok, err := x.tx.Limit(name)
		if err != nil || !ok {
			return err
		}
		lim.Starts = st
		if err := x.tx.PutLimit(name, lim); err != nil {
			return err
		}
	}
	return nil
}

// arrangedPosition is waiting r's place among its first limit's waiters
// when that limit's policy orders them otherwise than by ticket (ok false
// for a FIFO limit: count by fence).
func (x *step) arrangedPosition(r Rec) (pos int, ok bool, err error) {
	pol, ok, err := x.ordering(r.Limit)
	if err != nil || !ok {
		return 0, false, err
	}
	q, err := x.tx.Queue(r.Limit)
	if err != nil {
		return 0, false, err
	}
	return x.placeIn(q, r, pol), true, nil
}

// ordering is limit's policy when it orders waiters otherwise than by
// ticket (ok false for a FIFO limit, or one that is gone).
func (x *step) ordering(limit string) (store.Policy, bool, error) {
	lim, found, err := x.tx.Limit(limit)
	if err != nil || !found || lim.Policy.Ordered() == store.FIFO {
		return store.Policy{}, false, err
	}
	return lim.Policy, true, nil
}

// placeIn is waiting r's 1-based place among the waiters of its first
// limit in recs (tickets of any limits), as pol orders them.
func (x *step) placeIn(recs []Rec, r Rec, pol store.Policy) int {
	var held, waiting []*store.Ticket
	for _, o := range recs {
		if !o.Has(r.Limit) {
			continue
		}
		t := x.view(o, 0)
		if o.State == store.Held {
			held = append(held, &t)
		} else {
			waiting = append(waiting, &t)
		}
	}
	order := pol.Arrange(held, waiting, x.now.Wall)
	return slices.IndexFunc(order, func(i int) bool { return waiting[i].ID == r.ID }) + 1
}

// staleStarts is the rate-stale mutation's memory: the starts this handle
// read last, by limit.
type staleStarts struct {
	mu   sync.Mutex
	seen map[string][]time.Time
}

// swap remembers now and returns what was remembered before (now, the first time).
func (m *staleStarts) swap(name string, now []time.Time) []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string][]time.Time{}
	}
	was, ok := m.seen[name]
	m.seen[name] = now
	if !ok {
		return now
	}
	return was
}
