package storetest_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/storetest"
)

// memStore is a small in-memory reference Store for testing the suite itself:
// the correct version must pass every case, and each bug (a mutant) must make
// its case fail. bug names one deliberate defect; "" is the correct store.
// Several memStores may share one memData: a reopened store, or a handle whose
// clock reads skew ahead (another reaper).
type memStore struct {
	d    *memData
	bug  string
	skew time.Duration
	hint []store.Ticket // bugs "reap-trusts-scan", "reap-double-free": this handle's last dry-run scan

	closed atomic.Bool
}

// closedErr is the error of an operation after Close.
func (s *memStore) closedErr() error {
	if s.closed.Load() && !s.is("close-noop") {
		return fmt.Errorf("%w: mem://", store.ErrClosed)
	}
	return nil
}

func (s *memStore) Close() error {
	s.closed.Store(true)
	return nil
}

func (s *memStore) Cancel(ctx context.Context, tk store.Ticket) (bool, error) {
	switch {
	case s.is("cancel-as-released"):
		return s.Release(ctx, tk, store.Released)
	case s.is("cancel-waiting-only"):
		if err := s.closedErr(); err != nil {
			return false, err
		}
		s.d.mu.Lock()
		t := s.d.tickets[tk.ID]
		held := t != nil && t.held()
		s.d.mu.Unlock()
		if held {
			return false, nil // "promoted meanwhile": left to its lease
		}
	case s.is("cancel-missing-frees"):
		s.d.mu.Lock()
		t, l := s.d.tickets[tk.ID], s.d.limits[tk.Limit]
		if t == nil && l != nil {
			s.settle(map[string]int{l.name: 1}, tk.Names())
		}
		s.d.mu.Unlock()
	}
	return s.Release(ctx, tk, store.Cancelled)
}

type memData struct {
	mu      sync.Mutex
	now     time.Duration
	wall    time.Time
	limits  map[string]*memLimit
	tickets map[string]*memTicket
	tombs   map[string]store.Reason
	// succ names the successor of each superseded id (docs/leases.md §2.1
	// item 10): a tombstone that says who took its place.
	succ   map[string]store.Successor
	by     string        // the newer run of the "superseded" and "replaced" events being logged
	held   time.Duration // Event.Held of the events being logged: a held ticket's removal
	fence  uint64
	bells  map[string]map[*memBell]bool
	judge  store.Judge
	events []store.Event // the newest store.MaxEvents, oldest first
	seq    uint64        // last event sequence number
	// explicit spells out Limits, Weight and Indexes of tickets of one
	// limit and weight one, which the suite must accept as it accepts the
	// old form.
	explicit bool
}

type memLimit struct {
	name    string
	slots   int
	created time.Time
	used    int          // bug "counter": a counter beside the tickets
	fence   uint64       // bug "fence-per-limit"
	leak    int          // slots a buggy removal forgot to free
	counts  store.Counts // its counters, gone with it (mem_counts_test.go)
	policy  store.Policy // its scheduling policy (mem_schedule_test.go)
	starts  []time.Time  // when the admissions its rate counts were made, oldest first
}

// A memTicket is one ticket, whatever the number of its limits. t holds
// what does not depend on the limit it is viewed under (t.Limit is its
// first limit); ix is where it holds slots.
type memTicket struct {
	t        store.Ticket
	names    []string
	w        int              // slots it counts in each limit: max(weight, 1), but for bugs "weight-zero-is-zero" and "legacy-weight-zero"
	ix       map[string][]int // its slot indexes, per limit: in all of its limits or none (bug "admit-one-limit-at-a-time": some)
	deadline time.Duration
}

// in reports whether the ticket holds slots in limit.
func (t *memTicket) in(limit string) bool { return t.ix[limit] != nil }

// held reports whether the ticket holds slots in all of its limits.
func (t *memTicket) held() bool { return len(t.ix) == len(t.names) }

// takes is how many indexes it takes in each limit.
func (t *memTicket) takes() int { return max(t.w, 1) }

type memBell struct {
	c  chan struct{}
	d  *memData
	id string
}

func (b *memBell) C() <-chan struct{} { return b.c }
func (b *memBell) Close() error {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	delete(b.d.bells[b.id], b)
	return nil
}

// staleWindow is how long the racy mutants act on a read after dropping the lock.
const staleWindow = 5 * time.Millisecond

func (s *memStore) is(bug string) bool { return s.bug == bug }

// now is this handle's reading of the store's clock.
func (s *memStore) now() time.Duration { return s.d.now + s.skew }

func (s *memStore) wallNow() time.Time { return s.d.wall.Add(s.now()) }

func (d *memData) ring(id string) {
	for b := range d.bells[id] {
		select {
		case b.c <- struct{}{}:
		default:
		}
	}
}

// inLimit returns the holders and waiters of the limit, each in fence order.
func (d *memData) inLimit(limit string) (held, waiting []*memTicket) {
	for _, t := range d.tickets {
		if !slices.Contains(t.names, limit) {
			continue
		}
		if t.in(limit) {
			held = append(held, t)
		} else {
			waiting = append(waiting, t)
		}
	}
	byFence := func(a, b *memTicket) int { return int(a.t.Fence) - int(b.t.Fence) }
	slices.SortFunc(held, byFence)
	slices.SortFunc(waiting, byFence)
	return held, waiting
}

// view is the ticket as Get returns it: under its first limit.
func (s *memStore) view(t *memTicket) store.Ticket { return s.under(t, t.names[0]) }

// under is the ticket as listed under limit, one of its limits. A ticket of
// one limit and weight one comes in the old form (Limits, Weight, Indexes
// unset) unless the store is explicit, which spells them out: the suite
// must take both.
func (s *memStore) under(t *memTicket, limit string) store.Ticket {
	v := t.t
	v.Limit = limit
	if v.Stop != nil {
		stop := *v.Stop
		v.Stop = &stop
	}
	v.Replaces = slices.Clone(v.Replaces)
	v.Remaining = t.deadline - s.now()
	v.Limits, v.Weight, v.Indexes = nil, 0, nil
	if len(t.names) > 1 || s.d.explicit {
		v.Limits = slices.Clone(t.names)
	}
	if t.w > 1 || s.d.explicit {
		v.Weight = t.w
	}
	v.State, v.Slot, v.Position = store.Waiting, -1, 0
	if t.in(limit) {
		v.State, v.Slot = store.Held, t.ix[limit][0]
		if len(t.names) > 1 || t.w > 1 || s.d.explicit {
			v.Indexes = map[string][]int{}
			for n, ix := range t.ix {
				v.Indexes[n] = slices.Clone(ix)
			}
		}
		return v
	}
	v.Admitted = time.Time{}
	_, waiting := s.queueOf(limit)
	for i, w := range waiting {
		if w == t {
			v.Position = i + 1
		}
	}
	return v
}

