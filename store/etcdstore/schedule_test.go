package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// Scheduling policies on etcd, beyond the conformance suite's cases: the
// paths of this backend that place or admit a waiter without its limit's
// whole planner (light.go, Get's and a renewal's light reads, Heads, the
// bell), and the compare that keeps two clients from spending one token.

// preq is req with a priority and a share.
func preq(id, limit string, slots, priority int, share string) store.EnqueueRequest {
	r := req(id, limit, slots, time.Minute)
	r.Priority, r.Share = priority, share
	return r
}

// enqueue enqueues r on st and checks that the ticket comes back in state want.
func enqueue(t *testing.T, st store.Store, r store.EnqueueRequest, want store.State) store.Ticket {
	t.Helper()
	tk, err := st.Enqueue(context.Background(), r)
	if err != nil {
		t.Fatalf("Enqueue %s: %v", r.ID, err)
	}
	if tk.State != want {
		t.Fatalf("Enqueue %s: %s at position %d, want %s", r.ID, tk.State, tk.Position, want)
	}
	if tk.Priority != r.Priority || tk.Share != r.Share {
		t.Fatalf("Enqueue %s: priority %d, share %q; want %d, %q", r.ID, tk.Priority, tk.Share, r.Priority, r.Share)
	}
	return tk
}

// setPolicy sets limit name's policy on st.
func setPolicy(t *testing.T, st store.Store, name string, ch store.PolicyChange) store.Limit {
	t.Helper()
	l, err := st.SetPolicy(context.Background(), name, ch)
	if err != nil {
		t.Fatalf("SetPolicy(%q): %v", name, err)
	}
	return l
}

func order(o store.Order) *store.Order { return &o }

// wantPositions checks, through each handle in sts, that Get and Renew
// give each waiter of ids its place (1, 2, ...) and that Snapshot's list of
// waiters begins with them in that order.
func wantPositions(t *testing.T, limit string, sts []*etcdstore.Store, ids ...string) {
	t.Helper()
	ctx := context.Background()
	for hi, st := range sts {
		for i, id := range ids {
			got, err := st.Get(ctx, id)
			if err != nil || got.State != store.Waiting || got.Position != i+1 {
				t.Fatalf("handle %d: Get %s: %s at position %d, %v; want waiting at %d", hi, id, got.State, got.Position, err, i+1)
			}
			if got, err = st.Renew(ctx, got, got.TTL); err != nil || got.State != store.Waiting || got.Position != i+1 {
				t.Fatalf("handle %d: Renew %s: %s at position %d, %v; want waiting at %d", hi, id, got.State, got.Position, err, i+1)
			}
		}
	}
	sn, err := sts[0].Snapshot(ctx, limit)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, tk := range sn.Tickets {
		if tk.State == store.Waiting {
			listed = append(listed, tk.ID)
		}
	}
	if len(listed) < len(ids) || strings.Join(listed[:len(ids)], " ") != strings.Join(ids, " ") {
		t.Fatalf("Snapshot(%q) lists waiters %q, want them to begin with %q", limit, listed, ids)
	}
}

// wantHead checks that Heads of limit on st names id its first waiter.
func wantHead(t *testing.T, st *etcdstore.Store, limit, id string) store.Ticket {
	t.Helper()
	hs, err := st.Heads(context.Background(), limit)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range hs.Tickets {
		if tk.State == store.Waiting {
			if tk.ID != id || tk.Position != 1 {
				t.Fatalf("Heads(%q): first waiter %s at position %d, want %s at 1", limit, tk.ID, tk.Position, id)
			}
			return tk
		}
	}
	t.Fatalf("Heads(%q) lists no waiter, want %s", limit, id)
	return store.Ticket{}
}

// handOn releases held ticket id and checks that next is admitted.
func handOn(t *testing.T, st store.Store, id, next string) {
	t.Helper()
	ctx := context.Background()
	h, err := st.Get(ctx, id)
	if err != nil || h.State != store.Held {
		t.Fatalf("Get %s: %s, %v; want held", id, h.State, err)
	}
	if ok, err := st.Release(ctx, h, store.Released); err != nil || !ok {
		t.Fatalf("Release %s: %v, %v", id, ok, err)
	}
	if got, err := st.Get(ctx, next); err != nil || got.State != store.Held {
		t.Fatalf("after %s left: %s is %s (position %d), %v; want held", id, next, got.State, got.Position, err)
	}
}

