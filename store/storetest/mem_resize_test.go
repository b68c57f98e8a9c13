package storetest_test

import (
	"context"

	"github.com/slotctl/slotctl/store"
)

// Resize implements store.Store.
func (s *memStore) Resize(_ context.Context, tk store.Ticket, weight int) (store.Ticket, error) {
	return store.Ticket{}, errTODO
}
