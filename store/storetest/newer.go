package storetest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/slotctl/slotctl/store"
)

// Newer runs first (docs/leases.md §2.1 item 10): keys, supersede, replace,
// max-waiting, and the stop request a replace leaves in the held ticket.

// reqK is a request for a ticket of key in limits (created with slots),
// whose holder has its own pid and a CI URL (Holder.URL), so that a
// successor naming the wrong run is seen.
func (s *suite) reqK(name string, limits []string, slots int, key string) store.EnqueueRequest {
	r := s.reqM(name, limits, 0, slots)
	if len(limits) == 1 {
		r.Limit, r.Limits = limits[0], nil
	}
	r.Key = key
	r.Holder.Pid = 5000 + s.n
	r.Holder.URL = "https://ci.storetest.invalid/runs/" + name
	return r
}

func sup(r store.EnqueueRequest) store.EnqueueRequest { r.Supersede = true; return r }
func rep(r store.EnqueueRequest) store.EnqueueRequest { r.Replace = true; return r }
func maxW(r store.EnqueueRequest, n int) store.EnqueueRequest {
	r.MaxWaiting = &n
	return r
}

// successorOf is what a ticket superseded or replaced by the request r
// must name.
func successorOf(r store.EnqueueRequest) store.Successor {
	return store.Successor{Ticket: r.ID, Host: r.Holder.Host, Pid: r.Holder.Pid, URL: r.Holder.URL}
}

// wantKey checks the key a ticket carries.
func (s *suite) wantKey(tk store.Ticket, key string) {
	s.Helper()
	got := s.get(tk)
	if got.Key != key {
		s.Fatalf("%s has key %q, want %q", s.who(tk.ID), got.Key, key)
	}
	for n, v := range s.views(tk.ID) {
		if v.Key != key {
			s.Fatalf("Snapshot: %s listed under %q with key %q, want %q", s.who(tk.ID), n, v.Key, key)
		}
	}
}

// wantSuperseded checks that tk is gone, superseded by the run of r: Get
// wraps ErrNotFound and Renew ErrLost, each with a *store.SupersededError
// naming that run, and it is listed nowhere (docs/leases.md §2.1 item 10).
func (s *suite) wantSuperseded(tk store.Ticket, r store.EnqueueRequest) {
	s.Helper()
	want := successorOf(r)
	check := func(op string, err error, sentinel error) {
		s.Helper()
		if err == nil {
			s.Fatalf("%s %s: found it, want it superseded by %s", op, s.who(tk.ID), s.who(r.ID))
		}
		if !errors.Is(err, sentinel) {
			s.Fatalf("%s %s: %v, want an error wrapping %v", op, s.who(tk.ID), err, sentinel)
		}
		var se *store.SupersededError
		if !errors.As(err, &se) {
			s.Fatalf("%s %s: %v, want a *store.SupersededError naming %s", op, s.who(tk.ID), err, s.who(r.ID))
		}
		if se.ID != tk.ID || se.By != want {
			s.Fatalf("%s %s: SupersededError{ID %q, By %+v}, want {ID %q, By %+v}", op, s.who(tk.ID), se.ID, se.By, tk.ID, want)
		}
	}
	_, err := s.st.Get(s.ctx, tk.ID)
	check("Get", err, store.ErrNotFound)
	_, err = s.st.Renew(s.ctx, tk, s.h.TTL)
	check("Renew", err, store.ErrLost)
	s.wantNotListed(tk)
}

// wantPlainGone checks that tk is gone but was not superseded.
func (s *suite) wantPlainGone(tk store.Ticket) {
	s.Helper()
	_, err := s.st.Get(s.ctx, tk.ID)
	if !errors.Is(err, store.ErrNotFound) {
		s.Fatalf("Get %s: %v, want ErrNotFound", s.who(tk.ID), err)
	}
	var se *store.SupersededError
	if errors.As(err, &se) {
		s.Fatalf("Get %s: %v: a SupersededError for a ticket nobody superseded", s.who(tk.ID), err)
	}
}

