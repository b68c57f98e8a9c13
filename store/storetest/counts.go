package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/slotctl/slotctl/store"
)

// The counters (docs/leases.md §2.8): each limit's counts of
// events by kind and its wait and hold histograms, kept beside its tickets
// and updated in the step of every event it logs, so that they agree with
// the log, never go backwards, survive a restart and the log's pruning,
// and go with the limit. And store.Busy: Cancel under its own name.

// counts reads Counts(limits...) and checks what every read must satisfy:
// one entry per limit, in name order, each passing (*store.Counts).Check,
// one wait observed per admission.
func (s *suite) counts(limits ...string) []store.Counts {
	s.Helper()
	cs, err := s.st.Counts(s.ctx, limits...)
	if err != nil {
		s.Fatalf("Counts(%q): %v", limits, err)
	}
	if len(limits) > 0 && len(cs) != len(limits) {
		s.Fatalf("Counts(%q): %d entries, want one per limit", limits, len(cs))
	}
	for i, c := range cs {
		if err := c.Check(); err != nil {
			s.Fatalf("Counts(%q): entry %d: %v", limits, i, err)
		}
		if i > 0 && c.Limit <= cs[i-1].Limit {
			s.Fatalf("Counts(%q): limit %q after %q: want name order, each once", limits, c.Limit, cs[i-1].Limit)
		}
		if c.Wait.Count != c.Admitted {
			s.Fatalf("Counts(%q): limit %q: %d admissions, %d waits observed", limits, c.Limit, c.Admitted, c.Wait.Count)
		}
	}
	return cs
}

// countsOf is one limit's counts.
func (s *suite) countsOf(limit string) store.Counts {
	s.Helper()
	c := s.counts(limit)[0]
	if c.Limit != limit {
		s.Fatalf("Counts(%q) returned the counts of %q", limit, c.Limit)
	}
	return c
}

// tally is what the limit's log says its counts are (the log must hold
// every event of the limit since it was created).
func (s *suite) tally(limit string) store.Counts {
	s.Helper()
	c := store.Counts{Limit: limit}
	for _, e := range s.events(limit, store.MaxEvents) {
		c.Add(e)
	}
	return c
}

// wantCountsOfLog checks that the limit's counts are exactly the tally of
// its log: each event counted once, its Waited and Held in the histograms.
func (s *suite) wantCountsOfLog(limit string) store.Counts {
	s.Helper()
	got, want := s.countsOf(limit), s.tally(limit)
	if !sameCounts(got, want) {
		s.Fatalf("Counts(%q) = %s\nwant the tally of its log %s", limit, fmtCounts(got), fmtCounts(want))
	}
	return got
}

