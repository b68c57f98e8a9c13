package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// Store is a [store.Store] made of the rules over a Backend.
type Store struct {
	b     Backend
	o     Options
	scan  mutScan     // test-only: this handle's last dry-run reap (mutations)
	stale staleStarts // test-only: this handle's last read of rate starts (mutations)
}

var _ store.Store = (*Store)(nil)

// New returns the store that keeps its state in b.
func New(b Backend, o Options) *Store { return &Store{b: b, o: o} }

// Backend is the backend beneath the rules.
func (s *Store) Backend() Backend { return s.b }

func (s *Store) update(ctx context.Context, fn func(x *step) error) error {
	_, err := s.updateMore(ctx, fn)
	return err
}

// updateMore is update, then the settles a step out of room left to the
// next steps (Bounded); more reports that there were some. Their failure
// is not the step's: it committed, and the next settle of those limits
// carries on.
func (s *Store) updateMore(ctx context.Context, fn func(x *step) error) (more bool, err error) {
	var next []string
	err = s.again(ctx, func(retried bool) error {
		return s.b.Update(ctx, func(tx Tx) error {
			x := newStep(tx, s)
			x.again = retried
			err := fn(x)
			next = x.more
			return err
		})
	})
	for n := 0; err == nil && len(next) > 0 && n < maxMore; n++ {
		more = true
		names := next
		if s.b.Update(ctx, func(tx Tx) error {
			x := newStep(tx, s)
			_, _, err := x.settle(names, false)
			next = x.more
			return err
		}) != nil {
			break
		}
	}
	return more, err
}

// maxMore bounds the settles after a step out of room.
const maxMore = 1000

// maxAgain bounds the steps run again after lost answers on a backend
// that is no Againer: a connection cut at each commit is a store that does
// not answer.
const maxAgain = 3

// An Againer is a Backend that says whether a step whose commit's answer
// was lost runs again: etcd's, while the request's time lasts (an election
// takes a second or two). n is how many ran again already.
type Againer interface {
	Again(ctx context.Context, start time.Time, n int) bool
}

// again runs a step, and runs it again while its commit's answer was lost
// (store.ErrUnknownOutcome) and the backend allows: the step reads what the lost
// one may have done, and each rule finds its own effect there (an enqueue
// its ticket, a release its tombstone) rather than doing it twice or
// failing. A step run again that cannot reach the store either leaves the
// lost one's outcome unknown: its error says so too, so that the caller
// may send the request again rather than take it as not done.
func (s *Store) again(ctx context.Context, run func(retried bool) error) error {
	start := time.Now()
	err := run(false)
	lost := false
	for n := 0; errors.Is(err, store.ErrUnknownOutcome) && s.runAgain(ctx, start, n); n++ {
		lost = true
		err = run(true)
	}
	if lost && errors.Is(err, store.ErrUnavailable) && !errors.Is(err, store.ErrUnknownOutcome) {
		err = fmt.Errorf("%w (%w)", err, store.ErrUnknownOutcome)
	}
	return err
}

func (s *Store) runAgain(ctx context.Context, start time.Time, n int) bool {
	if a, ok := s.b.(Againer); ok {
		return a.Again(ctx, start, n)
	}
	return n < maxAgain && ctx.Err() == nil
}

func (s *Store) view(ctx context.Context, fn func(x *step) error) error {
	return s.b.View(ctx, func(tx Tx) error { return fn(newStep(tx, s)) })
}

func (s *Store) String() string { return s.b.String() }
func (s *Store) Close() error   { return s.b.Close() }

// Watch implements [store.Store].
func (s *Store) Watch(ctx context.Context, id string) (store.Bell, error) {
	if err := store.CheckID(id); err != nil {
		return nil, err
	}
	return s.b.Watch(ctx, id)
}

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, id string) (store.Ticket, error) {
	if err := store.CheckID(id); err != nil {
		return store.Ticket{}, err
	}
	var out store.Ticket
	err := s.view(ctx, func(x *step) error {
		r, ok, err := x.tx.Lookup(id)
		if err != nil {
			return err
		}
		if !ok {
			return x.notFound(id)
		}
		out, err = x.viewOf(r)
		return err
	})
	return out, err
}

