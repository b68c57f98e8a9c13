package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/slotctl/slotctl/store"
)

// The cases of scheduling policies (docs/scheduling.md): a limit's order
// (fifo, priority with aging, fair shares) and rate, set with SetPolicy and
// kept with the limit. A priority limit admits the highest effective
// priority first, a fair one the share holding the fewest slots, ties in
// ticket order; Position and the snapshot's order of waiters follow the
// policy. A rate allows N admissions in any sliding window, each counted
// once whatever its weight and charged in the step that admits. Across
// limits, a waiter is never admitted past one its other limits put ahead of
// it, and no set of waiters deadlocks.
//
// Time moves through Advance, a real sleep on some backends: agings and
// windows here are of seconds, and a case that asserts a ticket still waits
// within a window checks first, by the store's clock, that the window has
// not slid meanwhile.

func ordP(o store.Order) *store.Order            { return &o }
func durP(d time.Duration) *time.Duration        { return &d }
func rateP(n int, per time.Duration) *store.Rate { return &store.Rate{N: n, Per: per} }

// reqP is reqM with a priority and a share.
func (s *suite) reqP(name string, limits []string, weight, slots, priority int, share string) store.EnqueueRequest {
	r := s.reqM(name, limits, weight, slots)
	r.Priority, r.Share = priority, share
	return r
}

// enqP enqueues reqP's request and checks that the ticket keeps its
// priority and share.
func (s *suite) enqP(name string, limits []string, weight, slots, priority int, share string) store.Ticket {
	s.Helper()
	return s.enqPReq(s.reqP(name, limits, weight, slots, priority, share))
}

func (s *suite) enqPReq(r store.EnqueueRequest) store.Ticket {
	s.Helper()
	tk := s.enqReq(r)
	if tk.Priority != r.Priority || tk.Share != r.Share {
		s.Fatalf("Enqueue %s (priority %d, share %q) returned priority %d, share %q", s.who(r.ID), r.Priority, r.Share, tk.Priority, tk.Share)
	}
	return tk
}

// samePolicy compares policies as they act: the order, the aging of a
// priority order, and the rate.
func samePolicy(a, b store.Policy) bool {
	if a.Ordered() != b.Ordered() || a.Rate != b.Rate {
		return false
	}
	return a.Ordered() != store.ByPriority || a.AgingOr() == b.AgingOr()
}

// setPolicy changes limit name's policy and checks the answer and a
// snapshot: the limit has policy want.
func (s *suite) setPolicy(name string, ch store.PolicyChange, want store.Policy) store.Limit {
	s.Helper()
	l, err := s.st.SetPolicy(s.ctx, name, ch)
	if err != nil {
		s.Fatalf("SetPolicy(%q, %s): %v", name, fmtChange(ch), err)
	}
	if l.Name != name || !samePolicy(l.Policy, want) {
		s.Fatalf("SetPolicy(%q, %s) returned limit %q with policy %q (%+v), want %q", name, fmtChange(ch), l.Name, l.Policy, l.Policy, want)
	}
	if got := s.limitP(name).Policy; !samePolicy(got, want) {
		s.Fatalf("after SetPolicy(%q, %s): Snapshot shows policy %q (%+v), want %q", name, fmtChange(ch), got, got, want)
	}
	return l
}

// wantPolicyErr checks that SetPolicy fails with want and leaves the
// limit's policy as it was.
func (s *suite) wantPolicyErr(name string, ch store.PolicyChange, want error) {
	s.Helper()
	before, exists := findLimit(s.psnap(), name)
	l, err := s.st.SetPolicy(s.ctx, name, ch)
	if !errors.Is(err, want) {
		s.Fatalf("SetPolicy(%q, %s) = policy %q, %v; want an error wrapping %v", name, fmtChange(ch), l.Policy, err, want)
	}
	after, still := findLimit(s.psnap(), name)
	if exists != still || after.Policy != before.Policy || after.Slots != before.Slots {
		s.Fatalf("SetPolicy(%q, %s) failed (%v) but changed the limit: %v %q -> %v %q", name, fmtChange(ch), err, exists, before.Policy, still, after.Policy)
	}
}

