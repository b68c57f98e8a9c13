package etcdstore

import (
	"context"

	"github.com/slotctl/slotctl/store"
)

// Counts implements [store.Store].
func (s *Store) Counts(ctx context.Context, limits ...string) ([]store.Counts, error) {
	return s.counts(ctx, limits)
}