// lookupOwn finds t as its holder knows it: the live ticket of t's id and
// fence, or (lost) why it is gone; err is the store's own failure.
func (x *step) lookupOwn(t store.Ticket) (r Rec, lost, err error) {
	r, ok, err := x.tx.Lookup(t.ID)
	if err != nil {
		return r, nil, err
	}
	if !ok {
		err := x.notFound(t.ID)
		if !errors.Is(err, store.ErrNotFound) {
			return r, nil, err // a tombstone it cannot read: the store's error, not a lost lease
		}
		return r, fmt.Errorf("%w: %w", store.ErrLost, err), nil
	}
	if r.Fence != t.Fence {
		return r, fmt.Errorf("%w: ticket %s has fence %d, not %d", store.ErrLost, t.ID, r.Fence, t.Fence), nil
	}
	return r, nil, nil
}

// heldNoMore says why a renewal of t, which its holder was told is held,
// is lost when the store has it waiting: nothing moves a held ticket back
// into the queue, but a store file replaced by an older copy (a restored
// backup) can. The store no longer counts its slots, so the job must stop
// (the renewal is lost), and its ticket goes: left waiting, it would be
// admitted with nobody behind it.
func heldNoMore(t store.Ticket, r Rec) string {
	if t.State != store.Held || r.State == store.Held {
		return ""
	}
	return "was held by its holder but waits in the store (its file replaced by an older copy?)"
}

// renewalLost says why a renewal of t loses its ticket r, or "": held by
// its holder and waiting in the store (heldNoMore), or held and expired.
// The renewer is alive by definition: only the clock judges it here (and
// the judge only adds what it knows of an expired one). A waiter holds no
// slot: its late renewal is accepted while its ticket is still here.
func (x *step) renewalLost(t store.Ticket, r Rec) string {
	if ev := heldNoMore(t, r); ev != "" && !x.o.Mutations.Has(mutation.HeldNoMore) { // mutation (test-only): renew it as a waiter
		return ev
	}
	held := r.State == store.Held || x.o.Mutations.Has(mutation.LateRenewalDeath)         // mutation (test-only): a waiter's late renewal refused
	if ev := x.expiry(r); ev != "" && held && !x.o.Mutations.Has(mutation.RenewExpired) { // mutation (test-only): renew an expired, unswept ticket (A7)
		ev, _ = Verdict(Queued{Ticket: x.view(r, 0), Expired: ev}, x.o.Judge, true)
		return ev
	}
	return ""
}

// Renew implements [store.Store]. A renewal of a waiting ticket also sweeps
// its limits (and the limits their tickets reach), so that waiters free a
// dead holder's slot within its TTL even when nobody runs reap.
func (s *Store) Renew(ctx context.Context, t store.Ticket, ttl time.Duration) (store.Ticket, error) {
	if err := store.CheckTTL(ttl); err != nil {
		return store.Ticket{}, err
	}
	if err := store.CheckID(t.ID); err != nil {
		return store.Ticket{}, err
	}
	if out, done, err := s.renewShared(ctx, t, ttl); done || err != nil {
		return out, err
	}
	var out store.Ticket
	var lostErr error
	err := s.update(ctx, func(x *step) error {
		out, lostErr = store.Ticket{}, nil
		r, lost, err := x.lookupOwn(t)
		if err != nil || lost != nil {
			lostErr = lost
			return err
		}
		if ev := x.renewalLost(t, r); ev != "" {
			if err := x.remove(r, store.Reaped, ev, nil); err != nil {
				return err
			}
			lostErr = fmt.Errorf("%w: ticket %s %s", store.ErrLost, t.ID, ev)
			_, _, err := x.settle(r.Names(), false)
			return err
		}
		// A ticket of a previous boot stays one, and the settle below removes it.
		if err := x.renew(&r, ttl); err != nil {
			return err
		}
		if r.State == store.Held {
			out = x.view(r, 0)
			return nil
		}
		if q, ok := x.tx.(Settler); ok {
			if settled, err := q.Settled(r.Names()); err != nil || settled {
				if err == nil {
					out, err = x.viewOf(r)
				}
				return err
			}
		}
		recs, _, err := x.settle(r.Names(), false)
		if err != nil {
			return err
		}
		var found bool
		if out, found = x.viewIn(recs, t.ID); !found {
			// The sweep judged this very holder dead (a late request from
			// a process that has since died): its removal stands.
			lostErr = fmt.Errorf("%w: ticket %s was reaped: its holder is dead", store.ErrLost, t.ID)
		}
		return nil
	})
	if err == nil {
		err = lostErr
	}
	return out, err
}

