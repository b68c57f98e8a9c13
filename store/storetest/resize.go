package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/slotctl/slotctl/store"
)

// The cases of a held ticket whose weight changes (Store.Resize,
// docs/leases.md §2.1 item 12): a shrink frees its highest
// indexes and promotes waiters in the same step; a growth takes the lowest
// free indexes, only what is free in every one of its limits, never past a
// limit's size and never while a ticket waits in one of them; the weight is
// the ticket's from then on (Get, Snapshot, Renew, a reopen, its release and
// its reap); each change is logged.

// resize resizes tk toward w and checks the answer: the same ticket, held,
// of weight want, in the shape every held ticket has.
func (s *suite) resize(tk store.Ticket, w, want int) store.Ticket {
	s.Helper()
	got, err := s.st.Resize(s.ctx, tk, w)
	if err != nil {
		s.Fatalf("Resize %s (weight %d) to %d: %v", s.who(tk.ID), tk.Weighs(), w, err)
	}
	if got.ID != tk.ID || got.Fence != tk.Fence || got.State != store.Held {
		s.Fatalf("Resize %s to %d: returned id %q fence %d %s, want the held ticket of fence %d", s.who(tk.ID), w, got.ID, got.Fence, got.State, tk.Fence)
	}
	if !slices.Equal(got.Names(), tk.Names()) {
		s.Fatalf("Resize %s to %d: limits %q, want %q", s.who(tk.ID), w, got.Names(), tk.Names())
	}
	s.checkShape("Resize", got)
	if got.Weighs() != want {
		s.Fatalf("Resize %s from weight %d toward %d: weight %d (%s), want %d", s.who(tk.ID), tk.Weighs(), w, got.Weighs(), got.SlotsVar(), want)
	}
	if got.Expired() {
		s.Fatalf("Resize %s: remaining %v, want its lease running", s.who(tk.ID), got.Remaining)
	}
	return got
}

// wantResizeErr checks that Resize of tk to w fails with want and changes nothing.
func (s *suite) wantResizeErr(tk store.Ticket, w int, want error) {
	s.Helper()
	before := s.snap()
	got, err := s.st.Resize(s.ctx, tk, w)
	if !errors.Is(err, want) {
		s.Fatalf("Resize %s (fence %d) to %d: (%s weight %d), %v; want an error wrapping %v", s.who(tk.ID), tk.Fence, w, got.State, got.Weighs(), err, want)
	}
	s.wantSameSnapshot(before)
}

// resizedEvents returns the weights of the "resized" events of tk in limit, oldest first.
func (s *suite) resizedEvents(limit string, tk store.Ticket) []int {
	s.Helper()
	out := []int{}
	for _, e := range s.events(limit, store.MaxEvents) {
		if e.Ticket == tk.ID && e.Kind == store.Resized {
			out = append(out, max(e.Weight, 1))
		}
	}
	return out
}

// A shrink frees the ticket's highest indexes and, in the same step,
// admits the waiters that now fit (their bells ring); a heavier waiter that
// does not fit yet keeps waiting, and the next shrink admits it.
func testResizeShrinkPromotes(s *suite) {
	b := s.enqM("B", lims("cpu"), 4, 4)
	b = s.wantIn(b, map[string][]int{"cpu": ix(0, 1, 2, 3)})
	w1 := s.enq("W1", "cpu", 4)
	w2 := s.enqM("W2", lims("cpu"), 2, 4)
	bell := s.watch(w1.ID)
	s.quiet(bell)
	b = s.resize(b, 2, 2)
	if !slices.Equal(b.In("cpu"), ix(0, 1)) {
		s.Fatalf("Resize B to 2: holds %v, want its lowest, [0 1]", b.In("cpu"))
	}
	s.wantIn(w1, map[string][]int{"cpu": ix(2)})
	s.wantRing(bell, "the shrink that admitted W1")
	s.wantWaitingIn(w2, map[string]int{"cpu": 1})
	s.checkLimit("cpu", 4, 3, 1)
	b = s.resize(b, 1, 1)
	s.wantIn(b, map[string][]int{"cpu": ix(0)})
	s.wantIn(w2, map[string][]int{"cpu": ix(1, 3)})
	s.checkLimit("cpu", 4, 4, 0)

	// Across limits: a shrink settles every limit of the ticket, and the
	// closure of the limits they reach (docs/leases.md §2.1 item 9).
	s.setLimit("a", 2)
	s.setLimit("b", 2)
	s.setLimit("c", 1)
	m := s.enqM("M", lims("a", "b"), 2, 2)
	xa := s.enqM("XA", lims("a", "c"), 1, 1) // waits for a
	yc := s.enq("YC", "c", 1)                // waits behind XA in c
	xb := s.enq("XB", "b", 2)                // waits for b
	s.wantWaitingIn(xa, map[string]int{"a": 1, "c": 1})
	s.wantWaitingIn(yc, map[string]int{"c": 2})
	m = s.resize(m, 1, 1)
	s.wantIn(m, map[string][]int{"a": ix(0), "b": ix(0)})
	s.wantIn(xa, map[string][]int{"a": ix(1), "c": ix(0)})
	s.wantIn(xb, map[string][]int{"b": ix(1)})
	s.wantWaitingIn(yc, map[string]int{"c": 1})
}

