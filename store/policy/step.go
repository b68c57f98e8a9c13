package policy

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// step is one atomic step of the rules: the backend's Tx and the clock
// reading taken for it.
type step struct {
	tx  Tx
	s   *Store
	o   *Options
	now Instant
	// again: an earlier run of this step lost its commit's answer, so what
	// it wrote may be in what this one reads.
	again bool
	// full: a settle ran out of room (Bounded); more is the limits the
	// store settles again once this step commits.
	full bool
	more []string
}

// fits reports whether the step has room to remove or admit r.
func (x *step) fits(r Rec) bool {
	b, ok := x.tx.(Bounded)
	return !ok || b.Fits(r)
}

func newStep(tx Tx, s *Store) *step { return &step{tx: tx, s: s, o: &s.o, now: tx.Now()} }

// expiry is the store's clock's verdict on a ticket: why its lease is
// over, or "" while it runs.
func (x *step) expiry(r Rec) string {
	if ex, ok := x.tx.(Expirer); ok {
		return ex.Expired(r)
	}
	if r.Quiet && r.State == store.Waiting && r.DeadlineBoot == x.now.Boot {
		return "" // a quiet waiter is proven dead or lined, never late
	}
	if r.DeadlineBoot != x.now.Boot {
		if x.tx.PreviousBoot(r.DeadlineBoot) {
			return "previous boot"
		}
		return "" // another machine's boot, or one forgotten
	}
	if late := x.now.Mono - r.DeadlineMono; late >= 0 {
		return "expired " + roundAgo(late) + " ago"
	}
	return ""
}

