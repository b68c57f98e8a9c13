package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slotctl/slotctl/store"
)

// The cases of tickets that name several limits or weigh several slots
// (docs/leases.md §2.1 item 9, rule 13): admission to all of a ticket's
// limits in one step or to none, weights counted in slots, one FIFO order
// across limits, and every removal freeing all of a ticket's slots at once.

// lims is a list of limit names, in the order a ticket names them.
func lims(names ...string) []string { return names }

// ix is a list of slot indexes.
func ix(xs ...int) []int { return xs }

// reqM is a request for a ticket of limits (in that order) and weight;
// limits that do not exist are created with slots.
func (s *suite) reqM(name string, limits []string, weight, slots int) store.EnqueueRequest {
	r := s.req(name, "", slots)
	r.Limits, r.Weight = limits, weight
	return r
}

func (s *suite) enqM(name string, limits []string, weight, slots int) store.Ticket {
	s.Helper()
	return s.enqReq(s.reqM(name, limits, weight, slots))
}

// views reads a snapshot of every limit (which checks that a ticket is in
// one state under all of its limits) and returns id's view under each limit
// it is listed under.
func (s *suite) views(id string) map[string]store.Ticket {
	s.Helper()
	out := map[string]store.Ticket{}
	for _, tk := range s.snap().Tickets {
		if tk.ID == id {
			out[tk.Limit] = tk
		}
	}
	return out
}

// wantIn checks that tk is live and held, through Get and under each of its
// limits in a snapshot, with exactly the indexes want names for a limit
// (any, for a limit want does not name). It returns the ticket as Get reads it.
func (s *suite) wantIn(tk store.Ticket, want map[string][]int) store.Ticket {
	s.Helper()
	got := s.wantHeld(tk, -1)
	if got.Multi() {
		for _, name := range got.Names() {
			if _, ok := got.Indexes[name]; !ok {
				s.Fatalf("%s (limits %q, weight %d) is held but its Indexes %v miss limit %q", s.who(tk.ID), got.Names(), got.Weighs(), got.Indexes, name)
			}
		}
	}
	for name, w := range want {
		if !slices.Contains(got.Names(), name) {
			s.Fatalf("%s: limits %q, want %q among them", s.who(tk.ID), got.Names(), name)
		}
		if g := got.In(name); !slices.Equal(g, w) {
			s.Fatalf("%s holds slots %v of %q (Slot %d, Indexes %v), want %v", s.who(tk.ID), g, name, got.Slot, got.Indexes, w)
		}
	}
	vs := s.views(tk.ID)
	for _, name := range got.Names() {
		v, ok := vs[name]
		switch {
		case !ok:
			s.Fatalf("Snapshot: %s (limits %q) is held but not listed under %q", s.who(tk.ID), got.Names(), name)
		case v.State != store.Held:
			s.Fatalf("Snapshot: %s is held (Get) but %s at position %d under %q: held in one limit and waiting in another", s.who(tk.ID), v.State, v.Position, name)
		case !slices.Equal(v.In(name), got.In(name)):
			s.Fatalf("Snapshot: %s holds %v of %q, but Get says %v", s.who(tk.ID), v.In(name), name, got.In(name))
		case v.Slot != got.In(name)[0]:
			s.Fatalf("Snapshot: %s listed under %q with slot %d, want its lowest index there, %d", s.who(tk.ID), name, v.Slot, got.In(name)[0])
		}
	}
	return got
}

// wantWaitingIn checks that tk is live and waiting, through Get and under
// each of its limits in a snapshot, at the positions pos names (the first
// limit's is Get's Position).
func (s *suite) wantWaitingIn(tk store.Ticket, pos map[string]int) store.Ticket {
	s.Helper()
	got := s.get(tk)
	if got.State != store.Waiting {
		s.Fatalf("%s (limits %q, weight %d) is held (%v), want waiting in all of its limits", s.who(tk.ID), got.Names(), got.Weighs(), got.Indexes)
	}
	if got.Expired() {
		s.Fatalf("%s is waiting but expired (remaining %v)", s.who(tk.ID), got.Remaining)
	}
	if p, ok := pos[got.Limit]; ok && got.Position != p {
		s.Fatalf("%s waits at position %d of %q (Get), want %d", s.who(tk.ID), got.Position, got.Limit, p)
	}
	vs := s.views(tk.ID)
	for _, name := range got.Names() {
		v, ok := vs[name]
		switch {
		case !ok:
			s.Fatalf("Snapshot: %s (limits %q) waits but is not listed under %q", s.who(tk.ID), got.Names(), name)
		case v.State != store.Waiting:
			s.Fatalf("Snapshot: %s waits (Get) but is held in %v of %q: held in one limit and waiting in another", s.who(tk.ID), v.In(name), name)
		}
		if p, ok := pos[name]; ok && v.Position != p {
			s.Fatalf("Snapshot: %s waits at position %d of %q, want %d", s.who(tk.ID), v.Position, name, p)
		}
	}
	for name := range pos {
		if !slices.Contains(got.Names(), name) {
			s.Fatalf("%s: limits %q, want %q among them", s.who(tk.ID), got.Names(), name)
		}
	}
	return got
}

// wantSlotsVar checks the SLOTCTL_SLOTS value of a held ticket.
func (s *suite) wantSlotsVar(tk store.Ticket, want string) {
	s.Helper()
	if got := tk.SlotsVar(); got != want {
		s.Fatalf("%s: SlotsVar %q (limits %q, Indexes %v), want %q", s.who(tk.ID), got, tk.Names(), tk.Indexes, want)
	}
}

// wantNotListed checks that no limit of a snapshot lists tk.
func (s *suite) wantNotListed(tk store.Ticket) {
	s.Helper()
	for _, v := range s.snap().Tickets {
		if v.ID == tk.ID {
			s.Fatalf("Snapshot: %s still listed under %q (%s)", s.who(tk.ID), v.Limit, v.State)
		}
	}
}

// A ticket of several limits is held in all of them or waits in all of
// them: never held in a free limit while it waits for a full one (that is
// hold-and-wait, the deadlock), and once admitted it holds a slot in each.
func testAtomicAdmission(s *suite) {
	x := s.enq("X", "a", 1)
	t := s.enqM("T", lims("a", "b"), 1, 1) // b is created free; a is full
	if t.State != store.Waiting {
		s.Fatalf("T {a, b}: admitted (%v) while X holds a's only slot", t.Indexes)
	}
	t = s.wantWaitingIn(t, map[string]int{"a": 1, "b": 1})
	s.checkLimit("a", 1, 1, 1)
	s.checkLimit("b", 1, 0, 1)

	// The other order: the first limit free, the second full.
	y := s.enq("Y", "c", 1)
	u := s.enqM("U", lims("d", "c"), 1, 1)
	u = s.wantWaitingIn(u, map[string]int{"d": 1, "c": 1})
	s.checkLimit("d", 1, 0, 1)

	// Three limits, only the last full.
	z := s.enq("Z", "g", 1)
	v := s.enqM("V", lims("e", "f", "g"), 1, 1)
	v = s.wantWaitingIn(v, map[string]int{"e": 1, "f": 1, "g": 1})
	s.checkLimit("e", 1, 0, 1)
	s.checkLimit("f", 1, 0, 1)

	s.release(x, true) // T is admitted to a and b in one step
	t = s.wantIn(t, map[string][]int{"a": ix(0), "b": ix(0)})
	s.wantSlotsVar(t, "a=0 b=0")
	again := s.reqM("T", lims("a", "b"), 1, 1)
	again.ID = t.ID
	if got := s.enqReq(again); got.Fence != t.Fence || got.State != store.Held || !slices.Equal(got.In("b"), ix(0)) {
		s.Fatalf("Enqueue T again: (%s, %v, fence %d), want the same ticket (held, %v, fence %d)", got.State, got.Indexes, got.Fence, t.Indexes, t.Fence)
	}
	if got, err := s.st.SetChild(s.ctx, t, 4321, 987); err != nil || !slices.Equal(got.In("a"), ix(0)) || !slices.Equal(got.In("b"), ix(0)) {
		s.Fatalf("SetChild T: (%s, %v), %v; want it held in a and b as before", got.State, got.Indexes, err)
	}
	for _, l := range []string{"b", "a"} {
		sn := s.snap(l)
		if len(sn.Tickets) != 1 || sn.Tickets[0].ID != t.ID || sn.Tickets[0].Limit != l {
			s.Fatalf("Snapshot(%q): tickets %v, want T alone, under %q", l, ticketKeys(sn), l)
		}
	}
	s.checkLimit("a", 1, 1, 0)
	s.checkLimit("b", 1, 1, 0)
	s.release(y, true)
	u = s.wantIn(u, map[string][]int{"d": ix(0), "c": ix(0)})
	s.wantSlotsVar(u, "d=0 c=0")
	s.release(z, true)
	v = s.wantIn(v, map[string][]int{"e": ix(0), "f": ix(0), "g": ix(0)})
	s.wantSlotsVar(v, "e=0 f=0 g=0")

	// A held ticket of several limits renews as one. (Renewed first: on
	// a store in real time the steps above may have taken most of a TTL
	// on a slow machine, and T's lease counts from its enqueue.)
	t, u, v = s.renew(t), s.renew(u), s.renew(v)
	s.advance(s.part())
	t, u, v = s.renew(t), s.renew(u), s.renew(v)
	s.advance(s.part())
	s.wantIn(t, map[string][]int{"a": ix(0), "b": ix(0)})
	for _, l := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		s.checkLimit(l, 1, 1, 0)
	}
	s.release(t, true)
	s.checkLimit("a", 1, 0, 0)
	s.checkLimit("b", 1, 0, 0)
}