// A growth never overtakes the queue: while a ticket waits in one of its
// limits, it takes nothing (and says so by the weight it returns, not by an
// error), even where slots are free; once the waiter is gone (admitted, or
// expired), it grows.
func testResizeGrowBlockedByWaiter(s *suite) {
	a := s.enqM("A", lims("cpu"), 2, 3)
	w := s.enqM("W", lims("cpu"), 2, 3) // 1 free: does not fit
	s.wantWaitingIn(w, map[string]int{"cpu": 1})
	a = s.resize(a, 3, 2)
	s.checkLimit("cpu", 3, 2, 1)
	if got := s.resizedEvents("cpu", a); len(got) != 0 {
		s.Fatalf("a growth that took nothing logged resized events %v", got)
	}
	a = s.resize(a, 1, 1) // W is admitted: 2 free
	s.wantIn(w, map[string][]int{"cpu": ix(1, 2)})
	a = s.resize(a, 3, 1) // nothing free
	s.release(w, true)
	a = s.resize(a, 3, 3)
	s.wantIn(a, map[string][]int{"cpu": ix(0, 1, 2)})

	// A waiter in another of its limits blocks it in all of them.
	s.setLimit("x", 4)
	s.setLimit("y", 3)
	m := s.enqM("M", lims("x", "y"), 1, 1)
	hy := s.enq("HY", "y", 3)
	wy := s.enqM("WY", lims("y"), 2, 3) // 1 free in y: does not fit
	s.wantWaitingIn(wy, map[string]int{"y": 1})
	m = s.resize(m, 2, 1)
	s.checkLimit("x", 4, 1, 0)
	// The waiter's lease runs out (its holder stopped renewing): it no
	// longer waits, though nothing swept it yet, and the growth takes what
	// is free.
	s.advance(s.part())
	m, hy = s.renew(m), s.renew(hy)
	s.advance(s.part())
	m, _ = s.renew(m), s.renew(hy)
	s.wantNotLive(wy)
	m = s.resize(m, 3, 2) // y has one free
	s.wantIn(m, map[string][]int{"x": ix(0, 1), "y": ix(0, 2)})
}

// A growth takes only what is free, the lowest free indexes, in every one
// of its limits at once: fewer than asked when fewer are free.
func testResizeGrowPartial(s *suite) {
	e := s.enq("E", "cpu", 5)
	a := s.enq("A", "cpu", 5)
	b := s.enqM("B", lims("cpu"), 2, 5)
	s.wantIn(b, map[string][]int{"cpu": ix(2, 3)})
	s.release(e, true) // 0 and 4 are free
	a = s.resize(a, 5, 3)
	s.wantIn(a, map[string][]int{"cpu": ix(0, 1, 4)})
	if a.Slot != 0 {
		s.Fatalf("A holds %v with slot %d, want its lowest, 0", a.In("cpu"), a.Slot)
	}
	s.checkLimit("cpu", 5, 5, 0)
	s.resize(b, 3, 2)

	// Several limits: what is free in all of them.
	s.setLimit("p", 4)
	s.setLimit("q", 3)
	hq := s.enq("HQ", "q", 3)
	m := s.enqM("M", lims("p", "q"), 1, 1)
	m = s.resize(m, 4, 2) // p has 3 more, q 1
	s.wantIn(m, map[string][]int{"p": ix(0, 1), "q": ix(1, 2)})
	s.wantSlotsVar(m, "p=0,1 q=1,2")
	s.release(hq, true)
	m = s.resize(m, 4, 3) // capped by q's size
	s.wantIn(m, map[string][]int{"p": ix(0, 1, 2), "q": ix(0, 1, 2)})
	s.checkLimit("p", 4, 3, 0)
	s.checkLimit("q", 3, 3, 0)
}