func fmtChange(ch store.PolicyChange) string {
	var parts []string
	if ch.Order != nil {
		parts = append(parts, fmt.Sprintf("order %q", *ch.Order))
	}
	if ch.Aging != nil {
		parts = append(parts, "aging "+ch.Aging.String())
	}
	if ch.Rate != nil {
		parts = append(parts, fmt.Sprintf("rate %d/%v", ch.Rate.N, ch.Rate.Per))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// psnap is snap for limits of any policy: tickets by limit, held ones by
// fence, then the waiters in the order the limit's policy admits them
// (ticket order in a FIFO limit), numbered from 1; counts that match; each
// waiter of a priority limit shows its effective priority at the
// snapshot's Now (Policy.Effective), others none; a rated limit lists the
// starts in its window, oldest first, at most N, and when the rate is spent
// Opens, when the oldest of them leaves the window.
func (s *suite) psnap(limits ...string) store.Snapshot {
	s.Helper()
	sn, err := s.st.Snapshot(s.ctx, limits...)
	if err != nil {
		s.Fatalf("Snapshot(%q): %v", limits, err)
	}
	byName := map[string]store.Limit{}
	for _, l := range sn.Limits {
		byName[l.Name] = l
		s.checkRate(l, sn.Now)
	}
	held, waiting := map[string]int{}, map[string]int{}
	states := map[string]store.State{}
	for i, tk := range sn.Tickets {
		s.checkShape("Snapshot", tk)
		l, ok := byName[tk.Limit]
		if !ok {
			s.Fatalf("Snapshot(%q): %s is listed under %q, which the snapshot does not list", limits, s.who(tk.ID), tk.Limit)
		}
		if st, seen := states[tk.ID]; seen && st != tk.State {
			s.Fatalf("Snapshot(%q): %s is %s under one limit and %s under %q", limits, s.who(tk.ID), st, tk.State, tk.Limit)
		}
		states[tk.ID] = tk.State
		if i > 0 {
			p := sn.Tickets[i-1]
			ok := p.Limit < tk.Limit || p.Limit == tk.Limit && (p.State == store.Held && (tk.State != store.Held || p.Fence < tk.Fence) ||
				p.State == store.Waiting && tk.State == store.Waiting && (l.Policy.Ordered() != store.FIFO || p.Fence < tk.Fence))
			if !ok {
				s.Fatalf("Snapshot(%q): %s (%s %s fence %d) listed before %s (%s %s fence %d); want by limit, held first by fence, then waiters (by fence in a FIFO limit)",
					limits, s.who(p.ID), p.Limit, p.State, p.Fence, s.who(tk.ID), tk.Limit, tk.State, tk.Fence)
			}
		}
		if tk.State == store.Held {
			held[tk.Limit] += tk.Weighs()
			if tk.Effective != nil {
				s.Fatalf("Snapshot: %s is held in %q but shows effective priority %d", s.who(tk.ID), tk.Limit, *tk.Effective)
			}
			continue
		}
		waiting[tk.Limit]++
		if tk.Position != waiting[tk.Limit] {
			s.Fatalf("Snapshot(%q): %s is waiter %d of %q as listed but reports position %d", limits, s.who(tk.ID), waiting[tk.Limit], tk.Limit, tk.Position)
		}
		switch {
		case l.Policy.Ordered() != store.ByPriority && tk.Effective != nil:
			s.Fatalf("Snapshot: %s waits in %q (order %s) but shows effective priority %d", s.who(tk.ID), tk.Limit, l.Policy.Ordered(), *tk.Effective)
		case l.Policy.Ordered() == store.ByPriority && tk.Effective == nil:
			s.Fatalf("Snapshot: %s waits in priority limit %q without its effective priority", s.who(tk.ID), tk.Limit)
		case l.Policy.Ordered() == store.ByPriority && *tk.Effective != l.Policy.Effective(tk, sn.Now):
			s.Fatalf("Snapshot: %s (priority %d, created %v before the snapshot) shows effective priority %d in %q (aging %v), want %d",
				s.who(tk.ID), tk.Priority, sn.Now.Sub(tk.Created), *tk.Effective, tk.Limit, l.Policy.AgingOr(), l.Policy.Effective(tk, sn.Now))
		}
	}
	for _, l := range sn.Limits {
		if l.Held != held[l.Name] || l.Waiting != waiting[l.Name] {
			s.Fatalf("Snapshot(%q): limit %q reports %d held, %d waiting; its tickets hold %d slots, %d wait", limits, l.Name, l.Held, l.Waiting, held[l.Name], waiting[l.Name])
		}
	}
	return sn
}

// checkRate checks a snapshot's rate fields of l at now.
func (s *suite) checkRate(l store.Limit, now time.Time) {
	s.Helper()
	r := l.Policy.Rate
	if r.N == 0 {
		if len(l.Starts) != 0 || !l.Opens.IsZero() {
			s.Fatalf("Snapshot: limit %q has no rate but lists starts %v, opens %v", l.Name, l.Starts, l.Opens)
		}
		return
	}
	if len(l.Starts) > r.N {
		s.Fatalf("Snapshot: limit %q (rate %s) lists %d starts, more than %d", l.Name, r, len(l.Starts), r.N)
	}
	for i, t := range l.Starts {
		if !t.After(now.Add(-r.Per)) || t.After(now) || i > 0 && t.Before(l.Starts[i-1]) {
			s.Fatalf("Snapshot at %v: limit %q (rate %s) lists starts %v; want those of the window (%v, %v], oldest first", now, l.Name, r, l.Starts, now.Add(-r.Per), now)
		}
	}
	want := time.Time{}
	if len(l.Starts) == r.N {
		want = l.Starts[0].Add(r.Per)
	}
	if !l.Opens.Equal(want) {
		s.Fatalf("Snapshot at %v: limit %q (rate %s, starts %v) opens %v, want %v", now, l.Name, r, l.Starts, l.Opens, want)
	}
}

// limitP is limit name as a snapshot of it lists it.
func (s *suite) limitP(name string) store.Limit {
	s.Helper()
	l, ok := findLimit(s.psnap(name), name)
	if !ok {
		s.Fatalf("Snapshot(%q): limit missing", name)
	}
	return l
}

// wantQueue checks limit's waiters, in the snapshot's order, are exactly
// tks, and that Get gives each whose first limit is limit its place there.
func (s *suite) wantQueue(limit string, tks ...store.Ticket) {
	s.Helper()
	sn := s.psnap(limit)
	var got, want []string
	for _, tk := range sn.Tickets {
		if tk.Limit == limit && tk.State == store.Waiting {
			got = append(got, s.who(tk.ID))
		}
	}
	for _, tk := range tks {
		want = append(want, s.who(tk.ID))
	}
	if !slices.Equal(got, want) {
		s.Fatalf("limit %q (policy %q): waiters %v, want %v in that order", limit, s.limitOf(sn, limit).Policy, got, want)
	}
	for i, tk := range tks {
		if tk.Names()[0] == limit {
			s.wantWaiting(tk, i+1)
		}
	}
}

func (s *suite) limitOf(sn store.Snapshot, name string) store.Limit {
	l, _ := findLimit(sn, name)
	return l
}

// wantHeldSet checks which of tks are held: exactly those want names.
func (s *suite) wantHeldSet(want []store.Ticket, tks ...store.Ticket) {
	s.Helper()
	for _, tk := range tks {
		got := s.get(tk)
		w := store.Waiting
		if slices.ContainsFunc(want, func(w store.Ticket) bool { return w.ID == tk.ID }) {
			w = store.Held
		}
		if got.State != w {
			s.Fatalf("%s is %s (position %d), want %s", s.who(tk.ID), got.State, got.Position, w)
		}
	}
}

// SetPolicy refuses a missing limit (ErrLimitNotFound) and a policy out of
// bounds (ErrInvalid), changing nothing; Enqueue refuses a priority or
// share out of bounds. A ticket keeps its priority and share.
func testPolicyRefusals(s *suite) {
	s.wantPolicyErr("nolimit", store.PolicyChange{Order: ordP(store.ByPriority)}, store.ErrLimitNotFound)
	s.wantNoLimit("nolimit")
	s.wantPolicyErr("bad name", store.PolicyChange{Order: ordP(store.ByPriority)}, store.ErrInvalid)
	s.setLimit("p", 2)
	good := store.Policy{Order: store.ByPriority, Aging: 5 * time.Second, Rate: store.Rate{N: 3, Per: time.Minute}}
	s.setPolicy("p", store.PolicyChange{Order: ordP(store.ByPriority), Aging: durP(5 * time.Second), Rate: rateP(3, time.Minute)}, good)
	for _, ch := range []store.PolicyChange{
		{Order: ordP("lottery")},
		{Order: ordP("PRIORITY")},
		{Aging: durP(500 * time.Millisecond)},
		{Aging: durP(-time.Second)},
		{Aging: durP(store.MaxPer + time.Second)},
		{Rate: rateP(0, time.Minute)},
		{Rate: rateP(-1, time.Minute)},
		{Rate: rateP(1, 500*time.Millisecond)},
		{Rate: rateP(1, 0)},
		{Rate: rateP(store.MaxRate+1, time.Minute)},
		{Rate: rateP(1, store.MaxPer+time.Second)},
		// One bad part refuses the whole change.
		{Order: ordP(store.Fair), Rate: rateP(1, time.Millisecond)},
		{Order: ordP(store.FIFO), Aging: durP(time.Millisecond)},
	} {
		s.wantPolicyErr("p", ch, store.ErrInvalid)
	}
	if l := s.limitP("p"); l.Policy != good {
		s.Fatalf("limit p: policy %+v after refused changes, want %+v", l.Policy, good)
	}

	for _, r := range []store.EnqueueRequest{
		s.reqP("BAD1", lims("p"), 1, 2, store.MaxPriority+1, ""),
		s.reqP("BAD2", lims("p"), 1, 2, store.MinPriority-1, ""),
		s.reqP("BAD3", lims("p"), 1, 2, 0, strings.Repeat("s", store.MaxShare+1)),
		s.reqP("BAD4", lims("p"), 1, 2, 0, "tab\there"),
	} {
		if tk, err := s.st.Enqueue(s.ctx, r); !errors.Is(err, store.ErrInvalid) {
			s.Fatalf("Enqueue %s (priority %d, share %q) = %s, %v; want an error wrapping ErrInvalid", s.who(r.ID), r.Priority, r.Share, tk.State, err)
		}
		if _, err := s.st.Get(s.ctx, r.ID); !errors.Is(err, store.ErrNotFound) {
			s.Fatalf("Get %s after its enqueue was refused: %v, want ErrNotFound", s.who(r.ID), err)
		}
	}
	hi := s.enqP("HI", lims("p"), 1, 2, store.MaxPriority, strings.Repeat("s", store.MaxShare))
	lo := s.enqP("LO", lims("p"), 1, 2, store.MinPriority, "team a")
	for _, tk := range []store.Ticket{hi, lo} {
		if got := s.get(tk); got.Priority != tk.Priority || got.Share != tk.Share {
			s.Fatalf("Get %s: priority %d, share %q; want %d, %q", s.who(tk.ID), got.Priority, got.Share, tk.Priority, tk.Share)
		}
	}
	for _, tk := range s.psnap("p").Tickets {
		if tk.ID == lo.ID && (tk.Priority != lo.Priority || tk.Share != lo.Share) {
			s.Fatalf("Snapshot: %s has priority %d, share %q; want %d, %q", s.who(tk.ID), tk.Priority, tk.Share, lo.Priority, lo.Share)
		}
	}
}

// SetPolicy changes only the parts it names: a nil part is kept, order
// FIFO clears the aging, a zero rate clears the rate. A resize, an
// enqueue and a reopen keep the policy.
func testPolicySet(s *suite) {
	s.setLimit("q", 2)
	if l := s.limitP("q"); !l.Policy.IsFIFO() || l.Policy.Ordered() != store.FIFO {
		s.Fatalf("a new limit has policy %+v, want FIFO without a rate", l.Policy)
	}
	pol := store.Policy{Order: store.ByPriority, Aging: 5 * time.Second, Rate: store.Rate{N: 3, Per: time.Minute}}
	l := s.setPolicy("q", store.PolicyChange{Order: ordP(store.ByPriority), Aging: durP(5 * time.Second), Rate: rateP(3, time.Minute)}, pol)
	if l.Slots != 2 || l.Held != 0 || l.Waiting != 0 {
		s.Fatalf("SetPolicy(q) returned %d slots, %d held, %d waiting; want 2, 0, 0", l.Slots, l.Held, l.Waiting)
	}
	s.setPolicy("q", store.PolicyChange{}, pol)
	pol.Rate = store.Rate{N: 5, Per: time.Hour}
	s.setPolicy("q", store.PolicyChange{Rate: rateP(5, time.Hour)}, pol)
	pol.Aging = 10 * time.Second
	s.setPolicy("q", store.PolicyChange{Aging: durP(10 * time.Second)}, pol)
	s.setLimit("q", 3)
	s.enq("A", "q", 7)
	if got := s.limitP("q"); !samePolicy(got.Policy, pol) || got.Slots != 3 {
		s.Fatalf("after a resize and an enqueue: limit q has %d slots, policy %q; want 3, %q", got.Slots, got.Policy, pol)
	}
	s.setPolicy("q", store.PolicyChange{Order: ordP(store.Fair)}, store.Policy{Order: store.Fair, Rate: pol.Rate})
	s.setPolicy("q", store.PolicyChange{Rate: &store.Rate{}}, store.Policy{Order: store.Fair})
	s.setPolicy("q", store.PolicyChange{Order: ordP(store.ByPriority), Aging: durP(7 * time.Second), Rate: rateP(2, time.Minute)},
		store.Policy{Order: store.ByPriority, Aging: 7 * time.Second, Rate: store.Rate{N: 2, Per: time.Minute}})
	// FIFO clears the aging: a later priority order ages by the default.
	s.setPolicy("q", store.PolicyChange{Order: ordP(store.FIFO)}, store.Policy{Rate: store.Rate{N: 2, Per: time.Minute}})
	s.setPolicy("q", store.PolicyChange{Order: ordP(store.ByPriority)}, store.Policy{Order: store.ByPriority, Rate: store.Rate{N: 2, Per: time.Minute}})
	if got := s.limitP("q").Policy; got.AgingOr() != store.DefaultAging {
		s.Fatalf("limit q: priority after FIFO ages by %v, want the default %v (FIFO clears the aging)", got.AgingOr(), store.DefaultAging)
	}
	s.setPolicy("q", store.PolicyChange{Order: ordP(store.FIFO), Rate: &store.Rate{}}, store.Policy{})

	s.setLimit("r", 1)
	want := store.Policy{Order: store.Fair, Rate: store.Rate{N: 4, Per: 2 * time.Hour}}
	s.setPolicy("r", store.PolicyChange{Order: ordP(store.Fair), Rate: rateP(4, 2*time.Hour)}, want)
	if s.b.Reopen != nil {
		s.st = s.b.Reopen()
		if got := s.limitP("r").Policy; !samePolicy(got, want) {
			s.Fatalf("after a reopen: limit r has policy %q, want %q", got, want)
		}
		if got := s.limitP("q").Policy; !got.IsFIFO() {
			s.Fatalf("after a reopen: limit q has policy %q, want fifo", got)
		}
	}
}

// A priority limit admits the highest priority first, ties in ticket
// order; Position and the snapshot follow that order, from the moment
// the policy is set, and FIFO brings back ticket order.
func testPriorityOrder(s *suite) {
	s.setLimit("p", 1)
	h := s.enq("H", "p", 1)
	a := s.enqP("A", lims("p"), 1, 1, 0, "")
	b := s.enqP("B", lims("p"), 1, 1, 5, "")
	c := s.enqP("C", lims("p"), 1, 1, 5, "")
	d := s.enqP("D", lims("p"), 1, 1, -3, "")
	e := s.enqP("E", lims("p"), 1, 1, 10, "")
	s.wantQueue("p", a, b, c, d, e) // FIFO: priorities do not count
	l := s.setPolicy("p", store.PolicyChange{Order: ordP(store.ByPriority)}, store.Policy{Order: store.ByPriority})
	if l.Held != 1 || l.Waiting != 5 {
		s.Fatalf("SetPolicy(p) returned %d held, %d waiting; want 1, 5", l.Held, l.Waiting)
	}
	s.wantQueue("p", e, b, c, a, d)
	f := s.enqP("F", lims("p"), 1, 1, 5, "")
	if f.Position != 4 {
		s.Fatalf("Enqueue F (priority 5) returned position %d, want 4: behind E (10), B and C (5, older), ahead of A (0) and D (-3)", f.Position)
	}
	s.wantQueue("p", e, b, c, f, a, d)
	s.release(h, true)
	s.wantHeld(e, 0)
	s.wantQueue("p", b, c, f, a, d)
	s.setPolicy("p", store.PolicyChange{Order: ordP(store.FIFO)}, store.Policy{})
	s.wantQueue("p", a, b, c, d, f)
	s.setPolicy("p", store.PolicyChange{Order: ordP(store.ByPriority)}, store.Policy{Order: store.ByPriority})
	for _, next := range []store.Ticket{b, c, f, a, d} {
		s.release(s.heldIn("p"), true)
		s.wantHeld(next, 0)
	}
	s.wantQueue("p")
}

// heldIn is the one ticket held in limit.
func (s *suite) heldIn(limit string) store.Ticket {
	s.Helper()
	var out []store.Ticket
	for _, tk := range s.psnap(limit).Tickets {
		if tk.State == store.Held {
			out = append(out, tk)
		}
	}
	if len(out) != 1 {
		s.Fatalf("limit %q: %d tickets held, want 1", limit, len(out))
	}
	return s.get(out[0])
}

// A waiter's priority grows one point per aging waited: a low priority
// that has waited overtakes a higher one that came later, and is admitted
// before it; a much higher one still goes first.
func testPriorityAging(s *suite) {
	const aging = time.Second
	s.setLimit("a", 1)
	s.setPolicy("a", store.PolicyChange{Order: ordP(store.ByPriority), Aging: durP(aging)}, store.Policy{Order: store.ByPriority, Aging: aging})
	h := s.enq("H", "a", 1)
	low := s.enqP("LOW", lims("a"), 1, 1, 0, "")
	s.advance(3 * aging)
	mid := s.enqP("MID", lims("a"), 1, 1, 2, "") // LOW has 3 points by now
	top := s.enqP("TOP", lims("a"), 1, 1, 10, "")
	s.wantQueue("a", top, low, mid)
	for _, tk := range s.psnap("a").Tickets {
		if tk.ID == low.ID && *tk.Effective < 3 {
			s.Fatalf("%s (priority 0) waited %v with aging %v: effective priority %d, want at least 3", s.who(low.ID), 3*aging, aging, *tk.Effective)
		}
	}
	s.release(h, true)
	s.wantHeld(top, 0)
	s.release(top, true)
	s.wantHeld(low, 0)
	s.wantWaiting(mid, 1)
	s.release(low, true)
	s.wantHeld(mid, 0)
}

// A fair limit admits first the share holding the fewest of its slots,
// counting slots (weights), its own waiters ahead and the share's holders,
// ties in ticket order: one share's many waiters do not shut out another's.
// A ticket's share is its Share, else its holder's user.
func testFairShare(s *suite) {
	s.setLimit("f", 2)
	s.setPolicy("f", store.PolicyChange{Order: ordP(store.Fair)}, store.Policy{Order: store.Fair})
	h1 := s.enqP("H1", lims("f"), 1, 2, 0, "alice")
	h2 := s.enqP("H2", lims("f"), 1, 2, 0, "alice")
	a1 := s.enqP("A1", lims("f"), 1, 2, 0, "alice")
	a2 := s.enqP("A2", lims("f"), 1, 2, 9, "alice") // priorities do not count here
	a3 := s.enqP("A3", lims("f"), 1, 2, 0, "alice")
	bob := func(name string) store.Ticket {
		r := s.reqP(name, lims("f"), 1, 2, 0, "")
		r.Holder.User = "bob"
		return s.enqPReq(r)
	}
	b1 := bob("B1")
	b2 := bob("B2")
	s.wantQueue("f", b1, b2, a1, a2, a3)
	s.release(h1, true)
	s.wantHeld(b1, -1)
	s.wantQueue("f", a1, b2, a2, a3) // alice 1 and bob 1: ticket order
	s.release(h2, true)
	s.wantHeld(a1, -1)
	s.wantQueue("f", a2, b2, a3)
	s.release(b1, true) // bob holds none now
	s.wantHeld(b2, -1)
	s.wantQueue("f", a2, a3)

	// Slots, not tickets: alice holds 2 slots in one ticket, bob 1.
	s.setLimit("g", 4)
	s.setPolicy("g", store.PolicyChange{Order: ordP(store.Fair)}, store.Policy{Order: store.Fair})
	s.enqP("HA", lims("g"), 2, 4, 0, "alice")
	s.enqP("HB", lims("g"), 1, 4, 0, "bob")
	hc := s.enqP("HC", lims("g"), 1, 4, 0, "carol")
	wa := s.enqP("WA", lims("g"), 1, 4, 0, "alice")
	wb := s.enqP("WB", lims("g"), 1, 4, 0, "bob")
	s.wantQueue("g", wb, wa)
	s.release(hc, true)
	s.wantHeld(wb, -1)
	s.wantWaiting(wa, 1)
}

// rateWaits reports whether tk, enqueued into a rated limit whose window
// holds first's admission, waits as it must: when it was admitted, the
// store's clock must show the window slid meanwhile (a loaded machine
// with a real clock), and the rest of the case is skipped.
func (s *suite) rateWaits(tk, first store.Ticket, per time.Duration) bool {
	s.Helper()
	got := s.get(tk)
	if got.State == store.Waiting {
		return true
	}
	if slid := got.Admitted.Sub(first.Admitted); slid < per {
		s.Fatalf("%s admitted %v after %s, within the rate's window of %v", s.who(tk.ID), slid, s.who(first.ID), per)
	}
	s.Logf("%s was admitted %v after %s: the window slid before the check (a slow step)", s.who(tk.ID), got.Admitted.Sub(first.Admitted), s.who(first.ID))
	return false
}

// A rate admits at most N in any window, each admission counted once
// whatever its weight, and the waiters beyond wait with free slots; the
// snapshot lists the starts and when the window opens. Raising the rate
// or clearing it admits at once (SetPolicy settles); once the window
// slides, a waiter's renewal admits it, also behind a heavy ticket
// ahead of it in ticket order but not in the limit's order.
func testRate(s *suite) {
	s.setLimit("r", 20)
	s.setPolicy("r", store.PolicyChange{Rate: rateP(4, time.Hour)}, store.Policy{Rate: store.Rate{N: 4, Per: time.Hour}})
	w3 := s.enqM("W3", lims("r"), 3, 20)
	a := s.enq("A", "r", 20)
	b := s.enq("B", "r", 20)
	c := s.enq("C", "r", 20)
	d := s.enq("D", "r", 20)
	s.wantHeldSet([]store.Ticket{w3, a, b, c}, w3, a, b, c, d)
	s.wantWaiting(d, 1)
	l := s.limitP("r")
	if len(l.Starts) != 4 || l.Opens.IsZero() || l.Held != 6 || l.Waiting != 1 {
		s.Fatalf("limit r (rate 4/1h) after 4 admissions, one of weight 3: %d held, %d waiting, starts %v, opens %v; want 6 held, 1 waiting, 4 starts, the window's opening",
			l.Held, l.Waiting, l.Starts, l.Opens)
	}
	s.release(a, true)
	s.release(w3, true)
	d = s.renew(d)
	s.wantWaiting(d, 1)
	if s.b.Reopen != nil {
		s.st = s.b.Reopen()
		s.renew(d)
		s.wantWaiting(d, 1)
		if l := s.limitP("r"); len(l.Starts) != 4 {
			s.Fatalf("after a reopen: limit r lists starts %v, want the 4 of its window", l.Starts)
		}
	}
	l = s.setPolicy("r", store.PolicyChange{Rate: rateP(5, time.Hour)}, store.Policy{Rate: store.Rate{N: 5, Per: time.Hour}})
	if l.Waiting != 0 || len(l.Starts) != 5 {
		s.Fatalf("SetPolicy(r, rate 5/1h) after 4 admissions: %d waiting, starts %v; want D admitted in its step, 5 starts", l.Waiting, l.Starts)
	}
	s.wantHeld(d, -1)
	e := s.enq("E", "r", 20)
	s.wantWaiting(e, 1)
	l = s.setPolicy("r", store.PolicyChange{Rate: &store.Rate{}}, store.Policy{})
	if l.Waiting != 0 || len(l.Starts) != 0 || !l.Opens.IsZero() {
		s.Fatalf("SetPolicy(r, rate 0): %d waiting, starts %v, opens %v; want E admitted, no starts", l.Waiting, l.Starts, l.Opens)
	}
	s.wantHeld(e, -1)

	// The window slides. "s": a plain queue. "u": a priority order puts L
	// before the heavy H, which does not fit; the rate holds L back.
	const per = 2 * time.Second
	s.setLimit("s", 5)
	s.setPolicy("s", store.PolicyChange{Rate: rateP(1, per)}, store.Policy{Rate: store.Rate{N: 1, Per: per}})
	s.setLimit("u", 3)
	s.setPolicy("u", store.PolicyChange{Order: ordP(store.ByPriority), Rate: rateP(1, per)}, store.Policy{Order: store.ByPriority, Rate: store.Rate{N: 1, Per: per}})
	x := s.enq("X", "s", 5)
	xu := s.enqP("XU", lims("u"), 1, 3, 0, "")
	y := s.enq("Y", "s", 5)
	hu := s.enqP("HU", lims("u"), 3, 3, 0, "")
	lu := s.enqP("LU", lims("u"), 1, 3, 5, "")
	x, xu = s.wantHeld(x, 0), s.wantHeld(xu, 0)
	if !s.rateWaits(y, x, per) || !s.rateWaits(lu, xu, per) {
		return
	}
	if ls := s.limitP("s"); len(ls.Starts) != 1 || ls.Opens.IsZero() {
		s.Fatalf("limit s (rate 1/%v) after X's admission: starts %v, opens %v; want X's start and the window's opening", per, ls.Starts, ls.Opens)
	}
	s.wantQueue("u", lu, hu)
	s.advance(per)
	if got := s.renew(y); got.State != store.Held {
		s.Fatalf("Renew %s after the window of limit s slid: %s at position %d, want admitted", s.who(y.ID), got.State, got.Position)
	}
	s.wantHeld(y, 1)
	if got := s.renew(lu); got.State != store.Held {
		s.Fatalf("Renew %s after the window of limit u slid: %s at position %d, want admitted (first in u's order, it fits)", s.who(lu.ID), got.State, got.Position)
	}
	s.wantHeld(lu, -1)
	s.wantWaiting(hu, 1)
	if ls := s.limitP("s"); len(ls.Starts) != 1 || ls.Starts[0].Before(x.Admitted.Add(per)) {
		s.Fatalf("limit s (rate 1/%v) after the window slid and Y's admission: starts %v, want Y's only (X's at %v is out)", per, ls.Starts, x.Admitted)
	}
}

// Admissions at once, through several handles, spend each token once: the
// rate is charged in the step that admits.
func testRateConcurrent(s *suite) {
	const n, tokens = 10, 3
	s.setLimit("c", 2*n)
	s.setPolicy("c", store.PolicyChange{Rate: rateP(tokens, time.Hour)}, store.Policy{Rate: store.Rate{N: tokens, Per: time.Hour}})
	handles := []store.Store{s.st}
	if s.b.Skewed != nil {
		handles = append(handles, s.b.Skewed(0))
	}
	reqs := make([]store.EnqueueRequest, n)
	for i := range reqs {
		reqs[i] = s.req(fmt.Sprintf("T%d", i), "c", 2*n)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = handles[i%len(handles)].Enqueue(s.ctx, r)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			s.Fatalf("Enqueue %s: %v", s.who(reqs[i].ID), err)
		}
	}
	l := s.limitP("c")
	if l.Held != tokens || l.Waiting != n-tokens || len(l.Starts) != tokens {
		s.Fatalf("limit c (rate %d/1h): %d enqueued at once: %d held, %d waiting, starts %v; want %d held, %d waiting, %d starts",
			tokens, n, l.Held, l.Waiting, l.Starts, tokens, n-tokens, tokens)
	}
	// Renewals at once through every handle admit nobody more.
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, err := handles[i%len(handles)].Get(s.ctx, r.ID)
			if err == nil {
				_, err = handles[(i+1)%len(handles)].Renew(s.ctx, tk, s.h.TTL)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			s.Fatalf("Get and Renew %s: %v", s.who(reqs[i].ID), err)
		}
	}
	if l := s.limitP("c"); l.Held != tokens || l.Waiting != n-tokens {
		s.Fatalf("limit c (rate %d/1h) after renewals at once: %d held, %d waiting; want %d, %d", tokens, l.Held, l.Waiting, tokens, n-tokens)
	}
}