// A priority limit orders waiters by priority, ties in ticket order:
// Get, Renew (through the handle that enqueued them, which knows them, and
// through another), Snapshot and Heads place them so, and releases admit
// them so.
func TestSchedulePriorityOrder(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	other := open(t, srv, etcdstore.Options{Prefix: "/" + t.Name()})
	if _, err := st.SetLimit(context.Background(), "p", 1); err != nil {
		t.Fatal(err)
	}
	aging := time.Hour // no point gained while the test runs
	setPolicy(t, st, "p", store.PolicyChange{Order: order(store.ByPriority), Aging: &aging})
	enqueue(t, st, preq("h", "p", 1, 0, ""), store.Held)
	enqueue(t, st, preq("a", "p", 1, 0, ""), store.Waiting)
	if b := enqueue(t, st, preq("b", "p", 1, 5, ""), store.Waiting); b.Position != 1 {
		t.Fatalf("Enqueue b (priority 5, behind a of 0): position %d, want 1", b.Position)
	}
	if c := enqueue(t, st, preq("c", "p", 1, 5, ""), store.Waiting); c.Position != 2 {
		t.Fatalf("Enqueue c (priority 5, after b of 5): position %d, want 2", c.Position)
	}
	enqueue(t, st, preq("d", "p", 1, -3, ""), store.Waiting)
	wantPositions(t, "p", []*etcdstore.Store{st, other}, "b", "c", "a", "d")
	if head := wantHead(t, st, "p", "b"); head.Effective == nil || *head.Effective != 5 {
		t.Fatalf("Heads: b's effective priority %v, want 5", head.Effective)
	}
	handOn(t, st, "h", "b")
	wantPositions(t, "p", []*etcdstore.Store{st, other}, "c", "a", "d")
	handOn(t, other, "b", "c")
	handOn(t, st, "c", "a")
	handOn(t, other, "a", "d")
}

// A fair limit admits first the share holding the fewest slots: alice's
// queue does not shut out bob's one ticket, on every path that places it.
func TestScheduleFairShare(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	other := open(t, srv, etcdstore.Options{Prefix: "/" + t.Name()})
	if _, err := st.SetLimit(context.Background(), "f", 2); err != nil {
		t.Fatal(err)
	}
	setPolicy(t, st, "f", store.PolicyChange{Order: order(store.Fair)})
	enqueue(t, st, preq("h1", "f", 2, 0, "alice"), store.Held)
	enqueue(t, st, preq("h2", "f", 2, 0, "alice"), store.Held)
	enqueue(t, st, preq("a1", "f", 2, 0, "alice"), store.Waiting)
	enqueue(t, st, preq("a2", "f", 2, 0, "alice"), store.Waiting)
	if b := enqueue(t, st, preq("b1", "f", 2, 0, "bob"), store.Waiting); b.Position != 1 {
		t.Fatalf("Enqueue b1 (bob holds none; alice 2): position %d, want 1", b.Position)
	}
	wantPositions(t, "f", []*etcdstore.Store{st, other}, "b1", "a1", "a2")
	wantHead(t, st, "f", "b1")
	handOn(t, st, "h1", "b1")
	wantPositions(t, "f", []*etcdstore.Store{st, other}, "a1", "a2")
	handOn(t, other, "b1", "a1")
}

