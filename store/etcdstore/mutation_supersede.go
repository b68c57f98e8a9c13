package etcdstore

import (
	"context"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// This file is test-only: mutation.SupersedeFirst, a superseding enqueue
// that removes the older waiting tickets of its key in a transaction of
// their own, before the one that writes its ticket. Without the build tag
// slotctl_mutations the bug is compiled out.

// supersedeFirst commits the removals of the waiting tickets that q
// supersedes on st, and returns the state read after them (st when there
// were none).
func (q *enqueuing) supersedeFirst(ctx context.Context, st *lstate) (*lstate, error) {
	if !q.req.Supersede || !q.s.o.Mutations.Has(mutation.SupersedeFirst) {
		return st, nil
	}
	s, by := q.s, successorOf(q.req)
	_, resp, err := s.commit(ctx, st, "", func(p *plan) error {
		sup, _, err := keyed(p.st, q.req)
		if err != nil {
			return err
		}
		for _, w := range sup {
			if !p.removeBy(w, store.Superseded, "superseded by ticket "+q.req.ID, &by) {
				break
			}
		}
		if p.empty() {
			return errNoCommit
		}
		return nil
	})
	if err != nil || resp == nil {
		return st, err
	}
	return s.read(ctx, q.names, q.req.ID, false)
}