// eventIn appends one event of v in limit to the log, which keeps the
// newest store.MaxEvents: Limits when v names several, Weight and Indexes
// when it weighs more than one (docs/leases.md §2.1 item 9).
func (s *memStore) eventIn(kind string, v store.Ticket, limit string, slots []int, evidence string) {
	s.d.seq++
	e := store.Event{Seq: s.d.seq, Time: s.wallNow(), Kind: kind, Limit: limit, Ticket: v.ID, Fence: v.Fence,
		Slot: -1, By: s.d.by, Host: v.Holder.Host, Pid: v.Holder.Pid, User: v.Holder.User, Command: v.Holder.Command(), Evidence: evidence}
	if len(slots) > 0 {
		e.Slot = slots[0]
	}
	if len(v.Names()) > 1 && !s.is("events-no-fields") {
		e.Limits = slices.Clone(v.Names())
	}
	if v.Weighs() > 1 && !s.is("events-no-fields") {
		e.Weight, e.Indexes = v.Weighs(), slices.Clone(slots)
	}
	if kind == "admitted" {
		e.Waited = store.WaitedFor(v.Created, e.Time)
	}
	if !s.is("no-held-time") {
		e.Held = s.d.held
	}
	if len(s.d.events) >= store.MaxEvents {
		s.d.events = s.d.events[len(s.d.events)-store.MaxEvents+1:]
	}
	s.d.events = append(s.d.events, e)
	s.count(e)
}

// event logs kind for the ticket t in each of its limits.
func (s *memStore) event(kind string, t *memTicket, evidence string) {
	v := s.view(t)
	for i, n := range t.names {
		if i > 0 && s.is("events-first-limit-only") {
			break
		}
		s.eventIn(kind, v, n, t.ix[n], evidence)
	}
}

// remove deletes a live ticket from all of its limits at once, tombstones
// its id and logs why. keep names the limits it frees slots in when a bug
// frees only some (nil: all).
func (s *memStore) remove(t *memTicket, why store.Reason, evidence string, keep ...string) {
	s.removedResized(t) // mem_resize_test.go
	delete(s.d.tickets, t.t.ID)
	if !s.is("no-tombstone") {
		s.d.tombs[t.t.ID] = why
	}
	for n, ix := range t.ix {
		l := s.d.limits[n]
		if l == nil {
			continue
		}
		l.used -= len(ix)
		if keep != nil && !slices.Contains(keep, n) {
			l.leak += len(ix) // the bug: these slots stay taken by nobody
		}
	}
	if t.t.State == store.Held {
		s.d.held = store.HeldFor(t.t.Admitted, s.wallNow())
		defer func() { s.d.held = 0 }()
	}
	if why == store.Busy && s.is("busy-as-cancelled") {
		why = store.Cancelled
	}
	s.event(string(why), t, evidence)
	s.d.ring(t.t.ID)
}

// reaped removes t as reaped; bug "reaped-frees-first-limit-only" frees
// only its first limit's slots.
func (s *memStore) reaped(t *memTicket, evidence string, keep ...string) {
	if s.is("reaped-frees-first-limit-only") {
		keep = t.names[:1]
	}
	s.remove(t, store.Reaped, evidence, keep...)
}

// verdict judges a ticket by this handle's clock and, if withDeath, by the
// judge, which may act (stop an orphaned job) unless this is a dry run.
func (s *memStore) verdict(t *memTicket, withDeath, act bool) (string, bool) {
	if late := s.now() - t.deadline; late >= 0 {
		return fmt.Sprintf("expired %v ago", late), true
	}
	if withDeath && s.d.judge != nil {
		ev, dead := s.d.judge(s.view(t), act)
		if dead || s.is("judge-verdict-ignored") {
			return ev, true
		}
	}
	return "", false
}

// sweep removes the limit's expired and proven-dead tickets (Enqueue's sweep).
func (s *memStore) sweep(limit string) {
	if s.is("no-sweep") || s.is("expired-not-counted") {
		return
	}
	held, waiting := s.d.inLimit(limit)
	for _, t := range append(held, waiting...) {
		if s.d.tickets[t.t.ID] != t || s.is("sweep-held-only") && !t.in(limit) {
			continue
		}
		if ev, gone := s.verdict(t, !s.is("admission-ignores-judge"), true); gone {
			s.reaped(t, ev)
		}
	}
}

// byFence returns every live ticket in fence order: the one queue order
// across all limits.
func (d *memData) byFence() []*memTicket {
	var all []*memTicket
	for _, t := range d.tickets {
		all = append(all, t)
	}
	slices.SortFunc(all, func(a, b *memTicket) int { return cmp.Compare(a.t.Fence, b.t.Fence) })
	return all
}

// settle admits waiters, written by hand rather than with policy.PlanSettle
// so that the reference is independent of the planner it checks. It walks
// every waiting ticket in fence order: one is admitted, to all of its limits
// at once, when each has its weight of free slots and no older ticket still
// waits in any of them; one that is not blocks everyone behind it in each of
// its limits (strict FIFO across limits, docs/leases.md §2.1 item 9). Every
// limit is settled every time, which is the closure of the limits a write
// touched: in a settled store no other limit can admit anyone.
//
// extra is capacity a buggy store believes was freed; touched are the limits
// a write touched (bug "no-closure" settles only their waiters).
func (s *memStore) settle(extra map[string]int, touched []string) {
	held := map[string]int{} // slots counted as held, per limit
	count := func() {
		clear(held)
		for _, t := range s.d.tickets {
			for n, ix := range t.ix {
				l := s.d.limits[n]
				switch {
				case l == nil:
				case s.is("expired-not-counted") && t.deadline <= s.now():
				case s.is("shrink-admits"):
					for _, i := range ix {
						if i < l.slots {
							held[n]++
						}
					}
				case s.is("weight-ignored"):
					held[n]++
				default:
					held[n] += t.w
				}
			}
		}
		for n, l := range s.d.limits {
			held[n] += l.leak
			if s.is("counter") {
				held[n] = l.used
			}
		}
	}
	size := func(n string) int {
		l := s.d.limits[n]
		slots := l.slots
		if s.is("pause-admits") && slots == 0 {
			slots = 1
		}
		if s.is("no-cap") {
			slots++
		}
		return slots + extra[n]
	}
	count()
	if s.is("racy") {
		// Decide on a stale count: the check and the promotion are two steps.
		s.d.mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		s.d.mu.Lock()
	}
	tokens, starts := s.rated()
	charged := map[string]int{}
	used := map[string]map[int]bool{}
	for _, t := range s.d.tickets {
		for n, ix := range t.ix {
			if used[n] == nil {
				used[n] = map[int]bool{}
			}
			for _, i := range ix {
				used[n][i] = true
			}
		}
	}
	// take gives t the lowest free indexes of limit n.
	take := func(t *memTicket, n string) {
		if used[n] == nil {
			used[n] = map[int]bool{}
		}
		var ix []int
		if s.is("weight-indexes-contiguous") {
			// the first run of free indexes long enough: not the lowest free
			for i := 0; len(ix) < t.takes(); i++ {
				if used[n][i] {
					ix = nil
				} else {
					ix = append(ix, i)
				}
			}
		}
		for i := 0; len(ix) < t.takes(); i++ {
			if s.is("slot-count") {
				ix = append(ix, held[n]+i) // the count of holders, taken or not
			} else if !used[n][i] {
				ix = append(ix, i)
			}
		}
		for _, i := range ix {
			used[n][i] = true
		}
		t.ix[n] = ix
		if s.is("weight-ignored") {
			held[n]++
		} else {
			held[n] += t.w
		}
		s.d.limits[n].used += len(ix)
		if _, ok := tokens[n]; ok {
			c := 1 // an admission, whatever its weight
			if s.is("rate-weighted") {
				c = t.w
			}
			tokens[n] -= c
			charged[n] += c
		}
	}
	waiting := []*memTicket{}
	for _, t := range s.d.byFence() {
		if !t.held() {
			waiting = append(waiting, t)
		}
	}
	waiting = s.scheduled(waiting)
	if s.is("lifo") {
		slices.Reverse(waiting)
	}
	blocked := map[string]bool{}
	for _, t := range waiting {
		if s.is("no-closure") && touched != nil && !slices.ContainsFunc(t.names, func(n string) bool { return slices.Contains(touched, n) }) {
			continue
		}
		w := t.w
		if s.is("weight-ignored") {
			w = 1
		}
		if s.is("admit-one-limit-at-a-time") {
			// Hold-and-wait: take each limit that has room now, wait for the others.
			for _, n := range t.names {
				if !t.in(n) && s.d.limits[n] != nil && !blocked[n] && held[n]+w <= size(n) {
					if t.ix == nil {
						t.ix = map[string][]int{}
					}
					take(t, n)
					s.eventIn("admitted", s.under(t, n), n, t.ix[n], "")
				}
			}
			if !t.held() {
				for _, n := range t.names {
					blocked[n] = true
				}
				continue
			}
			t.t.State, t.t.Slot, t.t.Admitted = store.Held, t.ix[t.names[0]][0], s.wallNow()
			s.d.ring(t.t.ID)
			continue
		}
		fits := true
		for _, n := range t.names {
			if s.d.limits[n] == nil || blocked[n] || held[n]+w > size(n) {
				fits = false
			}
			if left, ok := tokens[n]; ok && left <= 0 {
				fits = false // the rate is spent: it waits, and blocks the limit
			}
		}
		for _, id := range t.t.Replaces {
			// Never beside a ticket it replaces (docs/leases.md §2.1 item 10):
			// it waits, and blocks its limits, as a ticket that does not fit.
			if s.d.tickets[id] != nil && !s.is("replace-beside") {
				fits = false
			}
		}
		if !fits {
			for _, n := range t.names {
				l := s.d.limits[n]
				switch {
				case l == nil:
				case s.is("fifo-per-limit") && !blocked[n] && held[n]+w <= size(n):
					// blocks only the limits it lacks room in
				case s.is("barge-past-heavy-head") && held[n] < size(n):
					// a free slot is left to whoever fits behind
				case s.is("heavy-waiter-skipped") && w > size(n):
					// "it can never fit": skipped, not waited for
				default:
					blocked[n] = true
				}
			}
			continue
		}
		t.ix = map[string][]int{}
		for _, n := range t.names {
			take(t, n)
		}
		t.t.State, t.t.Slot, t.t.Admitted = store.Held, t.ix[t.names[0]][0], s.wallNow()
		s.event("admitted", t, "")
		if s.is("ring-touched-limits-only") && touched != nil && !slices.ContainsFunc(t.names, func(n string) bool { return slices.Contains(touched, n) }) {
			continue // rings the waiters of the limits the write touched only
		}
		s.d.ring(t.t.ID)
	}
	s.charge(starts, charged)
}