// renewShared renews t in a shared step when the backend has them and the
// renewal changes nothing but t's deadline: t is live, not late, and no
// settle of its limits is due (a waiter's renewal sweeps them otherwise).
// done is false when it declined: the caller then renews in a whole step,
// which also reports a lost ticket. Other shared steps only move live
// tickets' deadlines on, so what made the settle unnecessary still holds
// when it commits.
func (s *Store) renewShared(ctx context.Context, t store.Ticket, ttl time.Duration) (out store.Ticket, done bool, err error) {
	sh, ok := s.b.(Sharer)
	if !ok || mutation.String(s.o.Mutations) != "" { // planted bugs live on the whole steps' path
		return store.Ticket{}, false, nil
	}
	err = s.again(ctx, func(bool) error {
		return sh.UpdateShared(ctx, func(tx Tx) error {
			out, done = store.Ticket{}, false
			x := newStep(tx, s)
			r, lost, err := x.lookupOwn(t)
			if err != nil || lost != nil || x.expiry(r) != "" || heldNoMore(t, r) != "" {
				return err
			}
			if r.State != store.Held {
				if settled, err := x.settled(r.Names()); err != nil || !settled {
					return err
				}
			}
			if err := x.renew(&r, ttl); err != nil {
				return err
			}
			if r.State == store.Held {
				out = x.view(r, 0)
			} else if out, err = x.viewOf(r); err != nil {
				return err
			}
			done = true
			return nil
		})
	})
	return out, done, err
}

// renew renews r for ttl from now and writes it. The deadline moves on
// the clock of the boot it was written in (unlike extend's).
func (x *step) renew(r *Rec, ttl time.Duration) error {
	r.DeadlineMono, r.TTL, r.Renewed = x.now.Mono+ttl, ttl, x.now.Wall
	return x.put(*r)
}

// settled reports whether a settle of limits would change nothing.
func (x *step) settled(limits []string) (bool, error) {
	if q, ok := x.tx.(Settler); ok {
		return q.Settled(limits)
	}
	recs, names, err := x.gather(limits)
	if err != nil {
		return false, err
	}
	in, err := x.planInput(recs, names)
	if err != nil {
		return false, err
	}
	return PlanSettle(in).Empty(), nil
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, t store.Ticket, why store.Reason) (bool, error) {
	if err := store.CheckID(t.ID); err != nil {
		return false, err
	}
	var removed bool
	err := s.update(ctx, func(x *step) error {
		lostRemoved := x.again && removed // what the step whose answer was lost did
		removed = false
		r, ok, err := x.tx.Lookup(t.ID)
		if err != nil {
			return err
		}
		if !ok {
			removed, err = x.releaseAbsent(t, why, lostRemoved)
			return err
		}
		if t.Fence != 0 && r.Fence != t.Fence {
			return nil
		}
		if err := x.remove(r, why, "", nil); err != nil {
			return err
		}
		removed = true
		_, _, err = x.settle(r.Names(), false)
		return err
	})
	return removed, err
}

