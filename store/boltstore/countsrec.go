package boltstore

import (
	"context"
	"fmt"

	"github.com/slotctl/slotctl/store"
)

// bucketCounts holds each limit's counters (docs/leases.md §2.8):
// limit name -> countsRec, written in the transaction of every event the
// limit logs (txn.count) and deleted with the limit. A file without the
// bucket (the previous format, or no event yet) reads as zero counts.
var bucketCounts = []byte("counts")

// countsRec is a store.Counts as stored; version 2 only (the previous
// release kept no counts).
type countsRec struct {
	V int `json:"v"`
	store.Counts
}

func (r *countsRec) version() int { return r.V }
func (r *countsRec) upgrade()     { r.V = formatVersion }

// check is (*store.Counts).Check and what only this store knows: no counts
// in a version 1 record, and one wait observed per admission. (Holds are not
// bounded by admissions: a store of the previous format held tickets
// admitted before it kept counts.)
func (r *countsRec) check() error {
	if r.V == legacyVersion {
		return fmt.Errorf("counts in a version %d record", legacyVersion)
	}
	if err := r.Counts.Check(); err != nil {
		return err
	}
	if r.Wait.Count != r.Admitted {
		return fmt.Errorf("counts of %q: %d waits observed for %d admissions", r.Limit, r.Wait.Count, r.Admitted)
	}
	return nil
}

// loadCounts reads a limit's counts, zero when it has none yet. A record
// stored under another limit's name is corrupt.
func (x *txn) loadCounts(name string) (store.Counts, error) {
	if c, ok := x.counted[name]; ok {
		return *c, nil
	}
	c := store.Counts{Limit: name}
	b := x.bucket(bucketCounts)
	if b == nil {
		return c, nil
	}
	v := b.Get([]byte(name))
	if v == nil {
		return c, nil
	}
	var r countsRec
	if err := decode(v, &r); err != nil {
		return c, fmt.Errorf("counts of limit %q: %w", name, err)
	}
	if r.Limit != name {
		return c, fmt.Errorf("%w: counts of limit %q stored under %q", store.ErrCorrupt, r.Limit, name)
	}
	return r.Counts, nil
}

// count adds one event of limit ev.Limit to its counts, in this
// transaction: the step that logs the event (docs/leases.md §2.8). An event
// of a limit that no longer exists (a holder's late "lost" after the limit
// was removed) is logged but counted nowhere: the limit's counts went with it.
func (x *txn) count(ev store.Event) error {
	if x.bucket(bucketLimits).Get([]byte(ev.Limit)) == nil {
		return nil
	}
	c, err := x.loadCounts(ev.Limit)
	if err != nil {
		return err
	}
	c.Add(ev)
	if x.counted == nil {
		x.counted = map[string]*store.Counts{}
	}
	x.counted[ev.Limit] = &c
	return x.bucket(bucketCounts).Put([]byte(ev.Limit), encode(&countsRec{V: formatVersion, Counts: c}))
}

// dropCounts deletes the counts of a limit removed or made: a limit made
// again under the same name counts from zero, whatever a record left behind
// says.
func (x *txn) dropCounts(name string) error {
	delete(x.counted, name)
	if b := x.bucket(bucketCounts); b != nil {
		return b.Delete([]byte(name))
	}
	return nil
}

// counts is Counts: the named limits' counts (all limits when none), in name order.
func (s *Store) counts(ctx context.Context, limits []string) ([]store.Counts, error) {
	for _, name := range limits {
		if err := store.CheckLimitName(name); err != nil {
			return nil, err
		}
	}
	out := []store.Counts{}
	err := s.view(ctx, func(x *txn) error {
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
			c, err := x.loadCounts(name)
			if err != nil {
				return err
			}
			out = append(out, c)
		}
		return nil
	})
	return out, err
}