// A growth never takes a limit past its size: not by asking for more than
// the size, not in a limit shrunk below its holders, not in a paused one;
// and a weight below 1 is refused.
func testResizeCappedBySize(s *suite) {
	a := s.enq("A", "cpu", 3)
	a = s.resize(a, 10, 3)
	s.wantIn(a, map[string][]int{"cpu": ix(0, 1, 2)})
	s.checkLimit("cpu", 3, 3, 0)
	a = s.resize(a, store.MaxSlots, 3)
	s.setLimit("cpu", 2) // shrunk below its holder: nobody evicted
	a = s.resize(a, 4, 3)
	s.checkLimit("cpu", 2, 3, 0)
	a = s.resize(a, 2, 2)
	a = s.resize(a, 3, 2)
	s.setLimit("cpu", 0) // paused
	a = s.resize(a, 3, 2)
	a = s.resize(a, 1, 1)
	s.wantIn(a, map[string][]int{"cpu": ix(0)})
	s.checkLimit("cpu", 0, 1, 0)
	for _, w := range []int{0, -1, store.MaxSlots + 1} {
		s.wantResizeErr(a, w, store.ErrInvalid)
	}
}

// Only the live, held ticket of the caller's fence can be resized: one
// released, reaped, expired, never seen, or of another fence is ErrLost;
// a waiting one is ErrInvalid. None of them changes anything.
func testResizeRefused(s *suite) {
	h := s.enq("H", "cpu", 1)
	w := s.enq("W", "cpu", 1)
	s.wantResizeErr(w, 2, store.ErrInvalid)
	other := h
	other.Fence++
	s.wantResizeErr(other, 2, store.ErrLost)
	s.wantResizeErr(other, 1, store.ErrLost)
	nobody := h
	nobody.ID = s.id("NOBODY")
	s.wantResizeErr(nobody, 2, store.ErrLost)

	s.release(h, true) // W is admitted
	s.wantResizeErr(h, 1, store.ErrLost)
	s.wantResizeErr(h, 2, store.ErrLost)
	w = s.wantHeld(w, 0)

	// Expired: not renewed for longer than its TTL (on etcd, revoked).
	s.setLimit("cpu", 3)
	s.advance(s.pastTTL())
	s.wantResizeErr(w, 2, store.ErrLost)
	s.wantResizeErr(w, 1, store.ErrLost)
	s.wantNotLive(w)
}

// Release, reap and the loss of a resized ticket free all of its slots at
// once, in each of its limits, and admit the waiters they make room for.
func testResizeRemovalFreesAll(s *suite) {
	a := s.enq("A", "cpu", 3)
	a = s.resize(a, 3, 3)
	w := s.enqM("W", lims("cpu"), 3, 3)
	s.release(a, true)
	s.wantIn(w, map[string][]int{"cpu": ix(0, 1, 2)})
	s.release(a, false)
	s.checkLimit("cpu", 3, 3, 0)

	// A reap of an expired resized ticket of several limits.
	s.setLimit("a", 3)
	s.setLimit("b", 2)
	m := s.enqM("M", lims("a", "b"), 1, 1)
	m = s.resize(m, 2, 2)
	x := s.enqM("X", lims("a"), 3, 3)
	y := s.enqM("Y", lims("b"), 2, 2)
	s.advance(s.part())
	s.renew(x)
	s.renew(y)
	s.advance(s.part()) // M expired; a waiter's renewal may sweep it, so none now
	rm := s.reap(false, "a")
	s.wantRemoved("Reap(a)", rm, m)
	s.wantIn(x, map[string][]int{"a": ix(0, 1, 2)})
	s.wantIn(y, map[string][]int{"b": ix(0, 1)})
	s.wantGone(m)
	s.wantResizeErr(m, 1, store.ErrLost)
}