// Across limits of different orders: a waiter is not admitted past one
// ahead of it in another of its limits (where the limits agree, each one's
// order holds); where they disagree, one of the waiters is still admitted,
// and with every holder gone everyone is admitted in turn: no deadlock.
func testOrderAcrossLimits(s *suite) {
	s.setLimit("fa", 2)
	s.setLimit("pb", 2)
	s.setPolicy("fa", store.PolicyChange{Order: ordP(store.Fair)}, store.Policy{Order: store.Fair})
	s.setPolicy("pb", store.PolicyChange{Order: ordP(store.ByPriority)}, store.Policy{Order: store.ByPriority})
	h1 := s.enq("H1", "pb", 2)
	h2 := s.enq("H2", "pb", 2)
	w := s.enqP("W", lims("fa", "pb"), 1, 2, 0, "")
	v := s.enqP("V", lims("pb"), 2, 2, 5, "")
	s.wantQueue("fa", w)
	s.wantQueue("pb", v, w)
	s.release(h1, true) // 1 free in pb: V does not fit, and W may not pass it
	s.wantQueue("pb", v, w)
	s.wantQueue("fa", w)
	s.release(h2, true)
	s.wantHeld(v, -1)
	s.wantQueue("pb", w)
	s.release(v, true)
	s.wantHeld(w, -1)

	// The limits disagree: fair "ff" puts X first (its share holds none),
	// priority "pp" puts Y first.
	s.setLimit("ff", 2)
	s.setLimit("pp", 1)
	s.setPolicy("ff", store.PolicyChange{Order: ordP(store.Fair)}, store.Policy{Order: store.Fair})
	s.setPolicy("pp", store.PolicyChange{Order: ordP(store.ByPriority)}, store.Policy{Order: store.ByPriority})
	s.enqP("Z", lims("ff"), 1, 2, 0, "y")
	hp := s.enq("HP", "pp", 1)
	x := s.enqP("X", lims("ff", "pp"), 1, 2, 0, "x")
	y := s.enqP("Y", lims("ff", "pp"), 1, 2, 5, "y")
	s.wantQueue("ff", x, y)
	s.wantQueue("pp", y, x)
	s.release(hp, true)
	first, second := x, y
	if s.get(y).State == store.Held {
		first, second = y, x
	}
	s.wantHeld(first, -1)
	s.wantWaiting(second, 1)
	s.release(first, true)
	s.wantHeld(second, -1)

	s.drainAll()
}