func (s *memStore) lax() bool { return s.is("lax-input") }

func (s *memStore) Enqueue(_ context.Context, r store.EnqueueRequest) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	if !s.lax() {
		rr := r
		if s.is("limits-unchecked") {
			rr.Limit, rr.Limits = r.Names()[0], nil // checks the first limit only
		}
		if s.is("lax-key") {
			rr.Key = ""
		}
		if s.is("lax-url") {
			rr.Holder.URL = ""
		}
		if err := rr.Check(); err != nil {
			return store.Ticket{}, err
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if _, removed := s.d.tombs[r.ID]; removed {
		return store.Ticket{}, store.ErrRemoved
	}
	if t := s.d.tickets[r.ID]; t != nil {
		if s.is("supersede-younger") && (r.Supersede || r.Replace) {
			// A retry that supersedes again: the waiters of its key behind it.
			for _, o := range s.d.byFence() {
				if o != t && !o.held() && o.t.Key == t.t.Key && s.shares(o, t.names) {
					s.supersede(o, t)
				}
			}
			s.settle(nil, t.names)
		}
		if !s.is("enqueue-dup") {
			return s.view(t), nil
		}
		delete(s.d.tickets, r.ID)
	}
	names := slices.Clone(r.Names())
	var saved *memData
	if r.MaxWaiting != nil && !s.is("refusal-writes") {
		saved = s.d.save() // a refusal writes nothing: the step is undone
	}
	// Refusals first, each limit in the order given, before anything is written.
	for i, n := range names {
		size := r.Slots
		if sz, ok := r.Sizes[n]; ok && !s.is("sizes-ignored") {
			size = sz
		}
		if l := s.d.limits[n]; l != nil {
			if r.CheckSlots && l.slots != r.Slots && !s.is("no-conflict") && !(s.is("conflict-first-limit-only") && i > 0) {
				return store.Ticket{}, &store.SlotsConflictError{Limit: n, Have: l.slots, Want: r.Slots}
			}
			size = l.slots
		} else if s.is("weight-checked-existing-only") {
			continue
		}
		if s.is("weight-unchecked") {
			continue
		}
		if err := store.CheckWeightFits(n, size, r.Weighs()); err != nil {
			return store.Ticket{}, err
		}
	}
	for _, n := range names {
		switch l := s.d.limits[n]; {
		case l == nil:
			size := r.Slots
			if sz, ok := r.Sizes[n]; ok && !s.is("sizes-ignored") {
				size = sz
			}
			s.d.limits[n] = &memLimit{name: n, slots: size, created: s.wallNow()}
		case s.is("resize-on-enqueue"):
			l.slots = r.Slots
		}
	}
	var stale []*memTicket // bug "supersede-racy": the waiters read before the write
	if s.is("supersede-racy") && r.Supersede {
		for _, o := range s.d.byFence() {
			if !o.held() && o.t.Key == r.Key && s.shares(o, names) {
				stale = append(stale, o)
			}
		}
		s.d.mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		s.d.mu.Lock()
	}
	s.d.fence++
	fence := s.d.fence
	if s.is("fence-per-limit") {
		l := s.d.limits[names[0]]
		l.fence++
		fence = l.fence
	}
	h := r.Holder
	if s.is("holder-lost") {
		h = store.Holder{Host: h.Host}
	}
	w := r.Weighs()
	if s.is("weight-zero-is-zero") {
		w = r.Weight
	}
	t := &memTicket{names: names, w: w, deadline: s.now() + r.TTL, t: store.Ticket{
		ID: r.ID, Limit: names[0], State: store.Waiting, Fence: fence, Slot: -1,
		TTL: r.TTL, Holder: h, Created: s.wallNow(), Key: r.Key, Priority: r.Priority, Share: r.Share,
	}}
	s.d.tickets[r.ID] = t
	fullBefore := false // bug "max-waiting-before-sweep": judged on the state before the sweep
	for _, n := range names {
		held, _ := s.d.inLimit(n)
		fullBefore = fullBefore || slotsHeld(n, held)+w > s.d.limits[n].slots
	}
	beforeSweep := s.waitingIn(names, t)
	for _, n := range names {
		s.sweep(n)
	}
	before := s.waitingIn(names, t) // bug "max-waiting-before-supersede"
	switch {
	case s.is("supersede-racy") && r.Supersede:
		for _, o := range stale {
			if s.d.tickets[o.t.ID] == o {
				s.supersede(o, t)
			}
		}
	case r.Supersede || r.Replace:
		s.newerFirst(t, r.Replace)
	}
	s.settle(nil, names)
	if r.MaxWaiting != nil && (!t.held() || s.is("max-waiting-admitted-refused") || s.is("max-waiting-before-sweep") && fullBefore) {
		counts := s.waitingIn(names, t)
		switch {
		case s.is("max-waiting-before-supersede"):
			counts = before
		case s.is("max-waiting-before-sweep"):
			for i := range counts {
				counts[i] += beforeSweep[i] - before[i] // the waiters the sweep removed, still counted
			}
		}
		for i, n := range names {
			c := counts[i]
			if s.is("max-waiting-counts-new") {
				c++
			}
			if c >= *r.MaxWaiting {
				if saved != nil {
					s.d.restore(saved)
				} else {
					delete(s.d.tickets, r.ID)
					s.settle(nil, names)
				}
				return store.Ticket{}, &store.QueueFullError{Limit: n, Waiting: c, Max: *r.MaxWaiting}
			}
		}
	}
	if s.d.tickets[r.ID] != t {
		return store.Ticket{}, fmt.Errorf("ticket %s vanished", r.ID)
	}
	return s.view(t), nil
}

// sameKey compares keys exactly, as bytes (docs/leases.md §2.1 item 10).
func (s *memStore) sameKey(a, b string) bool {
	if s.is("key-folded") {
		return strings.EqualFold(strings.TrimSpace(a), strings.TrimSpace(b))
	}
	return a == b
}

// shares reports whether o names one of the limits names.
func (s *memStore) shares(o *memTicket, names []string) bool {
	switch {
	case s.is("supersede-unrelated-limits"):
		return true
	case s.is("supersede-first-limit-only"):
		names = names[:1]
	}
	return slices.ContainsFunc(o.names, func(n string) bool { return slices.Contains(names, n) })
}

// newerFirst is the supersede and replace of the new ticket t, in its
// enqueue's own step (docs/leases.md §2.1 item 10): every older waiting
// ticket of its key sharing a limit is removed as superseded; with replace,
// every held one is asked to stop and t replaces it.
func (s *memStore) newerFirst(t *memTicket, replace bool) {
	for _, o := range s.d.byFence() {
		if o == t || o.t.Fence > t.t.Fence || !s.shares(o, t.names) {
			continue
		}
		if !s.sameKey(o.t.Key, t.t.Key) && !s.is("supersede-other-keys") {
			continue
		}
		if o.held() && !s.is("supersede-held") {
			if !replace {
				continue
			}
			succ := store.SuccessorOf(s.view(t))
			if o.t.Stop == nil || !s.is("stop-not-overwritten") {
				o.t.Stop = &succ
			}
			if len(t.t.Replaces) == 0 || !s.is("replaces-first-only") {
				t.t.Replaces = append(t.t.Replaces, o.t.ID)
			}
			s.d.by = t.t.ID
			s.event("replaced", o, "")
			s.d.by = ""
			if !s.is("no-stop-ring") {
				s.d.ring(o.t.ID)
			}
			continue
		}
		if replace && s.is("replace-no-supersede") {
			continue
		}
		s.supersede(o, t)
	}
}

// supersede removes o, superseded by t, recording t as its successor.
func (s *memStore) supersede(o, t *memTicket) {
	s.d.succ[o.t.ID] = store.SuccessorOf(s.view(t))
	s.d.by = t.t.ID
	s.remove(o, store.Superseded, "")
	s.d.by = ""
}

// superseded is the *store.SupersededError of a superseded id, else nil.
func (s *memStore) superseded(id string) error {
	succ, ok := s.d.succ[id]
	if !ok || s.is("superseded-plain-not-found") {
		return nil
	}
	return &store.SupersededError{ID: id, By: succ}
}

// waitingIn counts the waiters of each of names but t.
func (s *memStore) waitingIn(names []string, t *memTicket) []int {
	out := make([]int, len(names))
	for i, n := range names {
		_, waiting := s.d.inLimit(n)
		for _, w := range waiting {
			if w != t {
				out[i]++
			}
		}
	}
	return out
}

// save copies what a step may change, for restore.
func (d *memData) save() *memData {
	c := &memData{fence: d.fence, seq: d.seq, events: slices.Clone(d.events),
		limits: map[string]*memLimit{}, tickets: map[string]*memTicket{},
		tombs: maps.Clone(d.tombs), succ: maps.Clone(d.succ)}
	for n, l := range d.limits {
		cl := *l
		cl.counts.Wait.Buckets = slices.Clone(l.counts.Wait.Buckets)
		cl.counts.Hold.Buckets = slices.Clone(l.counts.Hold.Buckets)
		cl.starts = slices.Clone(l.starts)
		c.limits[n] = &cl
	}
	for id, t := range d.tickets {
		ct := *t
		ct.names = slices.Clone(t.names)
		if t.ix != nil {
			ct.ix = map[string][]int{}
			for n, ix := range t.ix {
				ct.ix[n] = slices.Clone(ix)
			}
		}
		if t.t.Stop != nil {
			stop := *t.t.Stop
			ct.t.Stop = &stop
		}
		ct.t.Replaces = slices.Clone(t.t.Replaces)
		c.tickets[id] = &ct
	}
	return c
}

// restore undoes a step: the state saved before it.
func (d *memData) restore(c *memData) {
	d.fence, d.seq, d.events = c.fence, c.seq, c.events
	d.limits, d.tickets, d.tombs, d.succ = c.limits, c.tickets, c.tombs, c.succ
}

func (s *memStore) Get(_ context.Context, id string) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[id]
	if t == nil {
		if err := s.superseded(id); err != nil {
			return store.Ticket{}, fmt.Errorf("%w: %w", store.ErrNotFound, err)
		}
		return store.Ticket{}, fmt.Errorf("%w: %s", store.ErrNotFound, id)
	}
	return s.view(t), nil
}