func roundAgo(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// extend gives r a whole lease of ttl from now.
func (x *step) extend(r *Rec, ttl time.Duration) {
	r.DeadlineBoot, r.DeadlineMono = x.now.Boot, x.now.Mono+ttl
}

// view turns a record into the caller's Ticket, under its first limit;
// position is 1-based among that limit's waiters.
func (x *step) view(r Rec, position int) store.Ticket { return r.View(x.now, position) }

// position is a waiting ticket's 1-based place among its first limit's
// waiters (0 for a held one).
func (x *step) position(r Rec) (int, error) {
	if r.State != store.Waiting {
		return 0, nil
	}
	if pos, ok, err := x.arrangedPosition(r); ok || err != nil {
		return pos, err
	}
	if p, ok := x.tx.(Positioner); ok {
		return p.Position(r)
	}
	q, err := x.tx.Queue(r.Limit)
	if err != nil {
		return 0, err
	}
	pos := 1
	for _, o := range q {
		if o.Fence < r.Fence && o.State == store.Waiting {
			pos++
		}
	}
	return pos, nil
}

// viewOf is r as its owner reads it, with its place in line.
func (x *step) viewOf(r Rec) (store.Ticket, error) {
	pos, err := x.position(r)
	return x.view(r, pos), err
}

// notFound is the error of an id that is not live: superseded (naming the
// successor), removed, or never seen.
func (x *step) notFound(id string) error {
	if t, ok, err := x.tx.Tomb(id); err != nil {
		return err
	} else if ok && t.By != nil {
		return fmt.Errorf("%w: %w", store.ErrNotFound, &store.SupersededError{ID: id, By: *t.By})
	} else if ok {
		return fmt.Errorf("%w: ticket %s was %s", store.ErrNotFound, id, t.Reason)
	}
	return fmt.Errorf("%w: ticket %s", store.ErrNotFound, id)
}

// gather reads the tickets of limits and, transitively, of every limit they
// name: the closure a settle works on, since admitting a ticket of several
// limits can unblock tickets behind it in its others. It returns each
// ticket once, in fence order (the one queue order of every limit), and
// every limit it read.
func (x *step) gather(limits []string) ([]Rec, []string, error) {
	todo := slices.Clone(limits)
	var recs []Rec
	seen := map[uint64]bool{}
	for i := 0; i < len(todo); i++ {
		q, err := x.tx.Queue(todo[i])
		if err != nil {
			return nil, nil, err
		}
		for _, r := range q {
			if seen[r.Fence] {
				continue
			}
			seen[r.Fence] = true
			recs = append(recs, r)
			for _, l := range r.Names() {
				if !slices.Contains(todo, l) {
					todo = append(todo, l)
				}
			}
		}
	}
	if len(todo) > 1 {
		slices.SortFunc(recs, func(a, b Rec) int { return cmp.Compare(a.Fence, b.Fence) })
	}
	return recs, todo, nil
}

// put writes r in its stored form.
func (x *step) put(r Rec) error {
	r.Compact()
	return x.tx.Put(r)
}

// remove deletes a live ticket, tombstones its id and logs why in each of
// its limits. It is the only way a ticket leaves the store, and so the only
// thing that frees a slot. by names the newer run that superseded it.
func (x *step) remove(r Rec, why store.Reason, evidence string, by *store.Successor) error {
	if err := x.tx.Delete(r); err != nil {
		return err
	}
	if err := x.tombstone(r.ID, why, by); err != nil {
		return err
	}
	x.tx.Gone(r)
	e := eventOf{kind: string(why), evidence: evidence, held: r.State == store.Held}
	if by != nil {
		e.by = by.Ticket
	}
	return x.log(e, r)
}

func (x *step) tombstone(id string, why store.Reason, by *store.Successor) error {
	if x.o.Mutations.Has(mutation.NoTombstone) { // mutation (test-only): forget removed ids (C5, S7)
		return nil
	}
	return x.tx.PutTomb(id, Tomb{Reason: why, Wall: x.now.Wall, Boot: x.now.Boot, Mono: x.now.Mono, By: by})
}

// eventOf is what an event says beside its ticket.
type eventOf struct {
	kind, evidence string
	by             string // the newer run of a "superseded" or "replaced" event
	held           bool   // the event removes r, which was held: it says for how long
}

// log logs one event in each of the ticket's limits, each with the ticket's
// lowest slot index there, and counts it in the same step.
func (x *step) log(o eventOf, r Rec) error {
	for _, name := range r.Names() {
		// The log is a limit's: a limit that is gone (its store's file
		// deleted under its holders) logs nothing, so that one made again
		// counts only its own events.
		if _, ok, err := x.tx.Limit(name); err != nil {
			return err
		} else if !ok {
			continue
		}
		e := store.Event{Time: x.now.Wall, Kind: o.kind, Limit: name, Ticket: r.ID,
			Fence: r.Fence, Slot: -1, Host: r.Holder.Host, Pid: r.Holder.Pid, User: r.Holder.User,
			Command: r.Holder.Command(), Evidence: o.evidence, By: o.by}
		ix := r.In(name)
		if len(ix) > 0 {
			e.Slot = ix[0]
		}
		if len(r.Limits) > 1 {
			e.Limits = r.Limits
		}
		if w := r.Weighs(); w > 1 {
			e.Weight, e.Indexes = w, ix
		}
		if o.kind == "admitted" {
			e.Waited = store.WaitedFor(r.Created, x.now.Wall)
		}
		if o.held {
			e.Held = store.HeldFor(r.Admitted, x.now.Wall)
		}
		if err := x.tx.Log(e); err != nil {
			return err
		}
		if err := x.count(e); err != nil {
			return err
		}
	}
	return nil
}

// count adds an event to its limit's counters (log has checked that the
// limit exists).
func (x *step) count(e store.Event) error {
	c, err := x.tx.Counts(e.Limit)
	if err != nil {
		return err
	}
	c.Limit = e.Limit
	c.Add(e)
	return x.tx.PutCounts(c)
}

// settle sweeps the limits a write touched and promotes their waiters: the
// step every write that can free or add capacity ends with. It works on
// the closure of those limits (gather): one PlanSettle over all their
// tickets, each once, in fence order, on the records read in this step. all
// judges every ticket (reap). It returns the tickets that remain, in order,
// and the removals.
func (x *step) settle(limits []string, all bool) ([]Rec, []store.Removal, error) {
	recs, names, err := x.gather(limits)
	if err != nil {
		return nil, nil, err
	}
	return x.settleOn(recs, names, all, "")
}

// settleOn is settle on the closure recs of limits names, as gather read it
// in this step and the caller changed it since. fresh is the id of a ticket
// this very step wrote: its enqueuer is alive by definition, so it is
// neither judged nor removed.
func (x *step) settleOn(recs []Rec, names []string, all bool, fresh string) ([]Rec, []store.Removal, error) {
	recs, err := x.carryOn(recs)
	if err != nil {
		return nil, nil, err
	}
	if x.full {
		x.more = names
		return recs, nil, nil
	}
	in, err := x.planInput(recs, names)
	if err != nil {
		return nil, nil, err
	}
	in.All = all
	for i := range in.Tickets {
		in.Tickets[i].Fresh = fresh != "" && in.Tickets[i].Ticket.ID == fresh
	}
	if x.o.Mutations.Has(mutation.StaleVerdict) { // mutation (test-only): judge on the deadlines an earlier scan read (A1)
		x.mutStaleVerdict(&in)
	}
	live, removed, err := x.apply(recs, PlanSettle(in), fresh)
	if x.full {
		x.more = names
	}
	return live, removed, err
}

// planInput is the planner's input on recs, the closure of names, judged by
// the store's clock.
func (x *step) planInput(recs []Rec, names []string) (SettleInput, error) {
	in := SettleInput{Slots: make(map[string]int, len(names)), Tickets: make([]Queued, len(recs)),
		Judge: x.o.Judge, JudgeExpired: true, Keep: x.o.Keep, Mutations: x.o.Mutations, Now: x.now.Wall}
	for _, name := range names {
		lim, ok, err := x.tx.Limit(name)
		if err != nil {
			return in, err
		}
		if !ok {
			continue // a ticket of a limit that is gone is never admitted
		}
		in.Slots[name] = lim.Slots
		if !lim.Policy.IsFIFO() {
			if in.Policies == nil {
				in.Policies, in.Starts = map[string]store.Policy{}, map[string][]time.Time{}
			}
			in.Policies[name], in.Starts[name] = lim.Policy, x.starts(name, lim)
		}
	}
	for i, r := range recs {
		in.Tickets[i] = Queued{Ticket: x.view(r, 0), Expired: x.expiry(r), Quiet: r.Quiet && r.State == store.Waiting}
	}
	return in, nil
}

// apply carries out a settle's plan on recs (the planner's input): each
// removal reaps its ticket, each admission takes its slot indexes in each of
// its limits. It returns the tickets that remain, in order, with the
// admitted ones held.
func (x *step) apply(recs []Rec, plan SettlePlan, fresh string) ([]Rec, []store.Removal, error) {
	var removed []store.Removal
	gone := make([]bool, len(recs))
	for _, rm := range plan.Remove {
		r := recs[rm.Index]
		if !x.fits(r) {
			x.full = true // the admissions may rest on this removal
			return x.unapplied(recs, gone), removed, nil
		}
		if err := x.remove(r, store.Reaped, rm.Evidence, nil); err != nil {
			return nil, nil, err
		}
		gone[rm.Index] = true
		removed = append(removed, store.Removal{Ticket: x.view(r, 0), Reason: store.Reaped, Evidence: rm.Evidence})
	}
	if err := x.charge(plan.Starts); err != nil {
		return nil, nil, err
	}
	for _, a := range plan.Admit {
		r := &recs[a.Index]
		if !x.fits(*r) {
			x.full = true
			return x.unapplied(recs, gone), removed, nil
		}
		r.State, r.Slot, r.Indexes, r.Admitted = store.Held, a.Slot, a.Indexes, x.now.Wall
		// A whole lease from the admission: its waiter may have renewed
		// nothing (quiet), or late, or be about to renew on a slow
		// machine; it learns what is left when it reads the ticket.
		r.Quiet = false
		x.extend(r, r.TTL)
		if err := x.put(*r); err != nil {
			return nil, nil, err
		}
		if err := x.log(eventOf{kind: "admitted"}, *r); err != nil {
			return nil, nil, err
		}
		x.tx.Ring(*r)
	}
	for _, i := range plan.Wake {
		if r := recs[i]; r.ID != fresh && !slices.Contains(plan.Line, i) {
			x.tx.Ring(r) // first in a limit whose rate is spent: it waits for the window
		}
	}
	for _, i := range plan.Line {
		// Into line: renewing from now, with a whole lease to start it,
		// and told so by its bell.
		r := &recs[i]
		r.Quiet = false
		x.extend(r, r.TTL)
		if err := x.put(*r); err != nil {
			return nil, nil, err
		}
		if r.ID != fresh { // its enqueuer reads the answer
			x.tx.Ring(*r)
		}
	}
	return x.unapplied(recs, gone), removed, nil
}

// unapplied is recs but the gone.
func (x *step) unapplied(recs []Rec, gone []bool) []Rec {
	live := recs[:0:0]
	for i, r := range recs {
		if !gone[i] {
			live = append(live, r)
		}
	}
	return live
}

// viewIn is the ticket id among recs as its owner reads it, with its place.
func (x *step) viewIn(recs []Rec, id string) (store.Ticket, bool) {
	for i, r := range recs {
		if r.ID != id {
			continue
		}
		pos := 0
		if pol, ok, err := x.ordering(r.Limit); r.State == store.Waiting && ok && err == nil {
			pos = x.placeIn(recs, r, pol)
		} else if r.State == store.Waiting {
			pos = 1
			for _, o := range recs[:i] {
				if o.State == store.Waiting && o.Has(r.Limit) {
					pos++
				}
			}
		}
		return x.view(r, pos), true
	}
	return store.Ticket{}, false
}

// limitNames is the named limits, sorted and each once, or all the store's
// limits when none is named.
func (x *step) limitNames(limits []string) ([]string, error) {
	if len(limits) == 0 {
		return x.tx.LimitNames()
	}
	names := slices.Clone(limits)
	slices.Sort(names)
	return slices.Compact(names), nil
}
