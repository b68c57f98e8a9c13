package etcdstore

import (
	"context"
	"errors"

	"github.com/slotctl/slotctl/store"
)

// errTODO marks what issue 16 and issue 18 are building; nothing may land with it.
var errTODO = errors.New("not built yet")

// Counts implements [store.Store].
func (s *Store) Counts(ctx context.Context, limits ...string) ([]store.Counts, error) {
	return s.counts(ctx, limits)
}

// Resize implements [store.Store].
func (s *Store) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	return store.Ticket{}, errTODO
}