// A ticket of weight w holds w slots of each of its limits: Limit.Held
// counts slots, a ticket waits unless w are free, and it takes the lowest
// free indexes, ascending, distinct from every other holder's.
func testWeights(s *suite) {
	h := s.enqM("H", lims("w"), 2, 3)
	h = s.wantIn(h, map[string][]int{"w": ix(0, 1)})
	s.wantSlotsVar(h, "w=0,1")
	s.checkLimit("w", 3, 2, 0)
	j := s.enqM("J", lims("w"), 2, 3)
	if j.State != store.Waiting {
		s.Fatalf("J, weight 2, admitted beside H, weight 2, in a 3-slot limit: weights not counted in slots")
	}
	s.wantWaitingIn(j, map[string]int{"w": 1})
	s.checkLimit("w", 3, 2, 1)
	s.release(h, true)
	j = s.wantIn(j, map[string][]int{"w": ix(0, 1)})
	l := s.enq("L", "w", 3)
	s.wantIn(l, map[string][]int{"w": ix(2)})
	s.checkLimit("w", 3, 3, 0)
	s.release(j, true)
	s.checkLimit("w", 3, 1, 0)

	// The lowest free indexes, though not contiguous.
	a, b, c := s.enq("A", "v", 5), s.enq("B", "v", 5), s.enq("C", "v", 5)
	s.wantSlots(ix(0, 1, 2), a, b, c)
	s.release(b, true)
	d := s.enqM("D", lims("v"), 2, 5)
	s.wantIn(d, map[string][]int{"v": ix(1, 3)})
	e := s.enqM("E", lims("v"), 2, 5)
	s.wantWaitingIn(e, map[string]int{"v": 1})
	s.checkLimit("v", 5, 4, 1)
	s.release(d, true)
	s.wantIn(e, map[string][]int{"v": ix(1, 3)})
	s.checkLimit("v", 5, 4, 0)

	// Weights in several limits.
	n := s.enqM("N", lims("x", "y"), 2, 4)
	n = s.wantIn(n, map[string][]int{"x": ix(0, 1), "y": ix(0, 1)})
	s.wantSlotsVar(n, "x=0,1 y=0,1")
	o := s.enq("O", "y", 4)
	s.wantIn(o, map[string][]int{"y": ix(2)})
	p := s.enqM("P", lims("y", "x"), 2, 4) // x has 2 free, y 1
	s.wantWaitingIn(p, map[string]int{"y": 1, "x": 1})
	s.checkLimit("x", 4, 2, 1)
	s.checkLimit("y", 4, 3, 1)
	s.release(o, true)
	p = s.wantIn(p, map[string][]int{"y": ix(2, 3), "x": ix(2, 3)})
	s.wantSlotsVar(p, "y=2,3 x=2,3")
	s.checkLimit("x", 4, 4, 0)
	s.checkLimit("y", 4, 4, 0)
	s.release(n, true)
	q := s.enq("Q", "x", 4)
	s.wantIn(q, map[string][]int{"x": ix(0)})
	s.checkLimit("x", 4, 3, 0)
	s.checkLimit("y", 4, 2, 0)
}

// The queue order is one sequence across limits: a ticket waiting in a full
// limit holds its place in its other limits too, so a younger ticket of one
// of those is not admitted past it, free slots or not.
func testFIFOAcrossLimits(s *suite) {
	a := s.enq("A", "fa", 1)
	t := s.enqM("T", lims("fa", "fb"), 1, 1)
	s.wantWaitingIn(t, map[string]int{"fa": 1, "fb": 1})
	u := s.enq("U", "fb", 1)
	if u.State == store.Held {
		s.Fatalf("U {fb} admitted past the older T {fa, fb}, which waits for fa: FIFO holds across limits")
	}
	s.wantWaitingIn(u, map[string]int{"fb": 2})
	s.checkLimit("fb", 1, 0, 2)
	// A limit no waiting ticket names goes on.
	v := s.enq("V", "fc", 1)
	s.wantHeld(v, 0)
	// Through a chain: W {fd, fb} waits behind T in fb, X {fd} behind W, with fd free.
	w := s.enqM("W", lims("fd", "fb"), 1, 1)
	s.wantWaitingIn(w, map[string]int{"fd": 1, "fb": 3})
	x := s.enq("X", "fd", 1)
	s.wantWaitingIn(x, map[string]int{"fd": 2})
	s.checkLimit("fd", 1, 0, 2)

	s.release(a, true)
	t = s.wantIn(t, map[string][]int{"fa": ix(0), "fb": ix(0)})
	s.wantWaitingIn(u, map[string]int{"fb": 1})
	s.wantWaitingIn(w, map[string]int{"fd": 1, "fb": 2})
	s.wantWaitingIn(x, map[string]int{"fd": 2})
	s.release(t, true)
	u = s.wantIn(u, map[string][]int{"fb": ix(0)})
	s.wantWaitingIn(w, map[string]int{"fd": 1, "fb": 1})
	s.wantWaitingIn(x, map[string]int{"fd": 2})
	s.release(u, true)
	w = s.wantIn(w, map[string][]int{"fd": ix(0), "fb": ix(0)})
	s.wantWaitingIn(x, map[string]int{"fd": 1})
	s.release(w, true)
	s.wantIn(x, map[string][]int{"fd": ix(0)})
	s.checkLimit("fb", 1, 0, 0)

	// A waiter that leaves lets the tickets behind it through in its other
	// limits, though it held nothing there.
	b := s.enq("B", "fe", 1)
	y := s.enqM("Y", lims("fe", "ff"), 1, 1)
	z := s.enq("Z", "ff", 1)
	s.wantWaitingIn(z, map[string]int{"ff": 2})
	s.cancel(y, true)
	s.wantIn(z, map[string][]int{"ff": ix(0)})
	s.wantHeld(b, 0)
}