// The light paths of a FIFO queue (light.go) take the full path on a
// policy limit: an enqueue at the end of a long queue, a cancel behind a
// waiter, and the light reads of Get and Renew would each place or leave
// a waiter by ticket order alone.
func TestScheduleLightPathsFallBack(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	st := open(t, srv, etcdstore.Options{})

	// A queue longer than what Enqueue's first read reads whole, its last
	// ticket a waiter: in FIFO a newcomer goes behind it.
	if _, err := st.SetLimit(ctx, "long", 1); err != nil {
		t.Fatal(err)
	}
	setPolicy(t, st, "long", store.PolicyChange{Order: order(store.ByPriority)})
	enqueue(t, st, preq("h", "long", 1, 0, ""), store.Held)
	for i := range 70 {
		enqueue(t, st, preq(fmt.Sprintf("w%02d", i), "long", 1, 0, ""), store.Waiting)
	}
	if x := enqueue(t, st, preq("x", "long", 1, 10, ""), store.Waiting); x.Position != 1 {
		t.Fatalf("Enqueue x (priority 10) behind 70 waiters of priority 0: position %d, want 1", x.Position)
	}
	wantPositions(t, "long", []*etcdstore.Store{st}, "x", "w00", "w01")
	handOn(t, st, "h", "x")

	// A cancel behind a live waiter frees no slot in FIFO. Here heavy v
	// (priority 10) comes first and does not fit beside h2, so w waits
	// behind it; v's leaving lets w in.
	if _, err := st.SetLimit(ctx, "q", 2); err != nil {
		t.Fatal(err)
	}
	setPolicy(t, st, "q", store.PolicyChange{Order: order(store.ByPriority)})
	h1 := enqueue(t, st, preq("h1", "q", 2, 0, ""), store.Held)
	enqueue(t, st, preq("h2", "q", 2, 0, ""), store.Held)
	enqueue(t, st, preq("w", "q", 2, 0, ""), store.Waiting)
	vr := preq("v", "q", 2, 10, "")
	vr.Weight = 2
	v := enqueue(t, st, vr, store.Waiting)
	if ok, err := st.Release(ctx, h1, store.Released); err != nil || !ok {
		t.Fatalf("Release h1: %v, %v", ok, err)
	}
	wantPositions(t, "q", []*etcdstore.Store{st}, "v", "w")
	if ok, err := st.Cancel(ctx, v); err != nil || !ok {
		t.Fatalf("Cancel v: %v, %v", ok, err)
	}
	if got, err := st.Get(ctx, "w"); err != nil || got.State != store.Held {
		t.Fatalf("after v, first in q's order and too heavy, left: w is %s (position %d), %v; want held in the slot h1 freed", got.State, got.Position, err)
	}
}

// admissions counts the "admitted" events of limit.
func admissions(t *testing.T, st store.Store, limit string) int {
	t.Helper()
	evs, err := st.Events(context.Background(), limit, store.MaxEvents)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Kind == "admitted" {
			n++
		}
	}
	return n
}