// wantStop checks that tk is held and asked to stop by the run of r (nil:
// not asked), through Get, Renew and every view of a snapshot.
func (s *suite) wantStop(tk store.Ticket, r *store.EnqueueRequest) store.Ticket {
	s.Helper()
	var want *store.Successor
	if r != nil {
		w := successorOf(*r)
		want = &w
	}
	same := func(op string, got *store.Successor) {
		s.Helper()
		switch {
		case want == nil && got != nil:
			s.Fatalf("%s %s: Stop %+v, want no stop request", op, s.who(tk.ID), *got)
		case want != nil && got == nil:
			s.Fatalf("%s %s: no stop request, want Stop %+v (replaced by %s)", op, s.who(tk.ID), *want, s.who(want.Ticket))
		case want != nil && *got != *want:
			s.Fatalf("%s %s: Stop %+v, want %+v (replaced by %s)", op, s.who(tk.ID), *got, *want, s.who(want.Ticket))
		}
	}
	got := s.wantHeld(tk, -1)
	same("Get", got.Stop)
	// A held ticket asked to stop is still renewed: its holder is stopping
	// its job, and Renew tells it why (docs/leases.md §2.1 item 10).
	same("Renew", s.renew(tk).Stop)
	vs := s.views(tk.ID)
	for _, n := range got.Names() {
		same("Snapshot under "+n, vs[n].Stop)
	}
	return got
}

// wantReplaces checks the Replaces of a waiting ticket.
func (s *suite) wantReplaces(tk store.Ticket, ids ...store.Ticket) {
	s.Helper()
	got := s.get(tk)
	want := []string{}
	for _, t := range ids {
		want = append(want, t.ID)
	}
	have := slices.Clone(got.Replaces)
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(have, want) && !(len(have) == 0 && len(want) == 0) {
		s.Fatalf("%s replaces %q, want %q", s.who(tk.ID), got.Replaces, want)
	}
}

// wantNewerEvent checks that each of limits logs one kind event of tk,
// naming by in By.
func (s *suite) wantNewerEvent(kind string, tk store.Ticket, by store.EnqueueRequest, limits ...string) {
	s.Helper()
	for _, n := range limits {
		var bys []string
		found := 0
		for _, e := range s.events(n, store.MaxEvents) {
			if e.Ticket != tk.ID || e.Kind != kind {
				continue
			}
			bys = append(bys, e.By)
			if e.By == by.ID {
				found++
				if e.Fence != tk.Fence {
					s.Fatalf("Events(%q): %q event of %s with fence %d, want %d", n, kind, s.who(tk.ID), e.Fence, tk.Fence)
				}
			}
		}
		if found != 1 {
			s.Fatalf("Events(%q): %d %q events of %s by %s (its %q events name By %q; its kinds there: %q), want one",
				n, found, kind, s.who(tk.ID), s.who(by.ID), kind, bys, s.kindsIn(n, tk.ID))
		}
	}
}

// wantNoNewerEvent checks that no limit logs a kind event of tk.
func (s *suite) wantNoNewerEvent(kind string, tk store.Ticket) {
	s.Helper()
	for _, e := range s.events("", store.MaxEvents) {
		if e.Ticket == tk.ID && e.Kind == kind {
			s.Fatalf("Events: a %q event of %s in %q (By %q), want none", kind, s.who(tk.ID), e.Limit, e.By)
		}
	}
}

func (s *suite) kindsIn(limit, id string) []string {
	out := []string{}
	for _, e := range s.events(limit, store.MaxEvents) {
		if e.Ticket == id {
			out = append(out, e.Kind)
		}
	}
	return out
}