// The new weight is the ticket's: Renew returns it and keeps it, Get and
// Snapshot show it under every limit, and a reopen (a restart) keeps it.
func testResizeKept(s *suite) {
	s.setLimit("a", 4)
	s.setLimit("b", 4)
	m := s.enqM("M", lims("a", "b"), 1, 4)
	m = s.resize(m, 3, 3)
	s.advance(s.part())
	m = s.renew(m)
	if m.Weighs() != 3 {
		s.Fatalf("Renew M after a growth to 3: weight %d", m.Weighs())
	}
	s.advance(s.part())
	m = s.renew(m)
	m = s.wantIn(m, map[string][]int{"a": ix(0, 1, 2), "b": ix(0, 1, 2)})
	for _, v := range s.views(m.ID) {
		if v.Weighs() != 3 {
			s.Fatalf("Snapshot: M listed under %q with weight %d, want 3", v.Limit, v.Weighs())
		}
	}
	s.checkLimit("a", 4, 3, 0)
	one := s.enq("ONE", "c", 4)
	one = s.resize(one, 2, 2)
	if s.b.Reopen == nil {
		return
	}
	s.st = s.b.Reopen()
	m = s.wantIn(m, map[string][]int{"a": ix(0, 1, 2), "b": ix(0, 1, 2)})
	s.wantIn(one, map[string][]int{"c": ix(0, 1)})
	s.checkLimit("b", 4, 3, 0)
	m = s.resize(m, 4, 4)
	one = s.resize(one, 1, 1)
	s.wantIn(one, map[string][]int{"c": ix(0)})
	s.renew(m)
}

// Each change of weight logs a "resized" event in each of the ticket's
// limits with the new weight and its indexes there; a resize that changes
// nothing logs nothing.
func testResizeEvents(s *suite) {
	s.setLimit("a", 4)
	s.setLimit("b", 4)
	m := s.enqM("M", lims("a", "b"), 1, 4)
	seq := s.lastSeq()
	m = s.resize(m, 3, 3)
	m = s.resize(m, 3, 3)
	m = s.resize(m, 2, 2)
	for _, l := range []string{"a", "b"} {
		if got := s.resizedEvents(l, m); !slices.Equal(got, []int{3, 2}) {
			s.Fatalf("resized events of M in %q: weights %v, want [3 2]", l, got)
		}
	}
	var n int
	for _, e := range s.events("", store.MaxEvents) {
		if e.Seq <= seq {
			continue
		}
		if e.Kind != store.Resized || e.Ticket != m.ID {
			s.Fatalf("event %d: %s of %s after the resizes, want only resized events of M", e.Seq, e.Kind, s.who(e.Ticket))
		}
		n++
		if n > 2 {
			continue
		}
		// The first two are the growth to 3 (one per limit).
		t := m
		t.Weight, t.Indexes = 3, map[string][]int{"a": ix(0, 1, 2), "b": ix(0, 1, 2)}
		s.wantEventOf(e, t, ix(0, 1, 2))
	}
	if n != 4 {
		s.Fatalf("%d events after the resizes, want 4 (two changes, in two limits each)", n)
	}
	one := s.enq("ONE", "c", 2)
	one = s.resize(one, 2, 2)
	one = s.resize(one, 1, 1)
	if got := s.resizedEvents("c", one); !slices.Equal(got, []int{2, 1}) {
		s.Fatalf("resized events of ONE: weights %v, want [2 1]", got)
	}
}

// Many holders grow and shrink at once, with other tickets coming and
// going: no slot is ever held twice, never more than the limit's size.
func testConcurrentResize(s *suite) {
	const size, holders, rounds = 6, 4, 12
	s.setLimit("cpu", size)
	tks := make([]store.Ticket, holders)
	for i := range tks {
		tks[i] = s.enq(fmt.Sprintf("H%d", i), "cpu", size)
	}
	var wg sync.WaitGroup
	errs := make(chan error, holders+1)
	for i := range tks {
		wg.Add(1)
		go func(tk store.Ticket, seed uint64) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 18))
			for range rounds {
				got, err := s.st.Resize(s.ctx, tk, 1+r.IntN(size))
				if err != nil {
					errs <- fmt.Errorf("Resize %s: %w", s.who(tk.ID), err)
					return
				}
				tk = got
			}
		}(tks[i], uint64(i))
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range rounds / 2 {
			r := store.EnqueueRequest{ID: s.id(fmt.Sprintf("J%d", i)), Limit: "cpu", Slots: size, TTL: s.h.TTL, Holder: holder("J")}
			tk, err := s.st.Enqueue(s.ctx, r)
			if err == nil {
				_, err = s.st.Release(s.ctx, tk, store.Released)
			}
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case err := <-errs:
			<-done
			s.Fatal(err)
		default:
		}
		sn := s.snap("cpu") // checks that no index is held twice
		if l, _ := findLimit(sn, "cpu"); l.Held > size {
			s.Fatalf("limit cpu holds %d slots of %d", l.Held, size)
		}
	}
	close(errs)
	for err := range errs {
		s.Fatal(err)
	}
	for _, tk := range tks {
		s.release(tk, true)
	}
	s.checkLimit("cpu", size, 0, 0)
}