// A heavy ticket at the head of the queue waits for its weight of free
// slots, and the lighter tickets behind it wait too, though a slot is free:
// otherwise a stream of light jobs starves it.
func testHeavyHead(s *suite) {
	a, b := s.enq("A", "hh", 3), s.enq("B", "hh", 3)
	s.wantSlots(ix(0, 1), a, b)
	h := s.enqM("H", lims("hh"), 2, 3)
	s.wantWaitingIn(h, map[string]int{"hh": 1})
	l := s.enq("L", "hh", 3)
	if l.State == store.Held {
		s.Fatalf("L, weight 1, admitted into the free slot of hh past H, weight 2, at the head of the queue")
	}
	s.wantWaitingIn(l, map[string]int{"hh": 2})
	// Nor through another limit.
	k := s.enqM("K", lims("hk", "hh"), 1, 3)
	s.wantWaitingIn(k, map[string]int{"hk": 1, "hh": 3})
	s.checkLimit("hh", 3, 2, 3)
	s.checkLimit("hk", 3, 0, 1)

	s.release(a, true) // 2 free: H takes them
	h = s.wantIn(h, map[string][]int{"hh": ix(0, 2)})
	s.wantWaitingIn(l, map[string]int{"hh": 1})
	s.wantWaitingIn(k, map[string]int{"hk": 1, "hh": 2})
	s.checkLimit("hh", 3, 3, 2)
	s.release(b, true)
	s.wantIn(l, map[string][]int{"hh": ix(1)})
	s.wantWaitingIn(k, map[string]int{"hk": 1, "hh": 1})
	s.release(h, true)
	s.wantIn(k, map[string][]int{"hk": ix(0), "hh": ix(0)})
	s.checkLimit("hh", 3, 2, 0)

	// A heavy head that gives up lets the lighter ticket behind it in.
	s.enq("M", "hh", 3) // full
	h2 := s.enqM("H2", lims("hh"), 2, 3)
	n := s.enq("N", "hh", 3)
	s.release(k, true) // one free: H2 waits, N behind it
	s.wantWaitingIn(h2, map[string]int{"hh": 1})
	s.wantWaitingIn(n, map[string]int{"hh": 2})
	s.cancel(h2, true)
	s.wantIn(n, map[string][]int{"hh": ix(0)})
	s.checkLimit("hh", 3, 3, 0)
}

// The release of a ticket of several limits frees its slots in every one
// of them in one step and promotes in each; an admission that this causes
// in one limit promotes behind the admitted ticket in its other limits too,
// as far as they have room, and no further.
func testMultiRelease(s *suite) {
	t := s.enqM("T", lims("ra", "rb"), 1, 1)
	s.wantIn(t, map[string][]int{"ra": ix(0), "rb": ix(0)})
	wa, wb := s.enq("WA", "ra", 1), s.enq("WB", "rb", 1)
	s.wantWaiting(wa, 1)
	s.wantWaiting(wb, 1)
	s.release(t, true)
	s.wantHeld(wa, 0)
	s.wantHeld(wb, 0)
	s.checkLimit("ra", 1, 1, 0)
	s.checkLimit("rb", 1, 1, 0)

	// Weight 2 in two limits frees two slots in each.
	t2 := s.enqM("T2", lims("rc", "rd"), 2, 2)
	c1, c2 := s.enq("C1", "rc", 2), s.enq("C2", "rc", 2)
	d1 := s.enqM("D1", lims("rd"), 2, 2)
	s.checkLimit("rc", 2, 2, 2)
	s.checkLimit("rd", 2, 2, 1)
	s.release(t2, true)
	s.wantSlots(ix(0, 1), c1, c2)
	s.wantIn(d1, map[string][]int{"rd": ix(0, 1)})
	s.checkLimit("rc", 2, 2, 0)
	s.checkLimit("rd", 2, 2, 0)

	// The closure: X's release in ca admits T3 {ca, cb}, and U behind T3
	// in cb, which has room for both; V, behind U, finds cb full.
	// Their bells ring: U's although nothing was released in cb.
	x := s.enq("X", "ca", 1)
	rt3, ru := s.reqM("T3", lims("ca", "cb"), 1, 2), s.req("U", "cb", 2)
	bellT3, bellU := s.watch(rt3.ID), s.watch(ru.ID)
	t3, u := s.enqReq(rt3), s.enqReq(ru)
	v := s.enq("V", "cb", 2)
	s.wantWaitingIn(t3, map[string]int{"ca": 1, "cb": 1})
	s.wantWaitingIn(u, map[string]int{"cb": 2})
	s.wantWaitingIn(v, map[string]int{"cb": 3})
	s.quiet(bellT3, bellU)
	s.release(x, true)
	s.wantIn(t3, map[string][]int{"ca": ix(0), "cb": ix(0)})
	s.wantIn(u, map[string][]int{"cb": ix(1)})
	s.wantWaitingIn(v, map[string]int{"cb": 1})
	s.checkLimit("ca", 1, 1, 0)
	s.checkLimit("cb", 2, 2, 1)
	s.wantRing(bellT3, "T3 {ca, cb} was admitted by X's release in ca")
	s.wantRing(bellU, "U {cb} was admitted behind T3, by X's release in ca")

	// A ticket promoted before its holder saw it, cancelled from its
	// waiting copy, frees its slots in both limits.
	y := s.enqM("Y", lims("ra", "rb"), 1, 1) // behind WA in ra, WB in rb
	z := s.enq("Z", "rb", 1)
	s.release(wa, true)
	s.wantWaitingIn(y, map[string]int{"ra": 1, "rb": 1})
	s.release(wb, true)
	s.wantIn(y, map[string][]int{"ra": ix(0), "rb": ix(0)})
	s.cancel(y, true) // y is the waiting copy
	s.wantGone(y)
	s.wantHeld(z, 0)
	s.checkLimit("ra", 1, 0, 0)
	s.checkLimit("rb", 1, 1, 0)
	s.wantEvent("ra", y, string(store.Cancelled))
	s.wantEvent("rb", y, string(store.Cancelled))
}

// watch returns a bell for id, closed at the end of the case.
func (s *suite) watch(id string) store.Bell {
	s.Helper()
	bell, err := s.st.Watch(s.ctx, id)
	if err != nil {
		s.Fatalf("Watch %s: %v", s.who(id), err)
	}
	s.Cleanup(func() { _ = bell.Close() })
	return bell
}

// quiet lets the rings of the writes so far arrive, then forgets them.
func (s *suite) quiet(bells ...store.Bell) {
	time.Sleep(50 * time.Millisecond)
	for _, b := range bells {
		drain(b)
	}
}

// wantRing waits for bell to ring after what.
func (s *suite) wantRing(bell store.Bell, what string) {
	s.Helper()
	const ringWait = 5 * time.Second
	select {
	case <-bell.C():
	case <-time.After(ringWait):
		s.Fatalf("the bell did not ring within %v after %s", ringWait, what)
	}
}

