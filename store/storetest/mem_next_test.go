package storetest_test

import (
	"context"
	"errors"

	"github.com/slotctl/slotctl/store"
)

// errTODO is the error of an operation not built yet: no code that returns
// it may be merged.
var errTODO = errors.New("not built yet")

// Counts implements store.Store.
func (s *memStore) Counts(_ context.Context, limits ...string) ([]store.Counts, error) {
	return s.counts(limits)
}