// Supersede removes, in the enqueue's own step, every older waiting ticket
// of the same key in its limits; held ones stay, unasked; the superseded
// are not found, with a SupersededError naming the new run; "superseded"
// events name it in By; the superseded waiter's bell rings.
func testSupersedeWaiting(s *suite) {
	q := []string{"q"}
	a := s.enqReq(s.reqK("A", q, 1, "main"))
	s.wantHeld(a, 0)
	rb := s.reqK("B", q, 1, "main")
	bellB := s.watch(rb.ID)
	b := s.enqReq(rb)
	s.wantWaiting(b, 1)
	c := s.enqReq(s.reqK("C", q, 1, "main"))
	s.wantWaiting(c, 2)
	s.quiet(bellB)

	rd := sup(s.reqK("D", q, 1, "main"))
	d := s.enqReq(rd)
	// The very answer of the Enqueue: D is first in the queue, so B and C
	// were gone in its own step.
	if d.State != store.Waiting || d.Position != 1 {
		s.Fatalf("Enqueue D (--supersede) returned %s at position %d, want waiting at 1: B and C superseded in the same step", d.State, d.Position)
	}
	s.wantSuperseded(b, rd)
	s.wantSuperseded(c, rd)
	s.wantRing(bellB, "B was superseded")
	s.wantStop(a, nil) // held: untouched by a supersede
	s.wantKey(a, "main")
	s.wantKey(d, "main")
	s.checkLimit("q", 1, 1, 1)
	s.wantNewerEvent("superseded", b, rd, "q")
	s.wantNewerEvent("superseded", c, rd, "q")
	s.wantNoNewerEvent("superseded", a)
	s.wantNoNewerEvent("replaced", a)
	s.wantReplaces(d)

	// Its waiter, told, gives up: a Cancel (or a Release) of a superseded
	// ticket removes nothing, frees nothing, and keeps the successor known.
	s.cancel(b, false)
	s.release(c, false)
	s.wantSuperseded(b, rd)
	s.wantSuperseded(c, rd)
	s.wantWaiting(d, 1)
	// A superseded id stays removed.
	if _, err := s.st.Enqueue(s.ctx, rb); !errors.Is(err, store.ErrRemoved) {
		s.Fatalf("Enqueue of superseded B again: %v, want ErrRemoved", err)
	}
	// D takes A's slot when A goes: superseded tickets freed nothing and block nothing.
	s.release(a, true)
	s.wantHeld(d, 0)
	s.wantPlainGone(a)
}

// A supersede touches only its own key (the empty key of a run without
// --key is a key like another), only tickets sharing one of its limits (any
// one of several), and only older ones: an enqueue that is a retry of a
// live ticket supersedes nothing.
func testSupersedeScope(s *suite) {
	q := []string{"q"}
	h := s.enqReq(s.reqK("H", []string{"q", "r", "u"}, 1, "")) // holds every limit: all later wait
	s.wantHeld(h, 0)
	main1 := s.enqReq(s.reqK("main1", q, 1, "main"))
	rdev := s.reqK("dev", q, 1, "dev")
	dev := s.enqReq(rdev)
	none := s.enqReq(s.reqK("none", q, 1, ""))
	inR := s.enqReq(s.reqK("inR", []string{"r"}, 1, "main"))           // same key, unrelated limit
	both := s.enqReq(s.reqK("both", []string{"r", "q"}, 1, "main"))    // same key, shares q (its second limit)
	other := s.enqReq(s.reqK("other", []string{"u", "q"}, 1, "other")) // shares q, another key

	rn := sup(s.reqK("N", q, 1, "main"))
	n := s.enqReq(rn)
	s.wantSuperseded(main1, rn)
	s.wantSuperseded(both, rn)
	s.wantNewerEvent("superseded", both, rn, "r", "q")
	for _, tk := range []store.Ticket{dev, none, inR, other} {
		if got := s.get(tk); got.State != store.Waiting {
			s.Fatalf("%s is %s, want still waiting", s.who(tk.ID), got.State)
		}
		s.wantNoNewerEvent("superseded", tk)
	}
	s.wantWaitingIn(dev, map[string]int{"q": 1})
	s.wantWaitingIn(none, map[string]int{"q": 2})
	s.wantWaitingIn(other, map[string]int{"q": 3})
	s.wantWaitingIn(n, map[string]int{"q": 4})
	s.wantWaitingIn(inR, map[string]int{"r": 1})

	// A run without --key supersedes the keyless waiters only.
	re := sup(s.reqK("E", []string{"q"}, 1, ""))
	e := s.enqReq(re)
	s.wantSuperseded(none, re)
	s.wantWaitingIn(dev, map[string]int{"q": 1})
	s.wantWaitingIn(other, map[string]int{"q": 2})
	s.wantWaitingIn(n, map[string]int{"q": 3})
	s.wantWaitingIn(e, map[string]int{"q": 4})
	s.wantStop(h, nil) // keyless and held: untouched

	// A retry of the enqueue of a live ticket returns it unchanged and
	// supersedes nothing: the waiters of its key behind it are younger.
	f := s.enqReq(s.reqK("F", q, 1, "dev"))
	got, err := s.st.Enqueue(s.ctx, sup(rdev))
	if err != nil {
		s.Fatalf("Enqueue of live %s again, with --supersede: %v", s.who(dev.ID), err)
	}
	if got.ID != dev.ID || got.Fence != dev.Fence || got.State != store.Waiting {
		s.Fatalf("Enqueue of live %s again returned %s fence %d %s, want it unchanged (fence %d, waiting)", s.who(dev.ID), s.who(got.ID), got.Fence, got.State, dev.Fence)
	}
	s.wantWaitingIn(f, map[string]int{"q": 5})
	s.wantNoNewerEvent("superseded", f)

	// A new ticket of several limits supersedes in each: here in its second.
	rp := sup(s.reqK("P", []string{"r", "q"}, 1, "dev"))
	p := s.enqReq(rp)
	s.wantSuperseded(dev, rp)
	s.wantSuperseded(f, rp)
	s.wantWaitingIn(p, map[string]int{"r": 2, "q": 4})
	s.wantWaitingIn(inR, map[string]int{"r": 1})
}