// releaseAbsent is a release of t, which is not live: it logs that a
// holder noticed its lease lost and tombstones an id never created (a
// cancel before its create). lostRemoved: a step of this release whose
// answer was lost removed t; removed then tells whether that removal
// stands.
func (x *step) releaseAbsent(t store.Ticket, why store.Reason, lostRemoved bool) (removed bool, err error) {
	if x.again {
		if tomb, dead, err := x.tx.Tomb(t.ID); err != nil || dead {
			// Gone, and what the lost step did stands: its removal, or
			// its event of a "lost" release, which is not logged again
			// (the holder noticed its loss once).
			return lostRemoved && tomb.Reason == why, err
		}
	}
	if x.o.Mutations.Has(mutation.ReleaseCounter) { // mutation (test-only): a missing ticket still frees a slot (A4)
		if err := x.mutFreeOne(t.Limit); err != nil {
			return false, err
		}
	}
	if x.o.Mutations.Has(mutation.ReleaseNoCompare) { // mutation (test-only): remove whoever holds t's slot now (A10)
		if err := x.mutReleaseSlot(t, why); err != nil {
			return false, err
		}
	}
	if why == store.Lost && store.CheckLimits(t.Names()) == nil && store.CheckWeight(t.Weight) == nil {
		// Reaped or released by someone else: log that its holder
		// noticed, for "when did it go away".
		if err := x.log(eventOf{kind: string(store.Lost), evidence: "holder presumed its lease lost"}, recOf(t)); err != nil {
			return false, err
		}
	}
	if _, dead, err := x.tx.Tomb(t.ID); err != nil || dead {
		return false, err
	}
	return false, x.tombstone(t.ID, why, nil) // cancel before create: refuse the create when it lands
}

// recOf is the record form of a caller's ticket, for logging only.
func recOf(t store.Ticket) Rec {
	r := Rec{ID: t.ID, Limit: t.Names()[0], Limits: t.Names(), Weight: t.Weighs(), State: t.State, Fence: t.Fence, Slot: t.Slot, Holder: t.Holder}
	if t.State == store.Held { // only indexes a record could hold: the event is read back as strictly
		r.Indexes = map[string][]int{}
		for _, name := range r.Limits {
			ix := t.In(name)
			if len(ix) != r.Weight || slices.ContainsFunc(ix, func(n int) bool { return n < 0 || n >= store.MaxSlots }) {
				ix = nil
			}
			r.Indexes[name] = ix
		}
	}
	return r
}

// Cancel implements [store.Store]: Release with store.Cancelled.
func (s *Store) Cancel(ctx context.Context, t store.Ticket) (bool, error) {
	return s.Release(ctx, t, store.Cancelled)
}

// SetChild implements [store.Store].
func (s *Store) SetChild(ctx context.Context, t store.Ticket, pgid int, pgidStart uint64) (store.Ticket, error) {
	if err := store.CheckID(t.ID); err != nil {
		return store.Ticket{}, err
	}
	var out store.Ticket
	var lostErr error
	err := s.update(ctx, func(x *step) error {
		out, lostErr = store.Ticket{}, nil
		r, ok, err := x.tx.Lookup(t.ID)
		if err != nil {
			return err
		}
		if !ok || r.Fence != t.Fence {
			lostErr = fmt.Errorf("%w: ticket %s is gone", store.ErrLost, t.ID)
			return nil
		}
		if r.DeadlineBoot != x.now.Boot || x.now.Mono >= r.DeadlineMono {
			lostErr = fmt.Errorf("%w: ticket %s expired", store.ErrLost, t.ID)
			return nil
		}
		r.Holder.Pgid, r.Holder.PgidStart = pgid, pgidStart
		if err := x.put(r); err != nil {
			return err
		}
		out, err = x.viewOf(r)
		return err
	})
	if err == nil {
		err = lostErr
	}
	return out, err
}

// Events implements [store.Store].
func (s *Store) Events(ctx context.Context, limit string, n int) ([]store.Event, error) {
	if limit != "" {
		if err := store.CheckLimitName(limit); err != nil {
			return nil, err
		}
	}
	r, ok := s.b.(EventReader)
	if !ok {
		return nil, fmt.Errorf("%w: %s keeps no events", store.ErrUnavailable, s.b)
	}
	out, err := r.Events(ctx, limit, n)
	if out == nil && err == nil {
		out = []store.Event{}
	}
	return out, err
}

// An EventReader reads a backend's event log: the newest n events (of one
// limit, or of all when limit is ""), oldest first.
type EventReader interface {
	Events(ctx context.Context, limit string, n int) ([]store.Event, error)
}

