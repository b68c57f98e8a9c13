package boltstore

import (
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
// Counts implements policy.Tx.
func (x *txn) Counts(name string) (store.Counts, error) {
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

// PutCounts implements policy.Tx.
func (x *txn) PutCounts(c store.Counts) error {
	return x.bucket(bucketCounts).Put([]byte(c.Limit), encode(&countsRec{V: formatVersion, Counts: c}))
}