// Replace supersedes the older waiters of its key and asks every held
// ticket of its key sharing a limit to stop: Stop names the new run (Get,
// Renew, Snapshot), the new ticket's Replaces names them, "replaced" events
// name it in By, the holder's bell rings (a bell the holder got before its
// own Enqueue, and kept while it held). The new ticket is admitted only
// once every ticket it replaces is gone, even with free slots, and blocks
// the queue behind it meanwhile; a second replace overwrites Stop and supersedes the first
// replacer, which was waiting.
func testReplace(s *suite) {
	q := []string{"q"}
	ra := s.reqK("A", q, 3, "deploy")
	bellA := s.watch(ra.ID) // as a holder: before its Enqueue
	a := s.enqReq(ra)
	s.wantHeld(a, 0)
	o := s.enqReq(s.reqK("O", q, 3, "other")) // holds another key's slot
	s.wantHeld(o, 1)
	s.quiet(bellA) // the ring of its admission
	w := s.enqReq(s.reqK("W", q, 3, "deploy"))
	s.wantHeld(w, 2) // admitted: same key, held
	s.quiet(bellA)
	s.release(w, true) // now A and O hold 2 of 3: a slot is free

	rb := rep(s.reqK("B", q, 3, "deploy"))
	b := s.enqReq(rb)
	if b.State != store.Waiting {
		s.Fatalf("Enqueue B (--replace) returned it %s in slot %d, want waiting: never beside A, which it replaces, even with free slots", b.State, b.Slot)
	}
	s.wantRing(bellA, "A was asked to stop")
	s.wantStop(a, &rb)
	s.wantReplaces(b, a)
	s.wantNewerEvent("replaced", a, rb, "q")
	s.wantNoNewerEvent("superseded", a)
	s.wantStop(o, nil) // held, of another key: not asked
	s.wantNoNewerEvent("replaced", o)
	// B blocks the queue behind it: a ticket of another key waits too.
	x := s.enqReq(s.reqK("X", q, 3, "other"))
	s.wantWaiting(b, 1)
	s.wantWaiting(x, 2)

	// A second replace: Stop now names C, B (waiting) is superseded by C.
	s.quiet(bellA)
	rc := rep(s.reqK("C", q, 3, "deploy"))
	c := s.enqReq(rc)
	s.wantSuperseded(b, rc)
	s.wantRing(bellA, "A was asked to stop again")
	s.wantStop(a, &rc)
	s.wantReplaces(c, a)
	s.wantNewerEvent("replaced", a, rc, "q")
	s.wantNewerEvent("superseded", b, rc, "q")
	// B's removal unblocked X, behind it, in the same step: there is room.
	s.wantHeld(x, -1)
	s.wantWaiting(c, 1)

	// A holder told to stop renews while it stops its job, then releases;
	// only then is C admitted.
	s.wantStop(a, &rc)
	s.release(a, true)
	s.wantHeld(c, -1)
	s.wantStop(c, nil)
	s.wantStop(o, nil)
	s.wantPlainGone(a)
}

