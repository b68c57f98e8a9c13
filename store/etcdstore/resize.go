package etcdstore

import (
	"context"

	"github.com/slotctl/slotctl/store"
)

// Resize implements [store.Store].
func (s *Store) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	return store.Ticket{}, errTODO
}