// drainAll fills limits of each order with a fixed mix of tickets of
// several limits, weights, priorities and shares, then releases every
// holder, round after round: while tickets wait and nothing is held,
// someone must be admitted, and in the end everyone has been.
func (s *suite) drainAll() {
	s.Helper()
	sizes := map[string]int{"d1": 2, "d2": 2, "d3": 3}
	s.setLimit("d1", 2)
	s.setLimit("d2", 2)
	s.setLimit("d3", 3)
	s.setPolicy("d2", store.PolicyChange{Order: ordP(store.ByPriority)}, store.Policy{Order: store.ByPriority})
	s.setPolicy("d3", store.PolicyChange{Order: ordP(store.Fair)}, store.Policy{Order: store.Fair})
	rng := rand.New(rand.NewPCG(31, 7))
	names := []string{"d1", "d2", "d3"}
	var all []store.Ticket
	for i := range 14 {
		ls := slices.Clone(names)
		rng.Shuffle(len(ls), func(a, b int) { ls[a], ls[b] = ls[b], ls[a] })
		ls = ls[:1+rng.IntN(3)]
		all = append(all, s.enqP(fmt.Sprintf("D%d", i), ls, 1+rng.IntN(2), 2, rng.IntN(11)-5, []string{"s1", "s2", "s3"}[rng.IntN(3)]))
	}
	admitted := map[string]bool{}
	for round := 0; len(admitted) < len(all); round++ {
		if round > 2*len(all) {
			s.Fatalf("after %d rounds of releases, %d of %d tickets admitted", round, len(admitted), len(all))
		}
		sn := s.psnap(names...)
		var held []store.Ticket
		waiting := 0
		for _, l := range sn.Limits {
			if l.Held > sizes[l.Name] {
				s.Fatalf("limit %q: %d slots held of %d", l.Name, l.Held, sizes[l.Name])
			}
		}
		for _, tk := range sn.Tickets {
			if tk.Limit != tk.Names()[0] {
				continue
			}
			if tk.State == store.Held {
				admitted[tk.ID] = true
				held = append(held, tk)
			} else {
				waiting++
			}
		}
		if len(held) == 0 && waiting > 0 {
			s.Fatalf("round %d: %d tickets wait and none is held: deadlock", round, waiting)
		}
		for _, tk := range held {
			s.release(tk, true)
		}
	}
}