// The replacing ticket waits in its FIFO place behind older waiters, and
// when the one it replaces goes and there is no room, waits on.
func testReplaceFIFO(s *suite) {
	q := []string{"q"}
	a := s.enqReq(s.reqK("A", q, 1, "k"))
	w := s.enqReq(s.reqK("W", q, 1, "")) // older, another key
	rb := rep(s.reqK("B", q, 1, "k"))
	b := s.enqReq(rb)
	s.wantStop(a, &rb)
	s.wantWaiting(w, 1)
	s.wantWaiting(b, 2)
	s.release(a, true)
	s.wantHeld(w, 0)
	s.wantWaiting(b, 1)
	s.release(w, true)
	s.wantHeld(b, 0)
	// A replace with no one of its key held is a supersede: admitted at once.
	s.release(b, true)
	rc := rep(s.reqK("C", q, 1, "k"))
	c := s.enqReq(rc)
	s.wantHeld(c, 0)
	s.wantReplaces(c)
	s.wantStop(c, nil)

	// A replaced holder that dies without releasing leaves when its lease
	// does: then its replacer is admitted (by the reap, or any sweep).
	rd := rep(s.reqK("D", q, 1, "k"))
	d := s.enqReq(rd)
	s.wantStop(c, &rd)
	s.advance(s.part())
	s.renew(d)
	s.advance(s.part())
	s.renew(d)
	s.reap(false, "q") // a store may have swept it already (a renewal's sweep)
	s.wantGone(c)
	s.wantHeld(d, 0)

	// Several held of the key: each is asked, and the replacer waits for
	// the last of them, whichever leaves first.
	p := []string{"p"}
	e := s.enqReq(s.reqK("E", p, 3, "k"))
	f := s.enqReq(s.reqK("F", p, 3, "k"))
	rg := rep(s.reqK("G", p, 3, "k"))
	g := s.enqReq(rg)
	s.wantStop(e, &rg)
	s.wantStop(f, &rg)
	s.wantReplaces(g, e, f)
	s.release(f, true)
	s.wantWaiting(g, 1)
	s.release(e, true)
	s.wantHeld(g, 0)
}

// MaxWaiting refuses with a *store.QueueFullError a ticket that would
// wait while one of its limits already has N waiting, counted after the
// superseded ones are gone, and a refusal writes nothing: no ticket, no
// supersede, no stop request, no limit, no event. A ticket admitted at
// once is never refused; N = 0 means never queue.
func testMaxWaiting(s *suite) {
	q := []string{"q"}
	// N = 0: admitted at once, or refused.
	a := s.enqReq(maxW(s.reqK("A", q, 1, "main"), 0))
	s.wantHeld(a, 0)
	s.wantQueueFull(maxW(s.reqK("Z", q, 1, "main"), 0), "q", 0, 0)

	// --supersede --max-waiting 1: the newest pending of a key wins...
	rb := maxW(sup(s.reqK("B", q, 1, "main")), 1)
	b := s.enqReq(rb)
	s.wantWaiting(b, 1)
	rc := maxW(sup(s.reqK("C", q, 1, "main")), 1)
	c := s.enqReq(rc) // B is superseded first: then q has 0 waiting
	s.wantSuperseded(b, rc)
	s.wantWaiting(c, 1)
	// ...and one of another key is refused, writing nothing.
	before := s.snap()
	seq := s.lastSeq()
	rd := maxW(sup(s.reqK("D", []string{"q", "fresh"}, 1, "dev")), 1)
	s.wantQueueFull(rd, "q", 1, 1)
	s.wantPlainGone(store.Ticket{ID: rd.ID})
	s.wantNoLimit("fresh")
	s.wantSameSnapshot(before)
	if got := s.lastSeq(); got != seq {
		s.Fatalf("a refused Enqueue logged events (last seq %d, was %d)", got, seq)
	}
	// A refused --replace of a held key asks nobody to stop and supersedes
	// nobody: C (of its key) is counted out, so R would wait behind no one,
	// but with N = 0 it may not wait at all.
	rr := maxW(rep(s.reqK("R", q, 1, "main")), 0)
	s.wantQueueFull(rr, "q", 0, 0)
	s.wantPlainGone(store.Ticket{ID: rr.ID})
	s.wantStop(a, nil)
	s.wantWaiting(c, 1)
	if got := s.lastSeq(); got != seq {
		s.Fatalf("a refused Enqueue --replace logged events (last seq %d, was %d)", got, seq)
	}

	// Counted per limit: a second limit with room does not help, one
	// without waiters of its own does not refuse.
	s.setLimit("wide", 2)
	e := s.enqReq(maxW(s.reqK("E", []string{"wide"}, 2, ""), 0))
	s.wantHeld(e, 0)
	s.wantQueueFull(maxW(s.reqK("Y", []string{"wide", "q"}, 1, ""), 1), "q", 1, 1)
	f := s.enqReq(maxW(s.reqK("F", []string{"wide", "q"}, 1, ""), 2))
	s.wantWaitingIn(f, map[string]int{"q": 2, "wide": 1})

	// Admitted at once even with N = 0 while another limit queues: G's own
	// limit has room and no waiter.
	g := s.enqReq(maxW(s.reqK("G", []string{"solo"}, 1, ""), 0))
	s.wantHeld(g, 0)

	// A refused id was never written, so it is no tombstone.
	rd.MaxWaiting = nil
	s.wantWaitingIn(s.enqReq(rd), map[string]int{"q": 3, "fresh": 1})

	// Counted after the enqueue's own sweep: an expired waiter is not
	// counted, and a ticket admitted once an expired holder is swept was
	// admitted at once.
	m := s.enqReq(s.reqK("M", []string{"m"}, 1, ""))
	s.enqReq(s.reqK("MW", []string{"m"}, 1, "")) // waits, never renewed
	x := s.enqReq(s.reqK("X", []string{"e"}, 1, ""))
	s.wantHeld(x, 0)
	s.advance(s.part())
	s.renew(m)
	s.advance(s.part())
	s.renew(m)
	mr := s.enqReq(maxW(s.reqK("MR", []string{"m"}, 1, ""), 1))
	s.wantWaiting(mr, 1)
	y := s.enqReq(maxW(s.reqK("Y", []string{"e"}, 1, ""), 0))
	s.wantHeld(y, 0)
}