func (s *memStore) Renew(_ context.Context, tk store.Ticket, ttl time.Duration) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	if ttl <= 0 && !s.lax() {
		return store.Ticket{}, fmt.Errorf("%w: ttl %v", store.ErrInvalid, ttl)
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	if t == nil {
		why := s.d.tombs[tk.ID]
		switch {
		case s.is("renew-resurrect"):
			tk.State = store.Waiting
			t = fromView(tk, 0)
		case s.is("renew-resurrect-released") && why == store.Released,
			s.is("renew-resurrect-reaped") && why == store.Reaped:
			// A late write puts the ticket back as its holder last saw it.
			t = fromView(tk, s.now()+ttl)
		default:
			if err := s.superseded(tk.ID); err != nil {
				return store.Ticket{}, fmt.Errorf("%w: %w", store.ErrLost, err)
			}
			return store.Ticket{}, fmt.Errorf("%w: %s is gone", store.ErrLost, tk.ID)
		}
		s.d.tickets[tk.ID] = t
	}
	if t.t.Fence != tk.Fence && !s.is("no-fence-check") {
		return store.Ticket{}, fmt.Errorf("%w: %s has another fence", store.ErrLost, tk.ID)
	}
	if t.deadline <= s.now() && !s.is("renew-expired") {
		return store.Ticket{}, fmt.Errorf("%w: %s expired", store.ErrLost, tk.ID)
	}
	if tk.State == store.Held && !t.held() && !s.is("renew-held-waiting") {
		s.remove(t, store.Reaped, "was held by its holder but waits in the store")
		s.settle(nil, t.names)
		return store.Ticket{}, fmt.Errorf("%w: %s was held by its holder but waits in the store", store.ErrLost, tk.ID)
	}
	if !s.is("renew-noop") {
		t.deadline = s.now() + ttl
	}
	t.t.Renewed = s.wallNow()
	if !t.held() && slices.ContainsFunc(t.names, func(n string) bool { l := s.d.limits[n]; return l != nil && !l.policy.IsFIFO() }) {
		// Time alone may admit it under a policy (an aging, a window
		// sliding): its renewal settles.
		s.settle(nil, t.names)
	}
	return s.view(t), nil
}