// Shrinking a limit evicts nobody and admits nobody until the held slots
// leave room for the head's weight; a waiter heavier than the shrunk size
// waits (and the tickets behind it wait) until the limit grows; a new ticket
// heavier than the size is refused unless the limit is paused.
func testResizeWeights(s *suite) {
	a := s.enqM("A", lims("rz"), 2, 4)
	b := s.enqM("B", lims("rz"), 2, 4)
	c := s.enqM("C", lims("rz"), 2, 4)
	d := s.enq("D", "rz", 4)
	s.wantIn(a, map[string][]int{"rz": ix(0, 1)})
	s.wantIn(b, map[string][]int{"rz": ix(2, 3)})
	s.setLimit("rz", 3)
	s.wantIn(a, map[string][]int{"rz": ix(0, 1)})
	s.wantIn(b, map[string][]int{"rz": ix(2, 3)})
	s.checkLimit("rz", 3, 4, 2)
	s.release(a, true) // 2 held of 3: C (weight 2) does not fit, D may not pass it
	s.wantWaitingIn(c, map[string]int{"rz": 1})
	s.wantWaitingIn(d, map[string]int{"rz": 2})
	s.checkLimit("rz", 3, 2, 2)
	s.setLimit("rz", 1)
	s.release(b, true) // empty, but C is heavier than the size: it waits and blocks D
	s.wantWaitingIn(c, map[string]int{"rz": 1})
	s.wantWaitingIn(d, map[string]int{"rz": 2})
	s.checkLimit("rz", 1, 0, 2)
	r := s.reqM("E", lims("rz"), 2, 1)
	if tk, err := s.st.Enqueue(s.ctx, r); !errors.As(err, new(*store.WeightError)) {
		s.Fatalf("Enqueue E, weight 2, into rz of 1 slot: ticket (%s), err %v; want a *store.WeightError", tk.State, err)
	}
	s.setLimit("rz", 0) // paused: any weight may wait
	e := s.enqM("E2", lims("rz"), 3, 0)
	s.wantWaitingIn(e, map[string]int{"rz": 3})
	s.setLimit("rz", 2)
	s.wantIn(c, map[string][]int{"rz": ix(0, 1)})
	s.wantWaitingIn(d, map[string]int{"rz": 1})
	s.wantWaitingIn(e, map[string]int{"rz": 2})
	s.checkLimit("rz", 2, 2, 2)
	s.setLimit("rz", 4)
	s.wantIn(d, map[string][]int{"rz": ix(2)})
	s.wantWaitingIn(e, map[string]int{"rz": 1}) // 3 > the 1 free
	s.checkLimit("rz", 4, 3, 1)
	s.release(c, true)
	s.wantIn(e, map[string][]int{"rz": ix(0, 1, 3)})
	s.checkLimit("rz", 4, 4, 0)

	// A light head behind weighted holders of a shrunk limit.
	f := s.enqM("F", lims("rs"), 2, 4)
	g := s.enqM("G", lims("rs"), 2, 4)
	h := s.enq("H", "rs", 4)
	s.setLimit("rs", 2)
	s.release(f, true) // 2 held of 2
	s.wantWaitingIn(h, map[string]int{"rs": 1})
	s.checkLimit("rs", 2, 2, 1)
	s.release(g, true)
	s.wantIn(h, map[string][]int{"rs": ix(0)})

	// A paused limit holds a ticket of several limits back in all of them,
	// and the tickets behind it in the others; resuming it admits them.
	s.setLimit("pa", 0)
	s.setLimit("pb", 2)
	t := s.enqM("T", lims("pb", "pa"), 1, 1)
	u := s.enq("U", "pb", 2)
	s.wantWaitingIn(t, map[string]int{"pb": 1, "pa": 1})
	s.wantWaitingIn(u, map[string]int{"pb": 2})
	s.checkLimit("pb", 2, 0, 2)
	s.setLimit("pa", 1)
	s.wantIn(t, map[string][]int{"pb": ix(0), "pa": ix(0)})
	s.wantIn(u, map[string][]int{"pb": ix(1)})
}

// An expired ticket of several limits is reaped once, by a Reap of any one
// of its limits or of all: one Removal, gone from every limit, its slots
// freed and handed on in each.
func testReapMulti(s *suite) {
	t := s.enqM("T", lims("ma", "mb"), 1, 1)
	wa, wb := s.enq("WA", "ma", 1), s.enq("WB", "mb", 1)
	s.advance(s.part())
	wa, wb = s.renew(wa), s.renew(wb)
	s.advance(s.part()) // T expired
	s.wantRemoved(`Reap(dryRun, "mb")`, s.reap(true, "mb"), t)
	s.wantWaiting(wa, 1)
	s.wantRemoved(`Reap("mb")`, s.reap(false, "mb"), t)
	s.wantGone(t)
	s.wantLost(t)
	s.wantNotListed(t)
	s.wantHeld(wa, 0)
	s.wantHeld(wb, 0)
	s.checkLimit("ma", 1, 1, 0)
	s.checkLimit("mb", 1, 1, 0)
	if rm := s.reap(false); len(rm) != 0 {
		s.Fatalf("a second Reap removed %v, want nothing", s.removed(rm))
	}
	// Kept: on a store in real time the steps since their last renewal
	// may take a good part of a TTL on a loaded machine.
	wa, wb = s.renew(wa), s.renew(wb)
	s.release(t, false)
	s.releaseWhy(t, store.Lost, false) // its holder noticed: logged in each of its limits
	for _, l := range []string{"ma", "mb"} {
		var kinds []string
		for _, e := range s.events(l, store.MaxEvents) {
			if e.Ticket == t.ID {
				kinds = append(kinds, e.Kind)
			}
		}
		if count(kinds, string(store.Reaped)) != 1 || count(kinds, string(store.Lost)) != 1 || count(kinds, string(store.Released)) != 0 {
			s.Fatalf("Events(%q): T's events %v, want one %q and one %q in each of its limits", l, kinds, store.Reaped, store.Lost)
		}
	}
	s.checkLimit("ma", 1, 1, 0)

	// A Reap of both its limits, or of all, lists it once.
	wa, wb = s.renew(wa), s.renew(wb)
	t2 := s.enqM("T2", lims("mc", "md"), 2, 2)
	wc := s.enq("WC", "mc", 2)
	wd := s.enqM("WD", lims("md"), 2, 2)
	s.advance(s.part())
	wa, wb, wc, wd = s.renew(wa), s.renew(wb), s.renew(wc), s.renew(wd)
	s.advance(s.part()) // T2 expired
	s.wantRemoved("Reap(dryRun)", s.reap(true), t2)
	s.wantRemoved(`Reap(dryRun, "md", "mc")`, s.reap(true, "md", "mc"), t2)
	s.wantRemoved(`Reap("mc", "md")`, s.reap(false, "mc", "md"), t2)
	s.wantGone(t2)
	s.wantHeld(wc, 0)
	s.wantIn(wd, map[string][]int{"md": ix(0, 1)})
	s.checkLimit("mc", 2, 1, 0)
	s.checkLimit("md", 2, 2, 0)
	for _, l := range []string{"mc", "md"} {
		n := 0
		for _, e := range s.events(l, store.MaxEvents) {
			if e.Ticket == t2.ID && e.Kind == string(store.Reaped) {
				n++
			}
		}
		if n != 1 {
			s.Fatalf("Events(%q): %d reaped events of T2, want one in each of its limits", l, n)
		}
	}

	// An expired waiter of several limits, swept by an admission into one
	// of them, no longer holds back the tickets behind it in the others.
	h := s.enq("H", "me", 1)
	t3 := s.enqM("T3", lims("me", "mf"), 1, 1)
	u := s.enq("U", "mf", 1)
	s.wantWaitingIn(u, map[string]int{"mf": 2})
	s.advance(s.part())
	h, u = s.renew(h), s.renew(u)
	s.advance(s.part()) // T3 expired
	v := s.enq("V", "mf", 1)
	s.wantGone(t3)
	s.wantHeld(u, 0)
	s.wantWaiting(v, 1)
	s.wantHeld(h, 0)
	s.checkLimit("me", 1, 1, 0)

	// An expired holder of several limits, swept by an admission into one
	// of them, frees its slots in the others too.
	t4 := s.enqM("T4", lims("mg", "mh"), 1, 1)
	wh := s.enq("WH", "mh", 1)
	s.advance(s.part())
	wh = s.renew(wh)
	s.advance(s.part()) // T4 expired
	g := s.enq("G", "mg", 1)
	s.wantGone(t4)
	s.wantHeld(g, 0)
	s.wantHeld(wh, 0)
	s.checkLimit("mh", 1, 1, 0)
}

// Releasing a ticket of several limits twice (or cancelling or reaping it
// after) frees its slots once: the second release finds nothing.
func testDoubleReleaseMulti(s *suite) {
	t := s.enqM("T", lims("da", "db"), 1, 1)
	wa, wb := s.enq("WA", "da", 1), s.enq("WB", "db", 1)
	xa, xb := s.enq("XA", "da", 1), s.enq("XB", "db", 1)
	s.release(t, true)
	s.release(t, false)
	s.releaseWhy(t, store.Reaped, false)
	s.cancel(t, false)
	s.release(store.Ticket{ID: t.ID, Limit: t.Limit, Limits: t.Limits, Weight: t.Weight}, false) // any fence
	s.wantHeld(wa, 0)
	s.wantHeld(wb, 0)
	s.wantWaiting(xa, 1)
	s.wantWaiting(xb, 1)
	s.checkLimit("da", 1, 1, 1)
	s.checkLimit("db", 1, 1, 1)

	w2 := s.enqM("W2", lims("dc", "dd"), 2, 2)
	y := s.enqM("Y", lims("dd", "dc"), 1, 2)
	z := s.enq("Z", "dc", 2)
	s.release(w2, true)
	y = s.wantIn(y, map[string][]int{"dd": ix(0), "dc": ix(0)})
	s.wantIn(z, map[string][]int{"dc": ix(1)})
	q := s.enq("Q", "dc", 2)
	s.release(w2, false)
	s.wantWaitingIn(q, map[string]int{"dc": 1})
	s.checkLimit("dc", 2, 2, 1)
	s.checkLimit("dd", 2, 1, 0)
}