// Many runs of one key enqueued at once with --supersede --max-waiting 1
// behind a holder: each supersede is part of its own enqueue's step, so
// none is refused, exactly one (the newest) is left waiting, and each of
// the others was superseded by a newer one.
func testConcurrentSupersede(s *suite) {
	const workers, iters = 6, 4
	h := s.enqReq(s.reqK("H", []string{"q"}, 1, "main"))
	reqs := make([][]store.EnqueueRequest, workers)
	for w := range reqs {
		for i := range iters {
			reqs[w] = append(reqs[w], maxW(sup(s.reqK(fmt.Sprintf("R%d.%d", w, i), []string{"q"}, 1, "main")), 1))
		}
	}
	var (
		mu  sync.Mutex
		got []store.Ticket
		wg  sync.WaitGroup
	)
	for w := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, r := range reqs[w] {
				tk, err := s.st.Enqueue(s.ctx, r)
				if err != nil {
					s.Errorf("Enqueue %s (--supersede --max-waiting 1) beside others of its key: %v", s.who(r.ID), err)
					return
				}
				mu.Lock()
				got = append(got, tk)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if s.Failed() {
		s.FailNow()
	}
	slices.SortFunc(got, func(a, b store.Ticket) int { return cmp.Compare(a.Fence, b.Fence) })
	fences := map[string]uint64{}
	for _, tk := range got {
		fences[tk.ID] = tk.Fence
	}
	s.checkLimit("q", 1, 1, 1)
	newest := got[len(got)-1]
	s.wantWaiting(newest, 1)
	for _, tk := range got[:len(got)-1] {
		_, err := s.st.Get(s.ctx, tk.ID)
		var se *store.SupersededError
		if !errors.As(err, &se) {
			s.Fatalf("Get %s: %v, want it superseded by a newer run", s.who(tk.ID), err)
		}
		if f, ok := fences[se.By.Ticket]; !ok || f <= tk.Fence {
			s.Fatalf("%s (fence %d) was superseded by %s (fence %d), want a newer run of the key", s.who(tk.ID), tk.Fence, s.who(se.By.Ticket), f)
		}
	}
	s.wantStop(h, nil)
}

// lastSeq is the newest event's sequence number (0 when none).
func (s *suite) lastSeq() uint64 {
	s.Helper()
	ev := s.events("", 1)
	if len(ev) == 0 {
		return 0
	}
	return ev[0].Seq
}

// wantQueueFull checks that r is refused with a *store.QueueFullError
// naming limit, its waiting count and the request's maximum.
func (s *suite) wantQueueFull(r store.EnqueueRequest, limit string, waiting, maxN int) {
	s.Helper()
	got, err := s.st.Enqueue(s.ctx, r)
	if err == nil {
		s.Fatalf("Enqueue %s (max waiting %d) into %q: %s at position %d, want refused with a QueueFullError of %q", s.who(r.ID), *r.MaxWaiting, r.Names(), got.State, got.Position, limit)
	}
	if !errors.Is(err, store.ErrQueueFull) {
		s.Fatalf("Enqueue %s (max waiting %d): %v, want an error wrapping ErrQueueFull", s.who(r.ID), *r.MaxWaiting, err)
	}
	var qf *store.QueueFullError
	if !errors.As(err, &qf) {
		s.Fatalf("Enqueue %s: %v, want a *store.QueueFullError", s.who(r.ID), err)
	}
	if qf.Limit != limit || qf.Waiting != waiting || qf.Max != maxN {
		s.Fatalf("Enqueue %s: QueueFullError{%q, waiting %d, max %d}, want {%q, waiting %d, max %d}", s.who(r.ID), qf.Limit, qf.Waiting, qf.Max, limit, waiting, maxN)
	}
}

// wantSameSnapshot checks that the store holds the limits and tickets of
// before: the same ids in the same states, slots, positions, keys and stops.
func (s *suite) wantSameSnapshot(before store.Snapshot) {
	s.Helper()
	after := s.snap()
	type row struct {
		Limit, ID string
		State     store.State
		Fence     uint64
		Slot, Pos int
		Key       string
		Stop      string
	}
	rows := func(sn store.Snapshot) []row {
		var out []row
		for _, t := range sn.Tickets {
			stop := ""
			if t.Stop != nil {
				stop = t.Stop.Ticket
			}
			out = append(out, row{t.Limit, t.ID, t.State, t.Fence, t.Slot, t.Position, t.Key, stop})
		}
		return out
	}
	lims := func(sn store.Snapshot) []string {
		var out []string
		for _, l := range sn.Limits {
			out = append(out, fmt.Sprintf("%s %d/%d/%d", l.Name, l.Slots, l.Held, l.Waiting))
		}
		return out
	}
	if !slices.Equal(lims(before), lims(after)) {
		s.Fatalf("limits changed: %q, were %q", lims(after), lims(before))
	}
	if b, a := rows(before), rows(after); !slices.Equal(b, a) {
		s.Fatalf("tickets changed:\n%+v\nwere\n%+v", a, b)
	}
}

// Keys are compared exactly, as bytes: case, spaces and the bytes of a
// unicode spelling all count.
func testKeysExact(s *suite) {
	h := s.enq("H", "q", 1)
	keys := []string{"main", "Main", "MAIN", "main ", " main", "main\u00a0", "ma\u0131n",
		"m\u00e4in", "ma\u0308in", "M\u00c4IN", strings.Repeat("k", store.MaxKey)}
	var tks []store.Ticket
	for i, k := range keys {
		tk := s.enqReq(s.reqK(fmt.Sprintf("K%d", i), []string{"q"}, 1, k))
		s.wantKey(tk, k)
		tks = append(tks, tk)
	}
	for i, k := range keys {
		// On a store in real time the steps take time (under the race
		// detector, on a loaded machine, more than a TTL): the leases are
		// kept so that only the supersedes change the queue.
		h = s.renew(h)
		for j := range tks {
			tks[j] = s.renew(tks[j])
		}
		r := sup(s.reqK(fmt.Sprintf("S%d", i), []string{"q"}, 1, k))
		sk := s.enqReq(r)
		s.wantSuperseded(tks[i], r)
		for j := i + 1; j < len(keys); j++ {
			if got := s.get(tks[j]); got.State != store.Waiting || got.Key != keys[j] {
				s.Fatalf("a supersede of key %q: %s of key %q is %s with key %q, want waiting, untouched", k, s.who(tks[j].ID), keys[j], got.State, got.Key)
			}
		}
		tks[i] = sk
	}
	s.wantStop(h, nil)
	sn := s.snap("q")
	if l, _ := findLimit(sn, "q"); l.Waiting != len(keys) {
		s.Fatalf("limit q has %d waiting, want %d: one per key", l.Waiting, len(keys))
	}
}

// Keys and URLs are checked like any input: too long or with control
// characters is ErrInvalid, and nothing is written.
func testKeyURLInvalid(s *suite) {
	h := s.enq("H", "q", 1)
	before := s.snap()
	badKeys := []string{strings.Repeat("k", store.MaxKey+1), "a\nb", "tab\there", "nul\x00", "del\x7f", "esc\x1b[31m", "bad\xff", "\u0085next"}
	for _, k := range badKeys {
		r := sup(s.reqK("bad", []string{"q", "made"}, 1, k))
		_, err := s.st.Enqueue(s.ctx, r)
		if !errors.Is(err, store.ErrInvalid) {
			s.Errorf("Enqueue with key %q: %v, want an error wrapping ErrInvalid", k, err)
		}
	}
	badURLs := []string{"https://ci.invalid/" + strings.Repeat("u", store.MaxURL), "https://ci.invalid/\n", "https://ci.invalid/\x1b]8;;", "https://ci.invalid/\x00"}
	for _, u := range badURLs {
		r := s.reqK("bad", []string{"q", "made"}, 1, "main")
		r.Holder.URL = u
		_, err := s.st.Enqueue(s.ctx, r)
		if !errors.Is(err, store.ErrInvalid) {
			s.Errorf("Enqueue with URL %q: %v, want an error wrapping ErrInvalid", u, err)
		}
	}
	if s.Failed() {
		s.FailNow()
	}
	s.wantNoLimit("made")
	s.wantSameSnapshot(before)
	// The longest ones are fine.
	r := s.reqK("long", []string{"q"}, 1, strings.Repeat("k", store.MaxKey))
	r.Holder.URL = "https://ci.invalid/" + strings.Repeat("u", store.MaxURL-len("https://ci.invalid/"))
	tk := s.enqReq(r)
	if got := s.get(tk); got.Holder.URL != r.Holder.URL || got.Key != r.Key {
		s.Fatalf("the longest key and URL came back as %d and %d bytes, want %d and %d", len(got.Key), len(got.Holder.URL), len(r.Key), len(r.Holder.URL))
	}
	s.wantStop(h, nil)
}

// A stop request is part of the held ticket: a restart keeps it, the
// replacing ticket still waits for the release, and a superseded ticket is
// still known as superseded.
func testStopSurvivesReopen(s *suite) {
	if s.b.Reopen == nil {
		s.Skip("backend has no Reopen")
	}
	q := []string{"q"}
	a := s.enqReq(s.reqK("A", q, 1, "deploy"))
	w := s.enqReq(s.reqK("W", q, 1, "deploy"))
	s.wantWaiting(w, 1)
	rb := rep(s.reqK("B", q, 2, "deploy"))
	b := s.enqReq(rb)
	s.wantSuperseded(w, rb)
	s.wantStop(a, &rb)

	s.st = s.b.Reopen()
	s.wantStop(a, &rb)
	s.wantReplaces(b, a)
	s.wantSuperseded(w, rb)
	s.setLimit("q", 2) // room for B, but A is still there
	s.wantWaiting(b, 1)
	s.release(a, true)
	s.wantHeld(b, 0)
	s.wantStop(b, nil)
}

// Replace composes with several limits and weights: a weight-2 holder of
// two limits is asked to stop by a replacing ticket that shares one of them
// and its weight-2 successor waits, with room, until it is released, then
// takes the lowest indexes; events go to each of the holder's limits.
func testReplaceMulti(s *suite) {
	ra := s.reqM("A", []string{"x", "y"}, 2, 4)
	ra.Key = "env"
	a := s.enqReq(ra)
	re := s.reqM("E", []string{"x", "w"}, 1, 4) // same key, shares no limit with B
	re.Key = "env"
	e := s.enqReq(re)
	s.wantIn(a, map[string][]int{"x": ix(0, 1), "y": ix(0, 1)})
	rb := s.reqM("B", []string{"y", "z"}, 2, 4)
	rb.Key, rb.Replace, rb.Holder.URL = "env", true, "https://ci.invalid/b"
	b := s.enqReq(rb)
	s.wantWaitingIn(b, map[string]int{"y": 1, "z": 1})
	s.wantStop(a, &rb)
	s.wantReplaces(b, a)
	s.wantNewerEvent("replaced", a, rb, "x", "y")
	s.wantStop(e, nil)
	// B blocks y and z meanwhile, as a ticket that does not fit.
	c := s.enqM("C", []string{"z"}, 1, 4)
	s.wantWaitingIn(c, map[string]int{"z": 2})
	d := s.enqM("D", []string{"x"}, 1, 4) // x is not B's: free
	s.wantIn(d, map[string][]int{"x": ix(3)})
	s.release(a, true)
	s.wantIn(b, map[string][]int{"y": ix(0, 1), "z": ix(0, 1)})
	s.wantIn(c, map[string][]int{"z": ix(2)})
}
