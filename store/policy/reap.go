package policy

import (
	"context"
	"fmt"
	"slices"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// Reap implements [store.Store]. A reap of some limits sweeps their
// tickets (each ticket of several limits entirely) and settles the closure
// of those limits in the same step; tickets of the other limits there are
// neither judged nor removed, only admitted. A step out of room (Bounded)
// sweeps what fits, and the next step the rest.
func (s *Store) Reap(ctx context.Context, o store.ReapOptions) ([]store.Removal, error) {
	for _, l := range o.Limits {
		if err := store.CheckLimitName(l); err != nil {
			return nil, err
		}
	}
	g := &reaping{s: s, o: o, removed: []store.Removal{}}
	run := s.update
	g.scan = s.o.Mutations.Has(mutation.BlindReap) || s.o.Mutations.Has(mutation.StaleVerdict) // mutation (test-only): remember the scan
	if o.DryRun {
		run = s.view
		if g.scan {
			s.scan.reset()
		}
	}
	var all []store.Removal // what the steps before removed
	for n := 0; ; n++ {
		if err := run(ctx, g.step); err != nil {
			if n > 0 {
				break // what the steps before removed stands; the next reap carries on
			}
			return nil, err // rolled back: nothing was removed
		}
		all = append(all, g.removed...)
		g.removed, g.lost = g.removed[:0], nil
		if !g.full || o.DryRun || n >= maxMore {
			break
		}
	}
	if len(g.after) > 0 {
		slices.Sort(g.after)
		_, _, _ = s.Settle(ctx, g.after, "") // the sweep stands; the next settle carries on
	}
	if all == nil {
		all = []store.Removal{}
	}
	return all, nil
}

// reaping is one Reap, over its steps.
type reaping struct {
	s       *Store
	o       store.ReapOptions
	scan    bool            // test-only: remember the scan (mutations)
	removed []store.Removal // what the latest step removed
	lost    []store.Removal // what a step whose answer was lost removed
	after   []string        // the limits a step out of room left unsettled
	full    bool            // the latest step ran out of room
}

// step is one step of the reap.
func (g *reaping) step(x *step) error {
	g.full = false
	if x.again {
		g.lost = append(g.lost[:0], g.removed...)
	}
	g.removed = g.removed[:0]
	recs, in, err := x.reapInput(g.o.Limits, g.o.DryRun)
	if err != nil || x.full {
		g.full = x.full // an unfinished supersede took the room
		return err
	}
	if g.o.DryRun {
		g.dryRun(recs, in)
		return nil
	}
	if x.o.Mutations.Has(mutation.StaleVerdict) { // mutation (test-only): judge on the deadlines an earlier scan read (A1)
		x.mutStaleVerdict(&in)
	}
	_, rm, err := x.apply(recs, PlanSettle(in), "")
	if err != nil {
		return err
	}
	if g.full = x.full; g.full {
		// Once the sweep is done, the limits its tickets named are
		// settled: a later step's closure no longer reaches the limits
		// of the tickets removed.
		for n := range in.Slots {
			if !slices.Contains(g.after, n) {
				g.after = append(g.after, n)
			}
		}
	}
	g.removed = x.stillGone(g.lost, append(g.removed, rm...))
	if x.o.Mutations.Has(mutation.BlindReap) { // mutation (test-only): free a slot per ticket the scan listed (A2)
		names, err := x.limitNames(g.o.Limits)
		if err != nil {
			return err
		}
		for _, name := range names {
			if err := x.mutBlindReap(name, rm); err != nil {
				return err
			}
		}
	}
	return nil
}

// dryRun lists what the reap would remove.
func (g *reaping) dryRun(recs []Rec, in SettleInput) {
	in.DryRun = true
	gone := make([]bool, len(recs))
	for _, rm := range PlanSettle(in).Remove {
		gone[rm.Index] = true
		g.removed = append(g.removed, store.Removal{Ticket: in.Tickets[rm.Index].Ticket, Reason: store.Reaped, Evidence: rm.Evidence})
	}
	if g.scan {
		for i, r := range recs {
			g.s.scan.note(r, gone[i])
		}
	}
}

// reapInput is the planner's input of a reap of limits (all when none): the
// closure of the swept limits, every swept ticket judged (All), the others
// left alone.
func (x *step) reapInput(limits []string, dry bool) ([]Rec, SettleInput, error) {
	names, err := x.limitNames(limits)
	if err != nil {
		return nil, SettleInput{}, err
	}
	for _, name := range names {
		if _, ok, err := x.tx.Limit(name); err != nil {
			return nil, SettleInput{}, err
		} else if !ok {
			return nil, SettleInput{}, fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
		}
	}
	recs, lnames, err := x.gather(names)
	if err != nil {
		return nil, SettleInput{}, err
	}
	if !dry {
		if recs, err = x.carryOn(recs); err != nil || x.full {
			return nil, SettleInput{}, err
		}
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

// stillGone adds to removed what a step whose answer was lost removed and
// this one no longer finds, so that a reap reports its removals even when
// its answer was lost. (A ticket that another reaper removed in between is
// reported too: the event log says which one did.)
func (x *step) stillGone(lost, removed []store.Removal) []store.Removal {
	for _, rm := range lost {
		if slices.ContainsFunc(removed, func(o store.Removal) bool { return o.Ticket.ID == rm.Ticket.ID }) {
			continue
		}
		if _, ok, err := x.tx.Lookup(rm.Ticket.ID); err == nil && !ok {
			removed = append(removed, rm)
		}
	}
	return removed
}