// wantWeightError checks that r is refused with a *store.WeightError naming
// limit and its size, and that nothing was created.
func (s *suite) wantWeightError(r store.EnqueueRequest, limit string, slots int) {
	s.Helper()
	tk, err := s.st.Enqueue(s.ctx, r)
	var we *store.WeightError
	if !errors.As(err, &we) {
		s.Fatalf("Enqueue %s into %q, weight %d: ticket (%s, %v), err %v; want a *store.WeightError", s.who(r.ID), r.Names(), r.Weight, tk.State, tk.Indexes, err)
	}
	if !errors.Is(err, store.ErrInvalid) {
		s.Fatalf("Enqueue %s: %v does not wrap ErrInvalid", s.who(r.ID), err)
	}
	if we.Limit != limit || we.Slots != slots || we.Weight != r.Weighs() {
		s.Fatalf("Enqueue %s into %q, weight %d: %+v, want Limit %q, Slots %d, Weight %d", s.who(r.ID), r.Names(), r.Weight, *we, limit, slots, r.Weighs())
	}
	s.wantGone(store.Ticket{ID: r.ID})
}

// wantConflict checks that r is refused with a *store.SlotsConflictError
// naming limit, and that nothing was created.
func (s *suite) wantConflict(r store.EnqueueRequest, limit string, have int) {
	s.Helper()
	tk, err := s.st.Enqueue(s.ctx, r)
	var sc *store.SlotsConflictError
	if !errors.As(err, &sc) {
		s.Fatalf("Enqueue %s into %q with CheckSlots, %d slots: ticket (%s), err %v; want a *store.SlotsConflictError naming %q", s.who(r.ID), r.Names(), r.Slots, tk.State, err, limit)
	}
	if sc.Limit != limit || sc.Have != have || sc.Want != r.Slots {
		s.Fatalf("Enqueue %s into %q: %+v, want Limit %q, Have %d, Want %d (the first limit in the order given)", s.who(r.ID), r.Names(), *sc, limit, have, r.Slots)
	}
	s.wantGone(store.Ticket{ID: r.ID})
}

// What Enqueue refuses of a ticket of several limits or a weight, before it
// writes anything: a limit named twice, more than MaxLimits limits, a weight
// above the size of a limit (existing, or created with the request's Slots)
// that is not paused, another size with CheckSlots in any of its limits.
// Weight 0 means 1.
func testEnqueueRefusals(s *suite) {
	wantInvalid := func(what string, r store.EnqueueRequest, created ...string) {
		s.Helper()
		tk, err := s.st.Enqueue(s.ctx, r)
		if !errors.Is(err, store.ErrInvalid) {
			s.Fatalf("Enqueue %s: ticket (%s, limits %q), err %v; want an error wrapping ErrInvalid", what, tk.State, tk.Names(), err)
		}
		s.wantGone(store.Ticket{ID: r.ID})
		for _, l := range created {
			s.wantNoLimit(l)
		}
	}
	wantInvalid("into x, y, x", s.reqM("D", lims("x", "y", "x"), 1, 1), "x", "y")
	var many []string
	for i := range store.MaxLimits + 1 {
		many = append(many, fmt.Sprintf("n%02d", i))
	}
	wantInvalid(fmt.Sprintf("into %d limits", len(many)), s.reqM("M", many, 1, 1), many...)
	bad := s.reqM("B", lims("p", "q"), 1, 1)
	bad.Limit = "q"
	wantInvalid(`with Limit "q" and Limits ["p" "q"]`, bad, "p", "q")
	wantInvalid("with weight -1", s.reqM("W", lims("p"), -1, 1), "p")
	wantInvalid(fmt.Sprintf("with weight %d", store.MaxSlots+1), s.reqM("W", lims("p"), store.MaxSlots+1, store.MaxSlots), "p")

	// The most limits a ticket may name.
	m := s.enqM("M16", many[:store.MaxLimits], 1, 1)
	want := map[string][]int{}
	for _, l := range many[:store.MaxLimits] {
		want[l] = ix(0)
	}
	s.wantIn(m, want)
	// Limit and Limits may both name the first.
	both := s.reqM("P", lims("p", "q"), 1, 1)
	both.Limit = "p"
	s.wantIn(s.enqReq(both), map[string][]int{"p": ix(0), "q": ix(0)})

	// A weight above the size of an existing limit, or of one the request creates.
	s.setLimit("e2", 2)
	s.setLimit("e4", 4)
	s.wantWeightError(s.reqM("W1", lims("e2"), 3, 3), "e2", 2)
	s.wantWeightError(s.reqM("W2", lims("e4", "e2"), 3, 4), "e2", 2)
	s.wantWeightError(s.reqM("W3", lims("fresh"), 3, 2), "fresh", 2)
	s.wantNoLimit("fresh")
	s.wantWeightError(s.reqM("W4", lims("e4", "fresh2"), 3, 2), "fresh2", 2)
	s.wantNoLimit("fresh2")
	s.checkLimit("e4", 4, 0, 0)
	// A refused id was not created: it may be enqueued.
	r := s.reqM("W5", lims("e2"), 3, 2)
	s.wantWeightError(r, "e2", 2)
	r.Weight = 2
	s.wantIn(s.enqReq(r), map[string][]int{"e2": ix(0, 1)})
	// As heavy as the size is fine; so is any weight in a paused limit.
	s.wantIn(s.enqM("W6", lims("e4"), 4, 4), map[string][]int{"e4": ix(0, 1, 2, 3)})
	s.setLimit("e0", 0)
	s.wantWaitingIn(s.enqM("W7", lims("e0"), 5, 3), map[string]int{"e0": 1})
	s.wantWaitingIn(s.enqM("W8", lims("z0"), 5, 0), map[string]int{"z0": 1}) // created paused

	// Weight 0 means 1.
	a := s.enqM("A", lims("wz"), 0, 2)
	b := s.enqM("B", lims("wz"), 0, 2)
	s.wantIn(a, map[string][]int{"wz": ix(0)})
	s.wantIn(b, map[string][]int{"wz": ix(1)})
	if a.Weighs() != 1 {
		s.Fatalf("A enqueued with weight 0 weighs %d, want 1", a.Weighs())
	}
	c := s.enqM("C", lims("wz"), 1, 2)
	s.wantWaitingIn(c, map[string]int{"wz": 1})
	s.checkLimit("wz", 2, 2, 1)
	s.wantIn(s.enqM("D0", lims("wy", "wx"), 0, 1), map[string][]int{"wy": ix(0), "wx": ix(0)})

	// CheckSlots: another size in any of the limits, the first in the order given.
	s.setLimit("s2", 2)
	s.setLimit("s3", 3)
	s.setLimit("s5", 5)
	conflict := func(name string, limits []string, slots int, limit string, have int) {
		s.Helper()
		r := s.reqM(name, limits, 1, slots)
		r.CheckSlots = true
		s.wantConflict(r, limit, have)
	}
	conflict("K1", lims("s2", "s3"), 2, "s3", 3)
	conflict("K2", lims("snew", "s3"), 2, "s3", 3)
	s.wantNoLimit("snew")
	conflict("K3", lims("s5", "s3"), 2, "s5", 5)
	conflict("K4", lims("s3", "s2"), 3, "s2", 2)
	for _, l := range []string{"s2", "s3", "s5"} {
		s.wantNoLimitTicket(l)
	}
	ok := s.reqM("K5", lims("s2", "s3"), 1, 2) // no CheckSlots: the sizes stand
	s.wantIn(s.enqReq(ok), map[string][]int{"s2": ix(0), "s3": ix(0)})
	s.checkLimit("s3", 3, 1, 0)
}

