package etcdstore

import (
	"context"
	"errors"

	"github.com/slotctl/slotctl/store"
)

// Resize implements [store.Store] in one transaction, compared at the
// revision read (docs/leases.md §2.1 item 12). The ticket's keys in every
// limit are rewritten on the revision of its ticket key (keeping its
// lease), and its slot keys follow its indexes: a shrink deletes the freed
// ones and settles the closure of its limits as a release does, so the
// waiters it makes room for are admitted in the same transaction; a growth
// puts the slot keys of what policy.PlanResize finds free (a ticket whose
// lease the server expired waits for nothing), under the ticket's lease,
// with compares that no slot key was written, no ticket joined and no size
// changed in its limits since the read. A growth stops at MaxTicketKeys: a
// ticket must stay removable in one transaction.
func (s *Store) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	out, err := s.resize(ctx, t, weight)
	if errors.Is(err, errNotLive) && store.CheckTTL(t.TTL) == nil {
		// Its lease is gone: after an election a hold may keep the ticket,
		// which a renewal takes over (quarantine.go); then resize again.
		if _, rerr := s.Renew(ctx, t, t.TTL); rerr == nil {
			out, err = s.resize(ctx, t, weight)
		}
	}
	return out, err
}

// errNotLive marks a resize refused because the ticket's lease is gone.
var errNotLive = errors.New("its lease is gone")

func (s *Store) resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	return s.pol.Resize(ctx, t, weight)
}