func (s *memStore) Release(_ context.Context, tk store.Ticket, why store.Reason) (bool, error) {
	if err := s.closedErr(); err != nil {
		return false, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	match := t != nil && (tk.Fence == 0 || t.t.Fence == tk.Fence || s.is("no-fence-check"))
	if match && s.is("release-stale-read") {
		// Read present, act later: by then a reaper may have removed it.
		s.d.mu.Unlock()
		time.Sleep(staleWindow)
		s.d.mu.Lock()
		if s.d.tickets[tk.ID] != t {
			if l := s.d.limits[tk.Limit]; l != nil {
				s.settle(map[string]int{l.name: 1}, tk.Names()) // frees the slot it read as held
			}
			return true, nil
		}
	}
	if !match {
		if t == nil {
			if s.is("release-forgets-successor") {
				delete(s.d.succ, tk.ID) // the tombstone rewritten with the caller's reason
			}
			if _, removed := s.d.tombs[tk.ID]; !removed && !s.is("no-tombstone") {
				s.d.tombs[tk.ID] = why // cancel before create
			}
			if why == store.Lost && tk.Limit != "" && !s.is("lost-not-logged") {
				for i, n := range tk.Names() {
					if i == 0 || !s.is("lost-first-limit-only") {
						s.eventIn(string(store.Lost), tk, n, tk.In(n), "holder presumed its lease lost")
					}
				}
			}
		}
		if l := s.d.limits[tk.Limit]; l != nil {
			switch {
			case s.is("counter"):
				for _, n := range tk.Names() {
					if l := s.d.limits[n]; l != nil {
						l.used -= tk.Weighs()
					}
				}
				s.settle(nil, tk.Names())
			case s.is("release-missing-frees") && t == nil:
				s.settle(map[string]int{l.name: 1}, tk.Names()) // the fallback decrement of a missing lease
			case s.is("release-missing-frees-multi") && t == nil && len(tk.Names()) > 1:
				// Only the first limit's slot is checked against the ticket.
				extra := map[string]int{}
				for _, n := range tk.Names()[1:] {
					extra[n] = tk.Weighs()
				}
				s.settle(extra, tk.Names())
			}
		}
		return s.is("release-missing-true"), nil
	}
	var keep []string
	if s.is("release-frees-first-limit-only") {
		keep = t.names[:1]
	}
	wasHeld := len(t.ix) > 0
	s.remove(t, why, "", keep...)
	if !wasHeld && s.is("waiter-removal-no-settle") {
		return true, nil // "it held nothing, so it frees nothing"
	}
	s.settle(nil, t.names)
	return true, nil
}

// fromView is a ticket put back as its holder last saw it (the bugs of late writes).
func fromView(tk store.Ticket, deadline time.Duration) *memTicket {
	t := &memTicket{t: tk, names: slices.Clone(tk.Names()), w: tk.Weighs(), deadline: deadline}
	t.t.Limit = t.names[0]
	if tk.State == store.Held {
		t.ix = map[string][]int{}
		for _, n := range t.names {
			t.ix[n] = slices.Clone(tk.In(n))
		}
	}
	return t
}

func (s *memStore) SetChild(_ context.Context, tk store.Ticket, pgid int, pgidStart uint64) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	if t == nil || t.t.Fence != tk.Fence {
		if s.is("setchild-gone-ok") {
			tk.Holder.Pgid, tk.Holder.PgidStart = pgid, pgidStart
			return tk, nil
		}
		return store.Ticket{}, fmt.Errorf("%w: %s is gone", store.ErrLost, tk.ID)
	}
	if s.is("setchild-not-stored") {
		v := s.view(t)
		v.Holder.Pgid, v.Holder.PgidStart = pgid, pgidStart
		return v, nil
	}
	t.t.Holder.Pgid, t.t.Holder.PgidStart = pgid, pgidStart
	if s.is("setchild-renews") {
		t.deadline = s.now() + t.t.TTL
	}
	return s.view(t), nil
}