// wantEventOf checks one event's fields as docs/leases.md §2.1 item 9 says:
// Limits when the ticket names several, Weight and Indexes (its indexes in
// the event's limit) when it weighs more than one.
func (s *suite) wantEventOf(e store.Event, tk store.Ticket, slots []int) {
	s.Helper()
	what := fmt.Sprintf("event %d (%s of %s in %q)", e.Seq, e.Kind, s.who(e.Ticket), e.Limit)
	if e.Fence != tk.Fence {
		s.Fatalf("%s: fence %d, want %d", what, e.Fence, tk.Fence)
	}
	names := tk.Names()
	if len(names) > 1 {
		if !slices.Equal(e.Limits, names) {
			s.Fatalf("%s: Limits %q, want all of the ticket's limits %q", what, e.Limits, names)
		}
	} else if len(e.Limits) > 1 || len(e.Limits) == 1 && e.Limits[0] != e.Limit {
		s.Fatalf("%s: Limits %q for a ticket of one limit", what, e.Limits)
	}
	wantSlot := -1
	if len(slots) > 0 {
		wantSlot = slots[0]
	}
	if e.Slot != wantSlot {
		s.Fatalf("%s: slot %d, want %d", what, e.Slot, wantSlot)
	}
	if w := tk.Weighs(); w > 1 {
		if e.Weight != w || !slices.Equal(e.Indexes, slots) {
			s.Fatalf("%s: weight %d, indexes %v; want weight %d, indexes %v", what, e.Weight, e.Indexes, w, slots)
		}
	} else if e.Weight > 1 || len(e.Indexes) > 1 || len(e.Indexes) == 1 && e.Indexes[0] != e.Slot {
		s.Fatalf("%s: weight %d, indexes %v for a ticket of weight 1", what, e.Weight, e.Indexes)
	}
}

// Sizes gives each limit a request creates its own size (Slots for the
// rest); a limit that exists keeps its size, and the weight is checked
// against the size each limit has or is created with.
func testSizes(s *suite) {
	r := s.reqM("A", lims("sa", "sb", "sc"), 2, 2)
	r.Sizes = map[string]int{"sb": 3}
	s.enqReq(r)
	s.checkLimit("sa", 2, 2, 0)
	s.checkLimit("sb", 3, 2, 0)
	s.checkLimit("sc", 2, 2, 0)
	r = s.reqM("B", lims("sb", "sd"), 1, 1)
	r.Sizes = map[string]int{"sb": 7, "sd": 4}
	s.enqReq(r)
	s.checkLimit("sb", 3, 3, 0) // exists: keeps its size
	s.checkLimit("sd", 4, 1, 0)
	r = s.reqM("C", lims("se", "sf"), 3, 3)
	r.Sizes = map[string]int{"sf": 2}
	var we *store.WeightError
	if _, err := s.st.Enqueue(s.ctx, r); !errors.As(err, &we) || we.Limit != "sf" {
		s.Fatalf("Enqueue of weight 3 creating sf with 2 slots: %v, want a *store.WeightError naming sf", err)
	}
	s.wantNoLimit("se")
	s.wantNoLimit("sf")
	r = s.reqM("D", lims("sg"), 1, 1)
	r.Sizes = map[string]int{"zz": 2}
	if _, err := s.st.Enqueue(s.ctx, r); !errors.Is(err, store.ErrInvalid) {
		s.Fatalf("Enqueue with a size for a limit it does not name: %v, want ErrInvalid", err)
	}
}

// A ticket of several limits logs each admission and removal once in each
// of its limits, naming them all, with its weight and its indexes in that
// limit when it weighs more than one; Events(limit) returns that limit's.
func testEventsMulti(s *suite) {
	t := s.enqM("T", lims("ea", "eb"), 2, 2)
	u := s.enq("U", "eb", 2)
	v := s.enq("V", "ec", 1)
	w := s.enqM("W", lims("ec", "ea"), 1, 1) // waits: ea full by T, ec by V
	x := s.enqM("X", lims("ed", "ee"), 1, 1)
	s.wantIn(t, map[string][]int{"ea": ix(0, 1), "eb": ix(0, 1)})
	s.wantIn(x, map[string][]int{"ed": ix(0), "ee": ix(0)})
	s.release(t, true) // U admitted; W still waits for ec
	s.wantIn(u, map[string][]int{"eb": ix(0)})
	s.wantWaitingIn(w, map[string]int{"ec": 1, "ea": 1})
	s.cancel(w, true)
	s.release(x, true)

	type ev struct {
		kind  string
		tk    store.Ticket
		slots []int
	}
	want := map[string][]ev{
		"ea": {{"admitted", t, ix(0, 1)}, {"released", t, ix(0, 1)}, {"cancelled", w, nil}},
		"eb": {{"admitted", t, ix(0, 1)}, {"released", t, ix(0, 1)}, {"admitted", u, ix(0)}},
		"ec": {{"admitted", v, ix(0)}, {"cancelled", w, nil}},
		"ed": {{"admitted", x, ix(0)}, {"released", x, ix(0)}},
		"ee": {{"admitted", x, ix(0)}, {"released", x, ix(0)}},
	}
	total := 0
	for _, l := range []string{"ea", "eb", "ec", "ed", "ee"} {
		var known []store.Event
		for _, e := range s.events(l, 1000) {
			if slices.Contains(eventKinds, e.Kind) {
				known = append(known, e)
			}
		}
		show := func() string {
			var out []string
			for _, e := range known {
				out = append(out, e.Kind+" "+s.who(e.Ticket))
			}
			return strings.Join(out, ", ")
		}
		if len(known) != len(want[l]) {
			s.Fatalf("Events(%q): %s; want %d events", l, show(), len(want[l]))
		}
		for i, w := range want[l] {
			e := known[i]
			if e.Kind != w.kind || e.Ticket != w.tk.ID || e.Limit != l {
				s.Fatalf("Events(%q) event %d: %s of %s in %q, want %s of %s (all: %s)", l, i, e.Kind, s.who(e.Ticket), e.Limit, w.kind, s.who(w.tk.ID), show())
			}
			s.wantEventOf(e, w.tk, w.slots)
		}
		total += len(known)
	}
	n := 0
	for _, e := range s.events("", 1000) {
		if slices.Contains(eventKinds, e.Kind) {
			n++
		}
	}
	if n != total {
		s.Fatalf("Events(\"\"): %d events, want the %d of the limits together: one per limit a ticket names", n, total)
	}
}

// RemoveLimit with force removes every ticket naming the limit, from all of
// its limits at once, and hands their slots in the other limits on.
func testRemoveLimitMulti(s *suite) {
	t := s.enqM("T", lims("ra", "rb"), 1, 1)
	wa, wb := s.enq("WA", "ra", 1), s.enq("WB", "rb", 1)
	y := s.enqM("Y", lims("rb", "rc"), 1, 1)
	s.wantWaitingIn(y, map[string]int{"rb": 2, "rc": 1})
	s.removeLimit("rb", false, store.ErrLimitInUse)
	s.removeLimit("ra", false, store.ErrLimitInUse)
	s.wantIn(t, map[string][]int{"ra": ix(0), "rb": ix(0)})
	s.removeLimit("ra", true, nil)
	s.wantNoLimit("ra")
	s.wantGone(t)
	s.wantGone(wa)
	s.wantLost(t)
	s.wantNotListed(t)
	s.wantHeld(wb, 0)
	s.wantWaitingIn(y, map[string]int{"rb": 1, "rc": 1})
	s.checkLimit("rb", 1, 1, 1)
	n := 0
	for _, e := range s.events("rb", store.MaxEvents) {
		if e.Ticket == t.ID && e.Kind != "admitted" {
			n++
		}
	}
	if n != 1 {
		s.Fatalf(`Events("rb"): %d removals of T, want one: RemoveLimit("ra", force) removed it from rb too`, n)
	}
	s.release(t, false)
	s.release(wb, true)
	s.wantIn(y, map[string][]int{"rb": ix(0), "rc": ix(0)})
	s.removeLimit("rc", true, nil)
	s.wantGone(y)
	s.checkLimit("rb", 1, 0, 0)
	z := s.enq("Z", "rb", 1)
	s.wantHeld(z, 0)
}