// viewLimits checks the named limits and reads them in one view: fn gets
// them sorted and each once, or all the store's when none is named.
func (s *Store) viewLimits(ctx context.Context, limits []string, fn func(x *step, names []string) error) error {
	for _, l := range limits {
		if err := store.CheckLimitName(l); err != nil {
			return err
		}
	}
	return s.view(ctx, func(x *step) error {
		names, err := x.limitNames(limits)
		if err != nil {
			return err
		}
		return fn(x, names)
	})
}

// Snapshot implements [store.Store]: a ticket of several limits is listed
// under each (store.Snapshot.AddLimit).
func (s *Store) Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error) {
	var out store.Snapshot
	err := s.viewLimits(ctx, limits, func(x *step, names []string) error {
		out = store.Snapshot{Now: x.now.Wall, Limits: []store.Limit{}, Tickets: []store.Ticket{}}
		// Every queue is read before out.Tickets is made, at its size: grown
		// a limit at a time, it would copy thousands of tickets several times.
		type limitQueue struct {
			lim store.Limit
			q   []Rec
		}
		all := make([]limitQueue, 0, len(names))
		total, most := 0, 0
		for _, name := range names {
			lim, ok, err := x.tx.Limit(name)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
			}
			q, err := x.tx.Queue(name)
			if err != nil {
				return err
			}
			all = append(all, limitQueue{limitOf(name, lim), q})
			total, most = total+len(q), max(most, len(q))
		}
		out.Tickets = make([]store.Ticket, 0, total)
		ts := make([]store.Ticket, 0, most) // one limit's views at a time: AddLimit copies them
		for _, l := range all {
			ts = ts[:0]
			for i := range l.q {
				ts = append(ts, x.view(l.q[i], 0))
			}
			out.AddLimit(l.lim, ts)
		}
		return nil
	})
	return out, err
}

// Heads implements [store.HeadReader]: Snapshot cut to each limit's held
// tickets and first waiter (store.Snapshot.Heads). In a FIFO limit the
// first waiter is the oldest: a HeadQueuer reads it and only counts the
// others. Any other order may put any waiter first, and the whole queue is
// read.
func (s *Store) Heads(ctx context.Context, limits ...string) (store.Snapshot, error) {
	var out store.Snapshot
	err := s.viewLimits(ctx, limits, func(x *step, names []string) error {
		out = store.Snapshot{Now: x.now.Wall, Limits: []store.Limit{}, Tickets: []store.Ticket{}}
		hq, _ := x.tx.(HeadQueuer)
		for _, name := range names {
			lim, ok, err := x.tx.Limit(name)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
			}
			var q []Rec
			waiting := -1 // counted by AddLimit
			if hq != nil && lim.Policy.Ordered() == store.FIFO {
				q, waiting, err = hq.QueueHeads(name)
			} else {
				q, err = x.tx.Queue(name)
			}
			if err != nil {
				return err
			}
			ts := make([]store.Ticket, len(q))
			for i := range q {
				ts[i] = x.view(q[i], 0)
			}
			n := len(out.Tickets)
			out.AddLimit(limitOf(name, lim), ts)
			if waiting >= 0 {
				out.Limits[len(out.Limits)-1].Waiting = waiting
			}
			heads := out.Tickets[:n]
			for _, t := range out.Tickets[n:] {
				if t.State == store.Held || t.Position == 1 {
					heads = append(heads, t)
				}
			}
			out.Tickets = heads
		}
		return nil
	})
	return out, err
}

// SetLimit implements [store.Store].
func (s *Store) SetLimit(ctx context.Context, name string, slots int) (store.Limit, error) {
	if err := store.CheckLimitName(name); err != nil {
		return store.Limit{}, err
	}
	if err := store.CheckSlots(slots); err != nil {
		return store.Limit{}, err
	}
	var out store.Limit
	err := s.update(ctx, func(x *step) error {
		lim, ok, err := x.tx.Limit(name)
		if err != nil {
			return err
		}
		if !ok {
			lim.Created = x.now.Wall
			if err := x.tx.PutCounts(store.Counts{Limit: name}); err != nil { // a new limit counts from zero
				return err
			}
		}
		lim.Slots = slots
		if err := x.tx.PutLimit(name, lim); err != nil {
			return err
		}
		recs, _, err := x.settle([]string{name}, false)
		if err != nil {
			return err
		}
		out = store.Limit{Name: name, Slots: slots, Created: lim.Created, Policy: lim.Policy}
		for _, r := range recs {
			switch {
			case !r.Has(name):
			case r.State == store.Held:
				out.Held += r.Weighs() // slots, not tickets
			default:
				out.Waiting++
			}
		}
		return nil
	})
	return out, err
}