// reapNames returns the limits a Reap covers: all when none are named.
func (s *memStore) reapNames(limits []string) ([]string, error) {
	var names []string
	if len(limits) == 0 || s.is("reap-ignores-names") {
		for n := range s.d.limits {
			names = append(names, n)
		}
		slices.Sort(names)
		return names, nil
	}
	for _, n := range limits {
		if s.d.limits[n] == nil {
			if s.is("reap-unknown-ok") {
				continue
			}
			return nil, fmt.Errorf("%w: %s", store.ErrLimitNotFound, n)
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names, nil
}

func (s *memStore) removal(v store.Ticket, evidence string) store.Removal {
	if s.is("reap-no-evidence") {
		evidence = ""
	}
	return store.Removal{Ticket: v, Reason: store.Reaped, Evidence: evidence}
}

// scan lists the tickets of names a reap would remove now, each once.
func (s *memStore) scan(names []string) []store.Removal {
	var out []store.Removal
	seen := map[*memTicket]bool{}
	for _, n := range names {
		held, waiting := s.d.inLimit(n)
		for _, t := range append(held, waiting...) {
			if seen[t] || s.is("reap-dryrun-held-only") && !t.in(n) {
				continue
			}
			seen[t] = true
			if ev, gone := s.verdict(t, !s.is("judge-ignored"), s.is("dryrun-acts")); gone {
				out = append(out, s.removal(s.view(t), ev))
			}
		}
	}
	return s.perLimit(out, names)
}

// perLimit is bug "reap-lists-per-limit": a ticket listed again under each
// of its other limits the reap covers.
func (s *memStore) perLimit(out []store.Removal, names []string) []store.Removal {
	if !s.is("reap-lists-per-limit") {
		return out
	}
	for _, r := range out {
		for _, n := range r.Ticket.Names() {
			if n != r.Ticket.Limit && slices.Contains(names, n) {
				again := r
				again.Ticket = r.Ticket.Under(n)
				out = append(out, again)
			}
		}
	}
	return out
}

func (s *memStore) Reap(_ context.Context, o store.ReapOptions) ([]store.Removal, error) {
	dryRun, limits := o.DryRun, o.Limits
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	if !s.lax() {
		for _, l := range limits {
			if err := store.CheckLimitName(l); err != nil {
				return nil, err
			}
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	names, err := s.reapNames(limits)
	if err != nil {
		return nil, err
	}
	out := []store.Removal{}
	if s.is("reap-dryrun-removes") {
		dryRun = false
	}
	if dryRun {
		out = append(out, s.scan(names)...)
		s.hint = nil
		for _, r := range out {
			s.hint = append(s.hint, r.Ticket)
		}
		return out, nil
	}
	hint := s.hint
	s.hint = nil
	switch {
	case s.is("reap-trusts-scan"):
		// The scan decides: what it listed goes, renewed since or not.
		for _, v := range hint {
			if t := s.d.tickets[v.ID]; t != nil && slices.Contains(names, t.t.Limit) {
				out = append(out, s.removal(s.view(t), "listed by a scan"))
				s.remove(t, store.Reaped, "listed by a scan")
			}
		}
	case s.is("reap-double-free"):
		// Act on a read made earlier: remove what is still there, and free
		// a slot for every ticket read, removed by someone else or not.
		if hint == nil {
			for _, r := range s.scan(names) {
				hint = append(hint, r.Ticket)
			}
			s.d.mu.Unlock()
			time.Sleep(staleWindow)
			s.d.mu.Lock()
		}
		for _, v := range hint {
			extra := 1
			if t := s.d.tickets[v.ID]; t != nil {
				s.remove(t, store.Reaped, "expired")
				extra = 0
			}
			out = append(out, s.removal(v, "expired"))
			if l := s.d.limits[v.Limit]; l != nil {
				s.settle(map[string]int{l.name: extra}, names)
			}
		}
		return out, nil
	}
	for _, n := range names {
		held, waiting := s.d.inLimit(n) // a ticket removed under an earlier limit is gone from this one
		for _, t := range append(held, waiting...) {
			if ev, gone := s.verdict(t, !s.is("judge-ignored"), true); gone {
				out = append(out, s.removal(s.view(t), ev))
				var keep []string
				if s.is("reap-frees-named-limit-only") {
					keep = names
				}
				s.reaped(t, ev, keep...)
			}
		}
	}
	if !s.is("reap-no-promote") {
		s.settle(nil, names)
	}
	return s.perLimit(out, names), nil
}

func (s *memStore) Events(_ context.Context, limit string, n int) ([]store.Event, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	if limit != "" && !s.lax() {
		if err := store.CheckLimitName(limit); err != nil {
			return nil, err
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	out := []store.Event{}
	match := func(e store.Event) bool { return limit == "" || e.Limit == limit || s.is("events-unfiltered") }
	if s.is("events-oldest") {
		for _, e := range s.d.events {
			if len(out) < n && match(e) {
				out = append(out, e)
			}
		}
		return out, nil
	}
	for i := len(s.d.events) - 1; i >= 0 && len(out) < n; i-- {
		if match(s.d.events[i]) {
			out = append(out, s.d.events[i])
		}
	}
	if !s.is("events-newest-first") {
		slices.Reverse(out)
	}
	return out, nil
}

func (s *memStore) Snapshot(_ context.Context, limits ...string) (store.Snapshot, error) {
	if err := s.closedErr(); err != nil {
		return store.Snapshot{}, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	sn := store.Snapshot{Now: s.wallNow()}
	var names []string
	if len(limits) == 0 || s.is("snapshot-filter-ignored") {
		for n := range s.d.limits {
			names = append(names, n)
		}
	} else {
		for _, n := range limits {
			if s.d.limits[n] != nil && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	for _, n := range names {
		l, ts := s.limitView(n)
		sn.Limits = append(sn.Limits, l)
		sn.Tickets = append(sn.Tickets, ts...)
	}
	if s.is("snapshot-order") {
		slices.SortFunc(sn.Tickets, func(a, b store.Ticket) int { return int(a.Fence) - int(b.Fence) })
	}
	return sn, nil
}

func (s *memStore) SetLimit(_ context.Context, name string, slots int) (store.Limit, error) {
	if err := s.closedErr(); err != nil {
		return store.Limit{}, err
	}
	if !s.lax() {
		if err := store.CheckLimitName(name); err != nil {
			return store.Limit{}, err
		}
		if err := store.CheckSlots(slots); err != nil {
			return store.Limit{}, err
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	l := s.d.limits[name]
	if l == nil {
		l = &memLimit{name: name, created: s.wallNow()}
		s.d.limits[name] = l
	}
	l.slots = slots
	if s.is("shrink-evicts") {
		held, _ := s.d.inLimit(name)
		for i := len(held) - 1; i >= slots; i-- {
			s.remove(held[i], store.ForceReleased, "limit shrunk")
		}
	}
	if !s.is("grow-no-promote") {
		s.settle(nil, []string{name})
	}
	held, waiting := s.d.inLimit(name)
	return store.Limit{Name: name, Slots: l.slots, Held: slotsHeld(name, held), Waiting: len(waiting), Created: l.created}, nil
}

// slotsHeld counts the slots the holders hold in limit.
func slotsHeld(limit string, held []*memTicket) int {
	n := 0
	for _, t := range held {
		n += len(t.ix[limit])
	}
	return n
}

func (s *memStore) RemoveLimit(_ context.Context, name string, force bool) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	if err := store.CheckLimitName(name); err != nil && !s.lax() {
		return err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.d.limits[name] == nil {
		return fmt.Errorf("%w: %s", store.ErrLimitNotFound, name)
	}
	held, waiting := s.d.inLimit(name)
	if len(held)+len(waiting) > 0 && !force && !s.is("remove-inuse") {
		return fmt.Errorf("%w: %s", store.ErrLimitInUse, name)
	}
	var others []string // the other limits of its tickets, settled in the same step
	if !s.is("remove-leaves-tickets") {
		for _, t := range append(held, waiting...) {
			s.remove(t, store.ForceReleased, "limit removed")
			others = append(others, t.names...)
		}
	}
	delete(s.d.limits, name)
	if !s.is("remove-limit-no-settle") {
		s.settle(nil, others)
	}
	return nil
}

func (s *memStore) Watch(_ context.Context, id string) (store.Bell, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	b := &memBell{c: make(chan struct{}, 1), d: s.d, id: id}
	if s.is("silent-bell") {
		return b, nil
	}
	if s.d.bells[id] == nil {
		s.d.bells[id] = map[*memBell]bool{}
	}
	s.d.bells[id][b] = true
	return b, nil
}

func (s *memStore) String() string { return "mem://" }

// reopen is a restart: the data stays, except what a buggy store loses.
func (s *memStore) reopen() store.Store {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	switch s.bug {
	case "reopen-loses-tombs":
		s.d.tombs = map[string]store.Reason{}
	case "reopen-resets-fence":
		s.d.fence = 0
	case "counts-lost-on-reopen": // counts kept in memory beside the file
		for n, l := range s.d.limits {
			l.counts = store.Counts{Limit: n}
		}
	case "stop-lost-on-reopen": // a record format without the stop request
		for _, t := range s.d.tickets {
			t.t.Stop = nil
		}
	case "policy-lost-on-reopen": // a limit record without its policy
		for _, l := range s.d.limits {
			l.policy, l.starts = store.Policy{}, nil
		}
	case "replaces-lost-on-reopen":
		for _, t := range s.d.tickets {
			t.t.Replaces = nil
		}
	case "successor-lost-on-reopen": // a tombstone that keeps the reason only
		s.d.succ = map[string]store.Successor{}
	case "reopen-drops-weight": // a decoder that ignores the weight
		for _, t := range s.d.tickets {
			t.w = 1
			for n, ix := range t.ix {
				t.ix[n] = ix[:1]
			}
		}
	case "reopen-drops-limits": // a decoder that keeps the first limit only
		for _, t := range s.d.tickets {
			t.names = t.names[:1]
			for n := range t.ix {
				if n != t.names[0] {
					delete(t.ix, n)
				}
			}
		}
	}
	return &memStore{d: s.d, bug: s.bug}
}

func newMem(bug string, j store.Judge, explicit bool) (*memStore, storetest.Backend) {
	d := &memData{
		now: time.Hour, wall: time.Now(),
		limits: map[string]*memLimit{}, tickets: map[string]*memTicket{},
		tombs: map[string]store.Reason{}, succ: map[string]store.Successor{}, bells: map[string]map[*memBell]bool{},
		judge: j, explicit: explicit,
	}
	s := &memStore{d: d, bug: bug}
	return s, storetest.Backend{
		Store: s,
		Advance: func(dur time.Duration) {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.now += dur
		},
		Reopen: s.reopen,
		Skewed: func(skew time.Duration) store.Store { return &memStore{d: d, bug: bug, skew: skew} },
	}
}

func memHarness(bug string, explicit bool) storetest.Harness {
	const ttl = 10 * time.Second
	h := storetest.Harness{
		TTL: ttl, ManyEvents: true,
		New: func(t *testing.T) storetest.Backend {
			_, b := newMem(bug, nil, explicit)
			return b
		},
		NewWithJudge: func(t *testing.T, j store.Judge) storetest.Backend {
			_, b := newMem(bug, j, explicit)
			return b
		},
		// The reference store has no old format: NewLegacy enqueues the
		// fixture through its own Enqueue, which is what a backend's reader
		// of the old records must come to. Bugs "legacy-unread" (the old
		// records are not read: the store looks empty) and
		// "legacy-weight-zero" (an old record read with weight 0, counting
		// no slots) stand for the readers that fail.
		NewLegacy: func(t *testing.T) storetest.Backend {
			s, b := newMem(bug, nil, explicit)
			if bug == "legacy-unread" {
				return b
			}
			for _, id := range storetest.LegacyIDs {
				r := store.EnqueueRequest{ID: id, Limit: storetest.LegacyLimit, Slots: 2, TTL: ttl, Holder: storetest.LegacyHolder}
				if _, err := s.Enqueue(t.Context(), r); err != nil {
					t.Fatalf("the legacy fixture: Enqueue %s: %v", id, err)
				}
				if bug == "legacy-weight-zero" {
					s.d.tickets[id].w = 0
				}
			}
			s.d.limits[storetest.LegacyLimit].counts = store.Counts{} // the old format kept none
			return b
		},
	}
	if bug == "no-legacy-hook" {
		h.NewLegacy = nil
	}
	return h
}

const mutantEnv = "STORETEST_MUTANT"

// TestMemStore runs the suite against the reference store, or against the
// mutant named by $STORETEST_MUTANT (see TestMutants).
func TestMemStore(t *testing.T) {
	storetest.Run(t, memHarness(os.Getenv(mutantEnv), false))
}

// TestMemStoreExplicit runs the suite against the reference store that
// spells out Limits, Weight and Indexes of every ticket: the suite accepts
// a ticket of one limit and weight one in either form.
func TestMemStoreExplicit(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("running as a mutant")
	}
	storetest.Run(t, memHarness("", true))
}

// TestMemEventsBounded checks the reference store's event log keeps the
// newest store.MaxEvents (too many writes for the shared suite).
func TestMemEventsBounded(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("running as a mutant")
	}
	s, _ := newMem("", nil, false)
	ctx := t.Context()
	const pairs = store.MaxEvents/2 + 20
	for i := range pairs {
		tk, err := s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("t%d", i), Limit: "q", Slots: 1, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Release(ctx, tk, store.Released); !ok || err != nil {
			t.Fatalf("Release %s = %v, %v", tk.ID, ok, err)
		}
	}
	for _, limit := range []string{"", "q"} {
		ev, err := s.Events(ctx, limit, 2*store.MaxEvents)
		if err != nil {
			t.Fatal(err)
		}
		if len(ev) != store.MaxEvents {
			t.Fatalf("Events(%q, %d): %d events after %d were logged, want the newest %d", limit, 2*store.MaxEvents, len(ev), 2*pairs, store.MaxEvents)
		}
		if first, last := ev[0].Seq, ev[len(ev)-1].Seq; last != 2*pairs || first != last-store.MaxEvents+1 {
			t.Fatalf("Events(%q): seq %d..%d, want %d..%d", limit, first, last, 2*pairs-store.MaxEvents+1, 2*pairs)
		}
	}
	if len(s.d.events) > store.MaxEvents {
		t.Fatalf("the log holds %d events, more than %d", len(s.d.events), store.MaxEvents)
	}
}

// mutants maps each deliberate bug to the cases that must catch it.
var mutants = map[string][]string{
	"resize-on-enqueue":        {"LimitCreatedOnceWithFirstSize"},
	"no-conflict":              {"SlotsConflict"},
	"lifo":                     {"FIFOPromotion"},
	"no-cap":                   {"HeldAtMostSlots"},
	"slot-count":               {"SlotIndexesUniqueLowestFirst"},
	"counter":                  {"DoubleReleaseFreesOneSlot", "ReleaseAfterReap"},
	"release-missing-true":     {"ReleaseMissingIsNoop"},
	"no-fence-check":           {"ReleaseWrongFenceRemovesNothing"},
	"renew-expired":            {"RenewExpiredIsLost"},
	"renew-noop":               {"RenewBeforeExpiryExtends"},
	"renew-resurrect":          {"RenewReleasedIsLost", "LateRenewAfterRelease", "LateRenewAfterReap"},
	"no-tombstone":             {"RemovedIDCannotReturn"},
	"enqueue-dup":              {"EnqueueIdempotent"},
	"fence-per-limit":          {"FencesIncrease"},
	"no-sweep":                 {"ExpiredHolderSweptByEnqueue"},
	"expired-not-counted":      {"ExpiredHolderSweptByEnqueue"},
	"sweep-held-only":          {"WaitersAreLeased"},
	"grow-no-promote":          {"Resize", "Pause"},
	"shrink-evicts":            {"Resize"},
	"shrink-admits":            {"Resize"},
	"pause-admits":             {"Pause"},
	"remove-inuse":             {"RemoveLimit"},
	"remove-leaves-tickets":    {"RemoveLimit"},
	"snapshot-order":           {"Snapshot"},
	"snapshot-filter-ignored":  {"Snapshot"},
	"holder-lost":              {"GetTicket"},
	"silent-bell":              {"WatchRings"},
	"lax-input":                {"InvalidInput"},
	"reopen-loses-tombs":       {"Reopen"},
	"reopen-resets-fence":      {"Reopen"},
	"racy":                     {"Concurrent", "ConcurrentMultiLimit"},
	"reap-trusts-scan":         {"RenewAfterScanWins"},
	"reap-double-free":         {"TwoReapersFreeOnce"},
	"release-stale-read":       {"ReleaseRacingReap"},
	"release-missing-frees":    {"ReleaseAfterReap"},
	"lost-not-logged":          {"ReleaseAfterReap"},
	"renew-resurrect-released": {"LateRenewAfterRelease"},
	"renew-resurrect-reaped":   {"LateRenewAfterReap"},
	"renew-held-waiting":       {"RenewHeldButWaitingIsLost"},
	"reap-ignores-names":       {"ReapNamedLimitsOnly"},
	"reap-unknown-ok":          {"ReapNamedLimitsOnly"},
	"reap-dryrun-removes":      {"ReapDryRunMatchesReap"},
	"reap-dryrun-held-only":    {"ReapDryRunMatchesReap"},
	"reap-no-promote":          {"ReapFreesAndPromotes"},
	"reap-no-evidence":         {"ReapFreesAndPromotes"},
	"judge-ignored":            {"DeadHolderReapedAtOnce"},
	"dryrun-acts":              {"DeadHolderReapedAtOnce"},
	"admission-ignores-judge":  {"DeadHolderSweptOnAdmission"},
	"judge-verdict-ignored":    {"LiveHolderKeptUntilTTL"},
	"setchild-not-stored":      {"SetChild"},
	"setchild-renews":          {"SetChild"},
	"setchild-gone-ok":         {"SetChild"},
	"events-newest-first":      {"Events"},
	"events-unfiltered":        {"Events"},
	"events-oldest":            {"Events"},
	"cancel-as-released":       {"CancelWaiting", "CancelPromoted"},
	"cancel-waiting-only":      {"CancelPromoted"},
	"cancel-missing-frees":     {"CancelWaiting", "CancelPromoted"},
	// Counters (docs/leases.md §2.8): counts.go.
	"counts-admitted-twice":   {"CountsEachKindOnce"},
	"counts-racy":             {"CountsConcurrent"},
	"counts-first-limit-only": {"CountsEveryLimit"},
	"counts-lost-on-reopen":   {"CountsSurviveRestart"},
	"counts-from-log":         {"CountsSurvivePruning"},
	"busy-as-cancelled":       {"BusyIsCancelUnderItsName", "CountsEachKindOnce"},
	"no-held-time":            {"CountsEachKindOnce", "CountsEveryLimit"},
	"close-noop":              {"Close"},
	// Several limits and weights.
	"admit-one-limit-at-a-time":      {"AtomicAdmissionAcrossLimits"},
	"weight-ignored":                 {"WeightsCountedInSlots"},
	"fifo-per-limit":                 {"FIFOAcrossLimits"},
	"barge-past-heavy-head":          {"HeavyHeadNotOvertaken"},
	"release-frees-first-limit-only": {"MultiReleasePromotesEveryLimit"},
	"no-closure":                     {"MultiReleasePromotesEveryLimit"},
	"heavy-waiter-skipped":           {"ResizeAndPauseWithWeights"},
	"reap-lists-per-limit":           {"ReapMultiLimit"},
	"reap-frees-named-limit-only":    {"ReapMultiLimit"},
	"reaped-frees-first-limit-only":  {"ReapMultiLimit", "DeadMultiHolderFreesAll"},
	"release-missing-frees-multi":    {"DoubleReleaseMultiFreesOnce"},
	"limits-unchecked":               {"EnqueueRefusalsMulti"},
	"sizes-ignored":                  {"SizesOfCreatedLimits"},
	"weight-unchecked":               {"EnqueueRefusalsMulti", "ResizeAndPauseWithWeights"},
	"weight-checked-existing-only":   {"EnqueueRefusalsMulti"},
	"conflict-first-limit-only":      {"EnqueueRefusalsMulti"},
	"weight-zero-is-zero":            {"EnqueueRefusalsMulti"},
	"events-first-limit-only":        {"EventsMultiLimit"},
	"events-no-fields":               {"EventsMultiLimit"},
	"remove-limit-no-settle":         {"RemoveLimitForceMulti"},
	"legacy-unread":                  {"LegacyFormatRead"},
	"legacy-weight-zero":             {"LegacyFormatRead"},
	"no-legacy-hook":                 {"LegacyFormatRead"},
	"ring-touched-limits-only":       {"MultiReleasePromotesEveryLimit"},
	"weight-indexes-contiguous":      {"WeightsCountedInSlots"},
	"lost-first-limit-only":          {"ReapMultiLimit"},
	"reopen-drops-weight":            {"ReopenMultiLimit"},
	"reopen-drops-limits":            {"ReopenMultiLimit"},
	"waiter-removal-no-settle":       {"FIFOAcrossLimits", "HeavyHeadNotOvertaken"},
	// Newer runs first (docs/leases.md §2.1 item 10).
	"supersede-held":               {"SupersedeOlderWaiting"},
	"supersede-other-keys":         {"SupersedeScope", "ReplaceStopsHolder"},
	"supersede-unrelated-limits":   {"SupersedeScope"},
	"supersede-first-limit-only":   {"SupersedeScope"},
	"supersede-younger":            {"SupersedeScope"},
	"superseded-plain-not-found":   {"SupersedeOlderWaiting", "SupersedeScope"},
	"replace-beside":               {"ReplaceStopsHolder", "StopSurvivesReopen", "ReplaceMultiLimit"},
	"replace-no-supersede":         {"ReplaceStopsHolder"},
	"stop-not-overwritten":         {"ReplaceStopsHolder"},
	"no-stop-ring":                 {"ReplaceStopsHolder"},
	"max-waiting-before-supersede": {"MaxWaiting"},
	"max-waiting-counts-new":       {"MaxWaiting"},
	"max-waiting-admitted-refused": {"MaxWaiting"},
	"refusal-writes":               {"MaxWaiting"},
	"key-folded":                   {"KeysComparedExactly"},
	"lax-key":                      {"KeyAndURLInvalid"},
	"lax-url":                      {"KeyAndURLInvalid"},
	"stop-lost-on-reopen":          {"StopSurvivesReopen"},
	"replaces-lost-on-reopen":      {"StopSurvivesReopen"},
	"successor-lost-on-reopen":     {"StopSurvivesReopen"},
	"supersede-racy":               {"ConcurrentSupersede"},
	"release-forgets-successor":    {"SupersedeOlderWaiting"},
	"replaces-first-only":          {"ReplaceFIFOPlace"},
	"max-waiting-before-sweep":     {"MaxWaiting"},
	// Scheduling policies: mem_schedule_test.go.
	"policy-unchecked":      {"PolicyRefusals"},
	"setpolicy-replaces":    {"PolicySet"},
	"policy-lost-on-reopen": {"PolicySet", "Rate"},
	"priority-ignored":      {"PriorityOrder", "PriorityAging", "OrderAcrossLimits"},
	"snapshot-fence-order":  {"PriorityOrder", "FairShare"},
	"aging-off":             {"PriorityAging"},
	"fair-ignored":          {"FairShare"},
	"fair-counts-tickets":   {"FairShare"},
	"rate-uncharged":        {"Rate", "RateConcurrent"},
	"rate-weighted":         {"Rate"},
	"rate-no-slide":         {"Rate"},
	"rate-racy":             {"RateConcurrent"},
	"setpolicy-no-settle":   {"Rate"},
	"order-first-limit":     {"OrderAcrossLimits"},
	"deadlock":              {"OrderAcrossLimits"},
}

// TestMutants shows that the suite is not vacuous: each bug, planted in the
// reference store, makes the cases that target it fail.
func TestMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("running as a mutant")
	}
	longtest.Skip(t, "runs the suite once per mutant")
	for bug, want := range mutants {
		t.Run(bug, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestMemStore$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+bug)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passes on a store with bug %q", bug)
			}
			for _, c := range want {
				if !strings.Contains(string(out), "--- FAIL: TestMemStore/"+c+" ") {
					t.Errorf("bug %q: case %s did not fail; output:\n%s", bug, c, out)
				}
			}
		})
	}
}