// Two handles admitting to a rated limit at once, from many goroutines
// that enqueue and then release or cancel at once, never admit more than
// the rate's N in its window: each admission rewrites the limit's key
// with its start, compared on the revision its plan read.
func TestScheduleRateRaceTwoHandles(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	a := open(t, srv, etcdstore.Options{})
	b := open(t, srv, etcdstore.Options{Prefix: "/" + t.Name()})
	const n = 3
	if _, err := a.SetLimit(ctx, "r", 50); err != nil {
		t.Fatal(err)
	}
	setPolicy(t, a, "r", store.PolicyChange{Rate: &store.Rate{N: n, Per: time.Hour}})
	var wg sync.WaitGroup
	var held atomic.Int32
	errs := make(chan error, 64)
	for g := range 16 {
		st := []*etcdstore.Store{a, b}[g%2]
		wg.Go(func() {
			for round := range 3 {
				tk, err := st.Enqueue(ctx, req(fmt.Sprintf("g%02d-%d", g, round), "r", 50, time.Minute))
				if err != nil {
					errs <- err
					return
				}
				if tk.State == store.Held {
					held.Add(1)
				}
				if _, err := st.Release(ctx, tk, store.Released); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := admissions(t, a, "r"); got != n || held.Load() != n {
		t.Fatalf("48 tickets through two handles, rate %d/1h: %d admitted events, %d enqueues answered held; want %d", n, got, held.Load(), n)
	}
	sn, err := b.Snapshot(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if l := sn.Limits[0]; len(l.Starts) != n || l.Opens.IsZero() {
		t.Fatalf("limit r after the race: starts %v, opens %v; want %d starts and the window's opening", l.Starts, l.Opens, n)
	}
}

// One token, two clients: client B plans to admit its ticket; before its
// transaction lands, client A admits one and releases it (no slot key is
// left to compare, no ticket key created since B's read remains). B's
// transaction fails on the limit's key, which A's admission rewrote with
// its start (and on the limit's counts key, which A's events changed),
// and B, planning again on A's start, leaves its ticket waiting.
func TestScheduleRateTokenSpentOnce(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	prefix := "/" + t.Name()
	a := open(t, srv, etcdstore.Options{Prefix: prefix})
	if _, err := a.SetLimit(ctx, "r", 5); err != nil {
		t.Fatal(err)
	}
	setPolicy(t, a, "r", store.PolicyChange{Rate: &store.Rate{N: 1, Per: time.Hour}})
	var fired atomic.Bool
	var failed error
	hook := grpc.WithChainUnaryInterceptor(func(ictx context.Context, method string, rq, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if tr, ok := rq.(*pb.TxnRequest); ok && writes(tr, "/slots/r/", true) && fired.CompareAndSwap(false, true) {
			tk, err := a.Enqueue(ctx, req("first", "r", 5, time.Minute))
			if err == nil && tk.State != store.Held {
				err = fmt.Errorf("first is %s, want held", tk.State)
			}
			if err == nil {
				_, err = a.Release(ctx, tk, store.Released)
			}
			failed = err
		}
		return invoker(ictx, method, rq, reply, cc, opts...)
	})
	b := open(t, srv, etcdstore.Options{Prefix: prefix, DialOptions: []grpc.DialOption{hook}})
	second, err := b.Enqueue(ctx, req("second", "r", 5, time.Minute))
	if err != nil || failed != nil {
		t.Fatalf("Enqueue second: %v; the admission beside it: %v", err, failed)
	}
	if !fired.Load() {
		t.Fatal("second's admission was never sent: the race did not happen")
	}
	if second.State != store.Waiting {
		t.Fatalf("second is %s: rate 1/1h spent by first, admitted and released while second's admission was in flight", second.State)
	}
	if got := admissions(t, a, "r"); got != 1 {
		t.Fatalf("%d admitted events, want 1", got)
	}
}

// A waiter first in its limit's order but behind another waiter in ticket
// order is not left watching that waiter (the light bell, light.go): when
// the holder's lease expires and nobody writes, its bell settles and it is
// admitted. Only its bell watches: the waiter ahead by ticket has none.
func TestScheduleBellOfPriorityWaiter(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	prefix := "/" + t.Name()
	other := open(t, srv, etcdstore.Options{Prefix: prefix})
	st := open(t, srv, etcdstore.Options{Prefix: prefix})
	if _, err := other.SetLimit(ctx, "p", 1); err != nil {
		t.Fatal(err)
	}
	setPolicy(t, other, "p", store.PolicyChange{Order: order(store.ByPriority)})
	h := req("h", "p", 1, 2*time.Second) // never renewed
	enqueue(t, other, h, store.Held)
	enqueue(t, other, preq("w", "p", 1, 0, ""), store.Waiting)
	bell, err := st.Watch(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	enqueue(t, st, preq("x", "p", 1, 10, ""), store.Waiting)
	waitHeld(t, st, bell, "x", 15*time.Second, "h's 2s lease expired")
}

// waitHeld waits for id's bell until id is held, at most bound.
func waitHeld(t *testing.T, st store.Store, bell store.Bell, id string, bound time.Duration, after string) {
	t.Helper()
	deadline := time.After(bound)
	for {
		select {
		case <-bell.C():
		case <-deadline:
			t.Fatalf("%s not admitted within %s after %s, with only its bell watching", id, bound, after)
		}
		got, err := st.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == store.Held {
			return
		}
	}
}

// A spent rate opens by the clock, with no key changing: the waiter's
// bell reads again then and settles, without a renewal.
func TestScheduleRateWindowWakesBell(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	st := open(t, srv, etcdstore.Options{})
	if _, err := st.SetLimit(ctx, "r", 5); err != nil {
		t.Fatal(err)
	}
	setPolicy(t, st, "r", store.PolicyChange{Rate: &store.Rate{N: 1, Per: time.Second}})
	enqueue(t, st, req("a", "r", 5, time.Minute), store.Held)
	bell, err := st.Watch(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	b, err := st.Enqueue(ctx, req("b", "r", 5, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if b.State == store.Held {
		t.Skip("b was admitted at once: the window slid before its enqueue (a slow step)")
	}
	waitHeld(t, st, bell, "b", 15*time.Second, "a's window of 1s")
}

// A limit's policy and starts and a ticket's priority and share are
// checked when read, as a request is: out of bounds they are ErrCorrupt.
func TestScheduleHostileRecords(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := raw(t, srv)
	ctx := context.Background()
	now := time.Now().UTC()
	at := func(d time.Duration) string { return `"` + now.Add(d).Format(time.RFC3339Nano) + `"` }
	for i, bad := range []struct{ limit, rec, want string }{
		{`{"v":2,"slots":3,"policy":{"order":"lottery"}}`, "", "lottery"},
		{`{"v":2,"slots":3,"policy":{"order":"priority","aging":1000}}`, "", "aging"},
		{`{"v":2,"slots":3,"policy":{"rate":{"n":0,"per":60000000000}}}`, "", "rate"},
		{`{"v":2,"slots":3,"policy":{"rate":{"n":5000,"per":60000000000}}}`, "", "rate"},
		{`{"v":2,"slots":3,"policy":{"rate":{"n":1,"per":60000000000}},"starts":[` + at(-time.Second) + `,` + at(0) + `]}`, "", "2 rate starts"},
		{`{"v":2,"slots":3,"starts":[` + at(0) + `]}`, "", "1 rate starts"},
		{`{"v":1,"slots":3,"policy":{"order":"fair"}}`, "", "version 1"},
		{`{"v":2,"slots":3}`, `{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"priority":101}`, "priority 101"},
		{`{"v":2,"slots":3}`, `{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"share":"a\u0007b"}`, "share"},
		{`{"v":2,"slots":3}`, `{"v":1,"id":"t","limit":"l","state":"waiting","slot":-1,"priority":3}`, "version 1"},
	} {
		prefix := fmt.Sprintf("/hostile-schedule/%d", i)
		if _, err := c.Put(ctx, prefix+"/limits/l", bad.limit); err != nil {
			t.Fatal(err)
		}
		if bad.rec != "" {
			if _, err := c.Put(ctx, prefix+"/records/l/t", bad.rec); err != nil {
				t.Fatal(err)
			}
		}
		st := open(t, srv, etcdstore.Options{Prefix: prefix})
		_, err := st.Snapshot(ctx)
		_, err2 := st.Enqueue(ctx, req("new", "l", 3, time.Minute))
		errs := []error{err, err2}
		if bad.rec == "" { // Heads reads no record of a waiter without a live key
			_, err3 := st.Heads(ctx, "l")
			errs = append(errs, err3)
		}
		for _, err := range errs {
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("limit %s, record %s: %v; want ErrCorrupt saying %q", bad.limit, bad.rec, err, bad.want)
			}
		}
	}
}

// A settle that admits to a priority limit depends on the waiters it read:
// when a waiter of higher priority joins between its read and its commit
// (a waiting enqueue writes no key the settle compares otherwise), it
// plans again and admits the newcomer, as a settle after the enqueue does.
func TestSchedulePriorityNewcomerFirst(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	prefix := "/" + t.Name()
	a := open(t, srv, etcdstore.Options{Prefix: prefix})
	var armed, fired atomic.Bool
	var failed error
	hook := grpc.WithChainUnaryInterceptor(func(ictx context.Context, method string, rq, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if tr, ok := rq.(*pb.TxnRequest); ok && armed.Load() && writes(tr, "/slots/p/", true) && fired.CompareAndSwap(false, true) {
			_, failed = a.Enqueue(ctx, preq("x", "p", 1, 10, ""))
		}
		return invoker(ictx, method, rq, reply, cc, opts...)
	})
	b := open(t, srv, etcdstore.Options{Prefix: prefix, DialOptions: []grpc.DialOption{hook}})
	if _, err := b.SetLimit(ctx, "p", 1); err != nil {
		t.Fatal(err)
	}
	setPolicy(t, b, "p", store.PolicyChange{Order: order(store.ByPriority)})
	h := enqueue(t, b, preq("h", "p", 1, 0, ""), store.Held)
	enqueue(t, b, preq("w", "p", 1, 0, ""), store.Waiting)
	armed.Store(true)
	if ok, err := b.Release(ctx, h, store.Released); err != nil || !ok || failed != nil {
		t.Fatalf("Release h: %v, %v; the enqueue of x beside it: %v", ok, err, failed)
	}
	if !fired.Load() {
		t.Fatal("w's admission was never sent: the race did not happen")
	}
	if got, err := b.Get(ctx, "x"); err != nil || got.State != store.Held {
		t.Fatalf("x (priority 10, waiting when h's release committed) is %s, %v; want held, w waiting", got.State, err)
	}
	wantPositions(t, "p", []*etcdstore.Store{a, b}, "w")
}