// A holder of several limits proven dead is removed at once, by a Reap of
// any of its limits or by the sweep of an admission into one of them, and
// its slots in all of them go to their next waiters in the same step.
func testDeadMulti(s *suite) {
	t := s.enqM("T", lims("ka", "kb"), 1, 1)
	wa, wb := s.enq("WA", "ka", 1), s.enq("WB", "kb", 1)
	s.advance(s.h.TTL / 10)
	s.kill(t)
	rm := s.reap(true)
	s.wantRemoved("Reap(dryRun) with T's holder dead", rm, t)
	s.wantWaiting(wa, 1)
	s.wantWaiting(wb, 1)
	rm = s.reap(false, "kb")
	s.wantRemoved(`Reap("kb") with T's holder dead`, rm, t)
	if rm[0].Evidence != DeadEvidence {
		s.Fatalf(`Reap("kb"): T removed with evidence %q, want the judge's %q`, rm[0].Evidence, DeadEvidence)
	}
	s.wantGone(t)
	s.wantHeld(wa, 0)
	s.wantHeld(wb, 0)

	// Swept by an admission into one of its limits.
	t2 := s.enqM("T2", lims("kc", "kd"), 1, 1)
	wd := s.enq("WD", "kd", 1)
	s.kill(t2)
	u := s.enq("U", "kc", 1)
	s.wantGone(t2)
	s.wantHeld(u, 0)
	s.wantHeld(wd, 0)
	s.checkLimit("kc", 1, 1, 0)
	s.checkLimit("kd", 1, 1, 0)
}

// A store written by the previous release (record version 1: one limit,
// weight 1) reads back and works: its tickets are of one limit and weight
// one, renew and release as before, and new tickets of several limits queue
// behind them in the one order (Harness.NewLegacy).
func testLegacy(s *suite) {
	if s.h.NewLegacy == nil {
		s.Fatal("storetest: Harness.NewLegacy is nil: every backend must read a store written in the previous format (docs/leases.md §2.1 item 9)")
	}
	b := s.h.NewLegacy(s.T)
	if b.Store == nil || b.Advance == nil {
		s.Fatal("storetest: Harness.NewLegacy returned a Backend without a Store or Advance")
	}
	s.b, s.st = b, b.Store
	tks := make([]store.Ticket, len(LegacyIDs))
	for i, id := range LegacyIDs {
		s.names[id] = id
		tks[i] = store.Ticket{ID: id, Limit: LegacyLimit}
	}
	read := func(when string) {
		s.Helper()
		for i, id := range LegacyIDs {
			got, err := s.st.Get(s.ctx, id)
			if err != nil {
				s.Fatalf("%s: Get %s: %v", when, id, err)
			}
			s.checkShape("Get", got)
			if got.Limit != LegacyLimit || !slices.Equal(got.Names(), []string{LegacyLimit}) || got.Weighs() != 1 {
				s.Fatalf("%s: %s reads as limit %q of limits %q, weight %d; want one limit %q, weight 1", when, id, got.Limit, got.Names(), got.Weighs(), LegacyLimit)
			}
			if got.Holder.Host != LegacyHolder.Host || got.Holder.Pid != LegacyHolder.Pid || got.Holder.Label != LegacyHolder.Label {
				s.Fatalf("%s: %s has holder %+v, want %+v", when, id, got.Holder, LegacyHolder)
			}
			if got.Expired() {
				s.Fatalf("%s: %s expired (remaining %v)", when, id, got.Remaining)
			}
			if i > 0 && got.Fence <= tks[i-1].Fence {
				s.Fatalf("%s: %s has fence %d, not above %s's %d", when, id, got.Fence, LegacyIDs[i-1], tks[i-1].Fence)
			}
			tks[i] = got
		}
	}
	read("the legacy store")
	if tks[0].State != store.Held || tks[0].Slot != 0 || tks[1].State != store.Held || tks[1].Slot != 1 {
		s.Fatalf("legacy-a %s slot %d, legacy-b %s slot %d; want held in slots 0 and 1", tks[0].State, tks[0].Slot, tks[1].State, tks[1].Slot)
	}
	if tks[2].State != store.Waiting || tks[2].Position != 1 {
		s.Fatalf("legacy-c %s at position %d, want waiting at position 1", tks[2].State, tks[2].Position)
	}
	if tks[0].TTL != s.h.TTL {
		s.Errorf("legacy-a: TTL %v, want %v", tks[0].TTL, s.h.TTL)
	}
	s.checkLimit(LegacyLimit, 2, 2, 1)
	if s.b.Reopen != nil { // a reopen before any write reads the same
		before := ticketKeys(s.snap())
		s.st = s.b.Reopen()
		read("reopened before any write")
		if after := ticketKeys(s.snap()); !slices.Equal(before, after) {
			s.Fatalf("tickets before the reopen %v, after %v", before, after)
		}
	}

	s.advance(s.part())
	for i := range tks {
		tks[i] = s.renew(tks[i])
	}
	a, b2, c := tks[0], tks[1], tks[2]
	if c.State != store.Waiting {
		s.Fatalf("Renew legacy-c: %s, want waiting", c.State)
	}
	n := s.enqM("N", lims(LegacyLimit, "other"), 1, 2)
	if n.Fence <= c.Fence {
		s.Fatalf("N's fence %d is not above legacy-c's %d", n.Fence, c.Fence)
	}
	s.wantWaitingIn(n, map[string]int{LegacyLimit: 2, "other": 1})
	o := s.enq("O", "other", 2) // behind N in other, though other is free
	s.wantWaitingIn(o, map[string]int{"other": 2})
	s.advance(s.part()) // 1.2 TTL after the fixture's leases began: only the renewals hold them
	s.release(a, true)
	s.wantHeld(c, 0)
	s.wantHeld(b2, 1)
	s.wantWaitingIn(n, map[string]int{LegacyLimit: 1, "other": 1})
	s.release(a, false)
	s.wantWaitingIn(n, map[string]int{LegacyLimit: 1, "other": 1})
	s.checkLimit(LegacyLimit, 2, 2, 1)
	s.release(b2, true)
	n = s.wantIn(n, map[string][]int{LegacyLimit: ix(1), "other": ix(0)})
	s.wantSlotsVar(n, LegacyLimit+"=1 other=0")
	s.wantIn(o, map[string][]int{"other": ix(1)})
	s.checkLimit(LegacyLimit, 2, 2, 0)
	s.checkLimit("other", 2, 2, 0)

	if s.b.Reopen != nil {
		before := ticketKeys(s.snap())
		s.st = s.b.Reopen()
		if after := ticketKeys(s.snap()); !slices.Equal(before, after) {
			s.Fatalf("tickets before the reopen %v, after %v", before, after)
		}
		c = s.renew(c)
		n = s.renew(n)
		s.release(c, true)
		s.wantIn(n, map[string][]int{LegacyLimit: ix(1), "other": ix(0)})
		s.wantGone(a)
		s.wantGone(b2)
		if _, err := s.st.Enqueue(s.ctx, store.EnqueueRequest{ID: a.ID, Limit: LegacyLimit, Slots: 2, TTL: s.h.TTL, Holder: holder("legacy-a")}); !errors.Is(err, store.ErrRemoved) {
			s.Fatalf("Enqueue legacy-a again after its release: %v, want ErrRemoved", err)
		}
	}
}