// sameCounts compares counts, a histogram never observed (nil buckets)
// equal to one of zero buckets.
func sameCounts(a, b store.Counts) bool {
	norm := func(c store.Counts) store.Counts {
		for _, h := range []*store.Histogram{&c.Wait, &c.Hold} {
			if h.Count == 0 && !slices.ContainsFunc(h.Buckets, func(n uint64) bool { return n != 0 }) {
				h.Buckets = nil
			}
		}
		return c
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func fmtCounts(c store.Counts) string {
	return fmt.Sprintf("{%s: admitted %d released %d cancelled %d busy %d superseded %d replaced %d reaped %d lost %d force-released %d; wait %d/%.3fs %v; hold %d/%.3fs %v}",
		c.Limit, c.Admitted, c.Released, c.Cancelled, c.Busy, c.Superseded, c.Replaced, c.Reaped, c.Lost, c.ForceReleased,
		c.Wait.Count, c.Wait.Sum, c.Wait.Buckets, c.Hold.Count, c.Hold.Sum, c.Hold.Buckets)
}

// byKind is each counter by the kind of event it counts.
func byKind(c store.Counts) map[string]uint64 {
	return map[string]uint64{
		"admitted": c.Admitted, string(store.Released): c.Released, string(store.Cancelled): c.Cancelled,
		string(store.Busy): c.Busy, string(store.Superseded): c.Superseded, "replaced": c.Replaced,
		string(store.Reaped): c.Reaped, string(store.Lost): c.Lost, string(store.ForceReleased): c.ForceReleased,
		"wait": c.Wait.Count, "hold": c.Hold.Count,
	}
}

// wantCounts checks the limit's counters against want (kinds it does not
// name are 0) and the log's tally.
func (s *suite) wantCounts(limit string, want map[string]uint64) store.Counts {
	s.Helper()
	c := s.wantCountsOfLog(limit)
	for k, n := range byKind(c) {
		if n != want[k] {
			s.Fatalf("Counts(%q): %s = %d, want %d; counts %s", limit, k, n, want[k], fmtCounts(c))
		}
	}
	return c
}

// wantNotLess checks that no counter of cur is below prev's.
func (s *suite) wantNotLess(when string, prev, cur store.Counts) {
	s.Helper()
	p, c := byKind(prev), byKind(cur)
	for k := range p {
		if c[k] < p[k] {
			s.Fatalf("%s: Counts(%q) %s went back from %d to %d", when, cur.Limit, k, p[k], c[k])
		}
	}
	for i := range prev.Hold.Buckets {
		if i >= len(cur.Hold.Buckets) || cur.Hold.Buckets[i] < prev.Hold.Buckets[i] {
			s.Fatalf("%s: Counts(%q) hold buckets went back from %v to %v", when, cur.Limit, prev.Hold.Buckets, cur.Hold.Buckets)
		}
	}
	for i := range prev.Wait.Buckets {
		if i >= len(cur.Wait.Buckets) || cur.Wait.Buckets[i] < prev.Wait.Buckets[i] {
			s.Fatalf("%s: Counts(%q) wait buckets went back from %v to %v", when, cur.Limit, prev.Wait.Buckets, cur.Wait.Buckets)
		}
	}
	if cur.Wait.Sum < prev.Wait.Sum || cur.Hold.Sum < prev.Hold.Sum {
		s.Fatalf("%s: Counts(%q) sums went back: wait %v -> %v, hold %v -> %v", when, cur.Limit, prev.Wait.Sum, cur.Wait.Sum, prev.Hold.Sum, cur.Hold.Sum)
	}
}

// eventOf is tk's event of kind in limit (the last one).
func (s *suite) eventOf(limit string, tk store.Ticket, kind string) store.Event {
	s.Helper()
	var found *store.Event
	for _, e := range s.events(limit, store.MaxEvents) {
		if e.Ticket == tk.ID && e.Kind == kind {
			found = &e
		}
	}
	if found == nil {
		s.Fatalf("no %q event of %s in limit %q", kind, s.who(tk.ID), limit)
	}
	return *found
}

// wantTimes checks an event's Waited and Held: at least least where the
// ticket waited or was held (a held ticket's removal says a hold, however
// short), zero where it was not.
func (s *suite) wantTimes(limit string, tk store.Ticket, kind string, waited, held time.Duration, wasHeld bool) {
	s.Helper()
	e := s.eventOf(limit, tk, kind)
	if kind == "admitted" {
		if e.Waited < waited {
			s.Fatalf("%q event of %s in %q: waited %v, want at least %v", kind, s.who(tk.ID), limit, e.Waited, waited)
		}
	} else if e.Waited != 0 {
		s.Fatalf("%q event of %s in %q: waited %v, want none: only an admission says it", kind, s.who(tk.ID), limit, e.Waited)
	}
	switch {
	case wasHeld && (e.Held <= 0 || e.Held < held):
		s.Fatalf("%q event of %s in %q: held %v, want at least %v (and > 0): it removed a held ticket", kind, s.who(tk.ID), limit, e.Held, held)
	case !wasHeld && e.Held != 0:
		s.Fatalf("%q event of %s in %q: held %v, want none: the ticket was not held", kind, s.who(tk.ID), limit, e.Held)
	}
}

// Each kind of event is counted once in its limit, in the step that logs
// it, and the histograms hold each admission's wait and each held
// ticket's hold: the counts are the tally of the log.
func testCountsEachKind(s *suite) {
	const k = "k"
	a := s.enq("A", k, 1)
	s.wantCounts(k, map[string]uint64{"admitted": 1, "wait": 1})
	b := s.enqReq(s.reqK("B", lims(k), 1, "job"))
	c := s.enq("C", k, 1)
	d := s.enq("D", k, 1)
	d0 := s.part()
	s.advance(d0)
	b, c, d = s.renew(b), s.renew(c), s.renew(d)
	s.release(a, true)
	b = s.wantHeld(b, 0)
	s.wantTimes(k, a, string(store.Released), 0, d0, true)
	s.wantTimes(k, b, "admitted", d0, 0, false)
	s.cancel(c, true)
	s.wantTimes(k, c, string(store.Cancelled), 0, 0, false)
	s.releaseWhy(d, store.Busy, true)
	s.wantTimes(k, d, string(store.Busy), 0, 0, false)
	s.wantCounts(k, map[string]uint64{"admitted": 2, "released": 1, "cancelled": 1, "busy": 1, "wait": 2, "hold": 1})

	re := s.reqK("E", lims(k), 1, "deploy")
	e := s.enqReq(re)
	f := s.enqReq(sup(s.reqK("F", lims(k), 1, "deploy")))
	s.wantTimes(k, e, string(store.Superseded), 0, 0, false)
	g := s.enqReq(rep(s.reqK("G", lims(k), 1, "job"))) // asks B to stop
	s.wantTimes(k, b, "replaced", 0, 0, false)         // asked to stop, not removed
	s.wantCounts(k, map[string]uint64{"admitted": 2, "released": 1, "cancelled": 1, "busy": 1, "superseded": 1, "replaced": 1, "wait": 2, "hold": 1})

	// B's lease runs out; the reap removes it and admits F.
	s.advance(s.part())
	f, g = s.renew(f), s.renew(g)
	s.advance(s.part())
	s.wantRemoved("Reap", s.reap(false, k), b)
	f, g = s.renew(f), s.renew(g)
	f = s.wantHeld(f, 0)
	s.wantTimes(k, b, string(store.Reaped), 0, d0, true)
	s.wantTimes(k, f, "admitted", 2*s.part(), 0, false)
	s.releaseWhy(f, store.Lost, true)
	s.wantTimes(k, f, string(store.Lost), 0, 0, true)
	g = s.wantHeld(g, 0)
	h := s.enqM("H", lims(k, "k2"), 1, 1) // waits in k behind G
	s.removeLimit("k2", true, nil)
	s.wantTimes(k, h, string(store.ForceReleased), 0, 0, false)
	s.release(g, true)
	s.wantCounts(k, map[string]uint64{"admitted": 4, "released": 2, "cancelled": 1, "busy": 1, "superseded": 1, "replaced": 1,
		"reaped": 1, "lost": 1, "force-released": 1, "wait": 4, "hold": 4})

	// A removed limit has no counts; another one has zero.
	if _, err := s.st.Counts(s.ctx, "k2"); !errors.Is(err, store.ErrLimitNotFound) {
		s.Fatalf("Counts(\"k2\") after RemoveLimit: %v, want ErrLimitNotFound", err)
	}
	if _, err := s.st.Counts(s.ctx, k, "nope"); !errors.Is(err, store.ErrLimitNotFound) {
		s.Fatalf("Counts(%q, \"nope\"): %v, want ErrLimitNotFound", k, err)
	}
	if _, err := s.st.Counts(s.ctx, "../x"); !errors.Is(err, store.ErrInvalid) {
		s.Fatalf("Counts(\"../x\"): %v, want ErrInvalid", err)
	}
	s.setLimit("empty", 2)
	all := s.counts()
	if len(all) != 2 || all[0].Limit != "empty" || all[1].Limit != k {
		s.Fatalf("Counts() = %d entries %v, want \"empty\" and %q", len(all), all, k)
	}
	if !sameCounts(all[0], store.Counts{Limit: "empty"}) {
		s.Fatalf("Counts of a limit that logged nothing: %s, want zero", fmtCounts(all[0]))
	}
	if !sameCounts(all[1], s.countsOf(k)) {
		s.Fatalf("Counts() entry of %q %s differs from Counts(%q) %s", k, fmtCounts(all[1]), k, fmtCounts(s.countsOf(k)))
	}
}

// A ticket of several limits is counted in each of them, its weight no
// matter: one admission, one release, one hold per limit.
func testCountsEveryLimit(s *suite) {
	x := s.enqM("X", lims("m1", "m2"), 2, 3)
	y := s.enqM("Y", lims("m2", "m1"), 2, 3) // 1 of 3 free: waits in both
	s.advance(s.part())
	x, y = s.renew(x), s.renew(y)
	s.release(x, true)
	y = s.wantHeld(y, -1)
	s.releaseWhy(y, store.Busy, true) // promoted meanwhile: removed as busy, held
	for _, l := range []string{"m1", "m2"} {
		s.wantTimes(l, x, string(store.Released), 0, s.part(), true)
		s.wantTimes(l, y, "admitted", s.part(), 0, false)
		s.wantTimes(l, y, string(store.Busy), 0, 0, true)
		s.wantCounts(l, map[string]uint64{"admitted": 2, "released": 1, "busy": 1, "wait": 2, "hold": 2})
	}
}

// Counts never go backwards, survive a restart, and go with their limit:
// a limit made again under the same name counts from zero.
func testCountsSurviveRestart(s *suite) {
	const r = "r"
	a := s.enq("A", r, 1)
	b := s.enq("B", r, 1)
	s.advance(s.part())
	b = s.renew(b)
	s.release(a, true)
	b = s.wantHeld(b, 0)
	before := s.wantCounts(r, map[string]uint64{"admitted": 2, "released": 1, "wait": 2, "hold": 1})
	if s.b.Reopen != nil {
		s.st = s.b.Reopen()
		if s.st == nil {
			s.Fatal("Reopen returned nil")
		}
		if after := s.countsOf(r); !sameCounts(after, before) {
			s.Fatalf("Counts(%q) after a restart %s, want %s as before", r, fmtCounts(after), fmtCounts(before))
		}
	}
	prev := before
	for i := range 3 {
		tk := s.enq(fmt.Sprintf("C%d", i), r, 1)
		s.release(b, true)
		b = s.wantHeld(tk, 0)
		cur := s.wantCountsOfLog(r)
		s.wantNotLess(fmt.Sprintf("round %d", i), prev, cur)
		prev = cur
	}
	s.release(b, true)
	s.wantCounts(r, map[string]uint64{"admitted": 5, "released": 5, "wait": 5, "hold": 5})
	s.removeLimit(r, false, nil)
	if _, err := s.st.Counts(s.ctx, r); !errors.Is(err, store.ErrLimitNotFound) {
		s.Fatalf("Counts(%q) after RemoveLimit: %v, want ErrLimitNotFound", r, err)
	}
	s.setLimit(r, 1)
	if c := s.countsOf(r); !sameCounts(c, store.Counts{Limit: r}) {
		s.Fatalf("Counts(%q) of the limit made again: %s, want zero", r, fmtCounts(c))
	}
	dd := s.enq("D", r, 1)
	s.release(dd, true)
	// The log keeps the old limit's events; the counts are the new one's.
	c := s.countsOf(r)
	if c.Admitted != 1 || c.Released != 1 || c.Wait.Count != 1 || c.Hold.Count != 1 || byKind(c)["cancelled"]+c.Busy+c.Reaped != 0 {
		s.Fatalf("Counts(%q) of the limit made again, after one run: %s, want that run only", r, fmtCounts(c))
	}
}

// The counts do not depend on the log: past store.MaxEvents events, the
// oldest are pruned and the counts still count every one (Harness.ManyEvents).
func testCountsSurvivePruning(s *suite) {
	if !s.h.ManyEvents {
		s.Skip("backend logs too slowly for more than store.MaxEvents events in a case (Harness.ManyEvents)")
	}
	const p = "p"
	pairs := store.MaxEvents/2 + 10
	var prev store.Counts
	for i := range pairs {
		tk := s.enq(fmt.Sprintf("P%d", i), p, 1)
		s.release(tk, true)
		if i%1000 == 999 {
			cur := s.countsOf(p)
			s.wantNotLess(fmt.Sprintf("after %d runs", i+1), prev, cur)
			prev = cur
		}
	}
	if n := len(s.events(p, store.MaxEvents)); n != store.MaxEvents {
		s.Fatalf("the log holds %d events of %q after %d were logged, want the newest %d", n, p, 2*pairs, store.MaxEvents)
	}
	c := s.countsOf(p)
	want := uint64(pairs)
	if c.Admitted != want || c.Released != want || c.Hold.Count != want {
		s.Fatalf("Counts(%q) after %d runs (the log pruned): %s, want %d admitted, released and holds", p, pairs, fmtCounts(c), want)
	}
	s.wantNotLess("at the end", prev, c)
}

// A store of the previous format opens with zero counts, and counts from
// there on: the legacy tickets' releases and admissions.
func testCountsLegacy(s *suite) {
	if s.h.NewLegacy == nil {
		s.Skip("no Harness.NewLegacy")
	}
	b := s.h.NewLegacy(s.T)
	s.b, s.st = b, b.Store
	if c := s.countsOf(LegacyLimit); !sameCounts(c, store.Counts{Limit: LegacyLimit}) {
		s.Fatalf("Counts(%q) of a store of the previous format: %s, want zero", LegacyLimit, fmtCounts(c))
	}
	s.names[LegacyIDs[0]] = LegacyIDs[0]
	s.release(store.Ticket{ID: LegacyIDs[0], Limit: LegacyLimit}, true) // held; its successor legacy-c is admitted
	c := s.countsOf(LegacyLimit)
	if c.Released != 1 || c.Hold.Count != 1 || c.Admitted != 1 || c.Wait.Count != 1 {
		s.Fatalf("Counts(%q) after releasing %s: %s, want 1 released, 1 hold, 1 admitted", LegacyLimit, LegacyIDs[0], fmtCounts(c))
	}
}

// Release with store.Busy is Cancel under its own name: a waiting ticket
// and one promoted meanwhile are removed, an id never seen is tombstoned
// (the create refused when it lands), the event and the tombstone say busy.
func testBusy(s *suite) {
	const q = "q"
	a := s.enq("A", q, 1)
	b := s.enq("B", q, 1)
	c := s.enq("C", q, 1)
	d := s.enq("D", q, 1)
	s.releaseWhy(store.Ticket{ID: b.ID, Limit: b.Limit, Fence: b.Fence + 1000}, store.Busy, false) // another fence
	s.wantWaiting(b, 1)
	s.releaseWhy(b, store.Busy, true)
	s.wantGone(b)
	s.releaseWhy(b, store.Busy, false) // idempotent
	s.checkLimit(q, 1, 1, 2)
	s.wantEvent(q, b, string(store.Busy))
	s.release(a, true)
	s.wantHeld(c, 0)
	s.releaseWhy(c, store.Busy, true) // promoted before its holder saw it
	s.wantGone(c)
	s.wantHeld(d, 0)
	s.checkLimit(q, 1, 1, 0)
	s.wantEvent(q, c, string(store.Busy))
	for _, tk := range []store.Ticket{b, c} {
		if k := s.kindsOf(tk); count(k, string(store.Cancelled)) != 0 || count(k, string(store.Busy)) != 1 {
			s.Fatalf("events of %s: %q, want one %q and no %q", s.who(tk.ID), k, store.Busy, store.Cancelled)
		}
		if _, err := s.st.Get(s.ctx, tk.ID); !errors.Is(err, store.ErrNotFound) {
			s.Fatalf("Get %s after Release(busy): %v, want ErrNotFound", s.who(tk.ID), err)
		}
		if _, err := s.st.Enqueue(s.ctx, store.EnqueueRequest{ID: tk.ID, Limit: q, Slots: 1, TTL: s.h.TTL, Holder: holder("again")}); !errors.Is(err, store.ErrRemoved) {
			s.Fatalf("Enqueue %s after Release(busy): %v, want ErrRemoved", s.who(tk.ID), err)
		}
	}
	ghost := store.Ticket{ID: s.id("G"), Limit: "nolimit"}
	s.releaseWhy(ghost, store.Busy, false)
	s.wantNoLimit("nolimit")
	if got, err := s.st.Enqueue(s.ctx, store.EnqueueRequest{ID: ghost.ID, Limit: "nolimit", Slots: 1, TTL: s.h.TTL, Holder: holder("G")}); !errors.Is(err, store.ErrRemoved) {
		s.Fatalf("Enqueue %s after Release(busy) of an id never seen: ticket %+v, err %v; want ErrRemoved", s.who(ghost.ID), got, err)
	}
	s.wantCounts(q, map[string]uint64{"admitted": 3, "released": 1, "busy": 2, "wait": 3, "hold": 2})
}

// Concurrent removals of different tickets of one limit, which compete for
// nothing else (no waiter to admit), each count: two steps never add to
// the same reading of the counts and keep only one of the two.
func testCountsConcurrent(s *suite) {
	const (
		n     = 12
		limit = "cc"
	)
	tks := make([]store.Ticket, n)
	for i := range tks {
		tks[i] = s.enq(fmt.Sprintf("T%d", i), limit, n)
		s.wantHeld(tks[i], -1)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i, tk := range tks {
		why := store.Released
		if i%3 == 1 {
			why = store.Lost
		}
		wg.Go(func() {
			<-start
			ok, err := s.st.Release(s.ctx, tk, why)
			if err == nil && !ok {
				err = fmt.Errorf("Release %s (%s) removed nothing", s.who(tk.ID), why)
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			s.Fatalf("concurrent release: %v", err)
		}
	}
	s.wantCounts(limit, map[string]uint64{"admitted": n, "released": n - n/3, "lost": n / 3, "wait": n, "hold": n})
}
