package storetest_test

import (
	"context"

	"github.com/slotctl/slotctl/store"
)

// Counts implements store.Store.
func (s *memStore) Counts(_ context.Context, limits ...string) ([]store.Counts, error) {
	return s.counts(limits)
}