// Many clients with tickets of several limits and weights on one store:
// never more slots held than a limit has, never two clients on one slot
// index, a ticket held in all of its limits or none, and every ticket
// admitted in the end (no deadlock, no starvation).
func testConcurrentMulti(s *suite) {
	const (
		workers = 6
		iters   = 12
	)
	names := []string{"cm0", "cm1", "cm2"}
	sizes := map[string]int{"cm0": 3, "cm1": 2, "cm2": 3}
	for _, n := range names {
		s.setLimit(n, sizes[n])
	}
	type job struct {
		id     string
		name   string
		limits []string
		weight int
	}
	jobs := make([][]job, workers)
	for w := range jobs {
		for i := range iters {
			k := w*iters + i
			var ls []string
			for j := range names { // a non-empty subset, in a rotating order
				if (k+1)>>j&1 == 1 || (k+1)%8 == 0 {
					ls = append(ls, names[(j+k)%len(names)])
				}
			}
			if len(ls) == 0 {
				ls = names[k%len(names) : k%len(names)+1]
			}
			name := fmt.Sprintf("W%d.%d", w, i)
			jobs[w] = append(jobs[w], job{id: s.id(name), name: name, limits: ls, weight: 1 + k%3%2})
		}
	}
	var (
		mu       sync.Mutex
		held     = map[string]int{}            // slots the clients believe they hold, per limit
		slotUsed = map[string]map[int]string{} // limit -> index -> holder
		stop     atomic.Bool
		wg       sync.WaitGroup
		admitted atomic.Int32
	)
	for _, n := range names {
		slotUsed[n] = map[int]string{}
	}
	deadline := time.Now().Add(60 * time.Second)
	const stall = 10 * time.Second // nobody admitted for so long: a deadlock
	var last atomic.Int64          // when somebody was last admitted (UnixNano)
	last.Store(time.Now().UnixNano())
	fail := func(format string, args ...any) {
		stop.Store(true)
		s.Errorf(format, args...)
	}
	// take records that tk's client holds its slots; it reports a broken rule.
	take := func(name string, tk store.Ticket) string {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range tk.Names() {
			ixs := tk.In(n)
			if len(ixs) != tk.Weighs() {
				return fmt.Sprintf("%s: held, weight %d, with indexes %v in %q (Indexes %v): not admitted to all of its limits %q", name, tk.Weighs(), ixs, n, tk.Indexes, tk.Names())
			}
			held[n] += tk.Weighs()
			if held[n] > sizes[n] {
				return fmt.Sprintf("%s: the clients hold %d slots of %q, which has %d", name, held[n], n, sizes[n])
			}
			for _, i := range ixs {
				if i < 0 || i >= sizes[n] {
					return fmt.Sprintf("%s: holds slot %d of %q, which has %d", name, i, n, sizes[n])
				}
				if other, dup := slotUsed[n][i]; dup {
					return fmt.Sprintf("%s: holds slot %d of %q, which %s holds", name, i, n, other)
				}
				slotUsed[n][i] = name
			}
		}
		return ""
	}
	put := func(tk store.Ticket) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range tk.Names() {
			held[n] -= tk.Weighs()
			for _, i := range tk.In(n) {
				delete(slotUsed[n], i)
			}
		}
	}
	one := func(j job) bool {
		ctx := s.ctx
		bell, err := s.st.Watch(ctx, j.id)
		if err != nil {
			fail("%s: Watch: %v", j.name, err)
			return false
		}
		defer func() { _ = bell.Close() }()
		tk, err := s.st.Enqueue(ctx, store.EnqueueRequest{ID: j.id, Limits: j.limits, Weight: j.weight, Slots: sizes[j.limits[0]], TTL: s.h.TTL, Holder: holder(j.name)})
		if err != nil {
			fail("%s: Enqueue into %q weight %d: %v", j.name, j.limits, j.weight, err)
			return false
		}
		ok := false
		defer func() {
			if !ok {
				_, _ = s.st.Cancel(context.WithoutCancel(ctx), tk)
			}
		}()
		renewed := time.Now()
		for tk.State != store.Held {
			if stop.Load() {
				return false
			}
			if time.Now().After(deadline) || time.Since(time.Unix(0, last.Load())) > stall {
				fail("%s %q: not admitted before the deadline, or nobody admitted for %v (position %d): a deadlock or starvation", j.name, j.limits, stall, tk.Position)
				return false
			}
			select {
			case <-bell.C():
			case <-time.After(25 * time.Millisecond):
			case <-ctx.Done():
				fail("%s: %v", j.name, ctx.Err())
				return false
			}
			if time.Since(renewed) > s.h.TTL/4 {
				if tk, err = s.st.Renew(ctx, tk, s.h.TTL); err != nil {
					fail("%s: Renew while waiting: %v", j.name, err)
					return false
				}
				renewed = time.Now()
				continue
			}
			if tk, err = s.st.Get(ctx, j.id); err != nil {
				fail("%s: Get while waiting: %v", j.name, err)
				return false
			}
		}
		ok = true
		admitted.Add(1)
		last.Store(time.Now().UnixNano())
		if msg := take(j.name, tk); msg != "" {
			fail("%s", msg)
			return false
		}
		if sn, err := s.st.Snapshot(ctx, j.limits...); err != nil {
			fail("%s: Snapshot: %v", j.name, err)
		} else {
			for _, l := range sn.Limits {
				if l.Held > sizes[l.Name] {
					fail("%s: the snapshot shows %d slots of %q held, which has %d", j.name, l.Held, l.Name, sizes[l.Name])
				}
			}
			for _, v := range sn.Tickets {
				if v.ID == j.id && v.State != store.Held {
					fail("%s: held (Get) but %s under %q in a snapshot", j.name, v.State, v.Limit)
				}
			}
		}
		time.Sleep(time.Millisecond) // the job: others queue meanwhile
		put(tk)
		if done, err := s.st.Release(ctx, tk, store.Released); err != nil || !done {
			fail("%s: Release = %v, %v; want true, nil", j.name, done, err)
			return false
		}
		return !stop.Load()
	}
	for w := range workers {
		wg.Go(func() {
			for _, j := range jobs[w] {
				if !one(j) {
					return
				}
			}
		})
	}
	wg.Wait()
	if s.Failed() {
		return
	}
	for _, n := range names {
		s.checkLimit(n, sizes[n], 0, 0)
	}
	s.Logf("%d clients × %d tickets of 1-3 limits, weights 1-2: %d admitted", workers, iters, admitted.Load())
}

// A restart loses nothing of a ticket of several limits: its limits, its
// weight, its indexes in each, its place in each queue.
func testReopenMulti(s *suite) {
	if s.b.Reopen == nil {
		s.Skip("backend has no Reopen")
	}
	t := s.enqM("T", lims("oa", "ob"), 2, 3)
	v := s.enq("V", "ob", 3)
	w := s.enq("W", "oa", 3)
	u := s.enqM("U", lims("ob", "oa"), 2, 3)
	x := s.enq("X", "oa", 3)
	s.wantIn(t, map[string][]int{"oa": ix(0, 1), "ob": ix(0, 1)})
	s.wantWaitingIn(u, map[string]int{"ob": 1, "oa": 1})
	before := ticketKeys(s.snap())
	s.st = s.b.Reopen()
	if s.st == nil {
		s.Fatal("Reopen returned nil")
	}
	if after := ticketKeys(s.snap()); !slices.Equal(before, after) {
		s.Fatalf("tickets before reopen %v, after %v", before, after)
	}
	s.advance(s.part())
	t, u, v, w, x = s.renew(t), s.renew(u), s.renew(v), s.renew(w), s.renew(x)
	s.checkLimit("oa", 3, 3, 2)
	s.checkLimit("ob", 3, 3, 1)
	s.release(t, true)
	s.wantIn(u, map[string][]int{"ob": ix(0, 1), "oa": ix(0, 1)})
	s.wantWaitingIn(x, map[string]int{"oa": 1})
	s.release(w, true)
	s.wantIn(x, map[string][]int{"oa": ix(2)})
	s.wantHeld(v, 2)
}