// RemoveLimit implements [store.Store]. With force, every ticket naming
// the limit is removed entirely, and the other limits they named are
// settled: their slots there are free now.
func (s *Store) RemoveLimit(ctx context.Context, name string, force bool) error {
	if err := store.CheckLimitName(name); err != nil {
		return err
	}
	var lostAt time.Time // when a step whose answer was lost ran
	full := false
	step := func(x *step) error {
		at := lostAt
		lostAt = x.now.Wall
		if lim, ok, err := x.tx.Limit(name); err != nil {
			return err
		} else if x.again && (!ok || lim.Created.After(at)) {
			full = false
			return nil // the lost step removed it (and another made it again since)
		} else if !ok {
			return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
		}
		var err error
		full, err = x.removeLimit(name, force)
		return err
	}
	for n := 0; ; n++ {
		if err := s.update(ctx, step); err != nil || !full || n >= maxMore {
			return err
		}
	}
}

// removeLimit removes limit name, which exists, and (force) every ticket
// naming it, and settles the other limits those named. full: the step
// had room for only some of the tickets; the next step removes the rest,
// then the limit.
func (x *step) removeLimit(name string, force bool) (full bool, err error) {
	recs, err := x.tx.Queue(name)
	if err != nil {
		return false, err
	}
	if len(recs) > 0 && !force {
		return false, fmt.Errorf("%w: limit %q has %d tickets", store.ErrLimitInUse, name, len(recs))
	}
	var others []string
	for _, r := range recs {
		if full = !x.fits(r); full {
			break
		}
		if err := x.remove(r, store.ForceReleased, "limit removed", nil); err != nil {
			return false, err
		}
		for _, l := range r.Names() {
			if l != name && !slices.Contains(others, l) {
				others = append(others, l)
			}
		}
	}
	if !full {
		if err := x.tx.DeleteLimit(name); err != nil {
			return false, err
		}
	}
	if len(others) > 0 {
		_, _, err = x.settle(others, false)
	}
	return full, err
}

// Counts implements [store.Store].
func (s *Store) Counts(ctx context.Context, limits ...string) ([]store.Counts, error) {
	for _, name := range limits {
		if err := store.CheckLimitName(name); err != nil {
			return nil, err
		}
	}
	out := []store.Counts{}
	err := s.view(ctx, func(x *step) error {
		out = out[:0]
		names, err := x.limitNames(limits)
		if err != nil {
			return err
		}
		for _, name := range names {
			if _, ok, err := x.tx.Limit(name); err != nil {
				return err
			} else if !ok {
				return fmt.Errorf("%w: %q", store.ErrLimitNotFound, name)
			}
			c, err := x.tx.Counts(name)
			if err != nil {
				return err
			}
			c.Limit = name
			out = append(out, c)
		}
		return nil
	})
	return out, err
}

// Settle sweeps limits and admits their waiters (and the closure of the
// limits their tickets name), as every write that can free or add
// capacity does in its own step. A backend whose own paths change the
// store without the rules calls it: etcd's renewal is a keep-alive, and a
// lease its server expires frees a slot unseen. With id, t is that ticket
// as it then stands (found false: it is gone).
func (s *Store) Settle(ctx context.Context, limits []string, id string) (t store.Ticket, found bool, err error) {
	for _, l := range limits {
		if err := store.CheckLimitName(l); err != nil {
			return store.Ticket{}, false, err
		}
	}
	more, err := s.updateMore(ctx, func(x *step) error {
		t, found = store.Ticket{}, false
		recs, _, err := x.settle(limits, false)
		if err == nil && id != "" {
			t, found = x.viewIn(recs, id)
		}
		return err
	})
	if err == nil && more && id != "" {
		t, err = s.Get(ctx, id)
		if found = err == nil; errors.Is(err, store.ErrNotFound) {
			err = nil
		}
	}
	return t, found, err
}
