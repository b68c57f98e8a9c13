package policy

import (
	"context"
	"fmt"
	"slices"

	"github.com/slotctl/slotctl/store"
)

// Reap implements [store.Store]. A reap of some limits sweeps their
// tickets (each ticket of several limits entirely) and settles the closure
// of those limits in the same step; tickets of the other limits there are
// neither judged nor removed, only admitted.
func (s *Store) Reap(ctx context.Context, o store.ReapOptions) ([]store.Removal, error) {
	for _, l := range o.Limits {
		if err := store.CheckLimitName(l); err != nil {
			return nil, err
		}
	}
	removed := []store.Removal{}
	run := s.update
	if o.DryRun {
		run = s.view
	}
	err := run(ctx, func(x *step) error {
		removed = removed[:0]
		recs, in, err := x.reapInput(o.Limits)
		if err != nil {
			return err
		}
		if o.DryRun {
			in.DryRun = true
			for _, rm := range store.PlanSettle(in).Remove {
				removed = append(removed, store.Removal{Ticket: in.Tickets[rm.Index].Ticket, Reason: store.Reaped, Evidence: rm.Evidence})
			}
			return nil
		}
		_, rm, err := x.apply(recs, store.PlanSettle(in), "")
		removed = append(removed, rm...)
		return err
	})
	if err != nil {
		return nil, err // rolled back: nothing was removed
	}
	return removed, nil
}

// reapInput is the planner's input of a reap of limits (all when none): the
// closure of the swept limits, every swept ticket judged (All), the others
// left alone.
func (x *step) reapInput(limits []string) ([]Rec, store.SettleInput, error) {
	names, err := x.limitNames(limits)
	if err != nil {
		return nil, store.SettleInput{}, err
	}
	for _, name := range names {
		if _, ok, err := x.tx.Limit(name); err != nil {
			return nil, store.SettleInput{}, err
		} else if !ok {
			return nil, store.SettleInput{}, fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
		}
	}
	recs, lnames, err := x.gather(names)
	if err != nil {
		return nil, store.SettleInput{}, err
	}
	in, err := x.planInput(recs, lnames)
	if err != nil {
		return nil, in, err
	}
	in.All = true
	if len(limits) == 0 {
		return recs, in, nil
	}
	others := map[string]bool{}
	for i := range in.Tickets {
		q := &in.Tickets[i]
		if !slices.ContainsFunc(q.Ticket.Names(), func(l string) bool { return slices.Contains(names, l) }) {
			q.Expired, others[q.Ticket.ID] = "", true
		}
	}
	if judge := in.Judge; judge != nil && len(others) > 0 {
		in.Judge = func(t store.Ticket, act bool) (string, bool) {
			if others[t.ID] {
				return "", false
			}
			return judge(t, act)
		}
	}
	return recs, in, nil
}
