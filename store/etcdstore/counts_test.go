package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

func mustCounts(t *testing.T, st store.Store, limit string) store.Counts {
	t.Helper()
	cs, err := st.Counts(context.Background(), limit)
	if err != nil {
		t.Fatalf("Counts(%q): %v", limit, err)
	}
	if len(cs) != 1 || cs[0].Limit != limit {
		t.Fatalf("Counts(%q) = %+v", limit, cs)
	}
	return cs[0]
}

// tally is what the limit's log says its counts are.
func tally(t *testing.T, st store.Store, limit string) store.Counts {
	t.Helper()
	evs, err := st.Events(context.Background(), limit, store.MaxEvents)
	if err != nil {
		t.Fatal(err)
	}
	c := store.Counts{Limit: limit}
	for _, e := range evs {
		c.Add(e)
	}
	return c
}

// A supersede too big for one transaction is committed in parts (see
// Enqueue): each part counts its own removals, so the counts are the
// log's, each superseded waiter once.
func TestCountsOfSupersedeInParts(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{MaxTxnOps: 100}) // the plans' own bound (maxPlanOps)
	st := open(t, srv, etcdstore.Options{})
	mustEnqueue(t, st, keyReq("h", "l", "main", 1), store.Held)
	const waiters = 60 // some twenty fit in one transaction
	for i := range waiters {
		mustEnqueue(t, st, keyReq(fmt.Sprintf("w%d", i), "l", "main", 1), store.Waiting)
	}
	r := keyReq("n", "l", "main", 1)
	r.Supersede = true
	mustEnqueue(t, st, r, store.Waiting)
	c := mustCounts(t, st, "l")
	if c.Superseded != waiters || c.Admitted != 1 || c.Hold.Count != 0 {
		t.Fatalf("counts %+v, want %d superseded, 1 admitted", c, waiters)
	}
	if want := tally(t, st, "l"); c.Superseded != want.Superseded || c.Admitted != want.Admitted {
		t.Fatalf("counts %+v, the log says %+v", c, want)
	}
}

// The largest tickets one transaction takes (MaxTicketKeys: 16 limits, or
// one limit of weight 61), their limits created by the enqueue, still fit
// with their counts keys, and are counted in each limit.
func TestCountsOfLargestTickets(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{MaxTxnOps: 100}) // the plans' own bound (maxPlanOps)
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	var sixteen []string
	for i := range store.MaxLimits {
		sixteen = append(sixteen, fmt.Sprintf("l%02d", i))
	}
	for _, c := range []struct {
		limits []string
		weight int
	}{{sixteen, 1}, {[]string{"one"}, 61}} {
		first := mustEnqueue(t, st, multi(fmt.Sprintf("first-%d", len(c.limits)), c.limits, c.weight, c.weight), store.Held)
		second := mustEnqueue(t, st, multi(fmt.Sprintf("second-%d", len(c.limits)), c.limits, c.weight, c.weight), store.Waiting)
		if ok, err := st.Release(ctx, first, store.Released); err != nil || !ok {
			t.Fatalf("Release %s: %v, %v", first.ID, ok, err)
		}
		if ok, err := st.Release(ctx, mustGet(t, st, second.ID), store.Busy); err != nil || !ok {
			t.Fatalf("Release %s: %v, %v", second.ID, ok, err)
		}
		for _, n := range c.limits {
			got := mustCounts(t, st, n)
			if got.Admitted != 2 || got.Released != 1 || got.Busy != 1 || got.Hold.Count != 2 {
				t.Fatalf("counts of %s: %+v, want 2 admitted, 1 released, 1 busy, 2 holds", n, got)
			}
		}
	}
}

// A holder's late "lost" (its ticket reaped or released by someone else)
// is counted in its limits that still exist, and creates no counts for a
// limit removed meanwhile.
func TestCountsOfLateLost(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	c := raw(t, srv)
	ctx := context.Background()
	a := mustEnqueue(t, st, multi("a", []string{"x", "y"}, 1, 1), store.Held)
	if ok, err := st.Release(ctx, a, store.Released); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := st.RemoveLimit(ctx, "y", false); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Release(ctx, a, store.Lost); err != nil || ok {
		t.Fatalf("late Release(lost) of a ticket gone: %v, %v; want false, nil", ok, err)
	}
	got := mustCounts(t, st, "x")
	if got.Lost != 1 || got.Released != 1 || got.Hold.Count != 1 {
		t.Fatalf("counts of x: %+v, want 1 released (with its hold), 1 lost (no hold)", got)
	}
	if _, err := st.Counts(ctx, "y"); !errors.Is(err, store.ErrLimitNotFound) {
		t.Fatalf("Counts of removed limit y: %v, want ErrLimitNotFound", err)
	}
	prefix := "/" + t.Name() + "/counts/"
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != prefix+"x" {
		t.Fatalf("counts keys %v, want only %sx", resp.Kvs, prefix)
	}
}

// Past store.MaxEvents events a reap trims the oldest, and the counts
// still count every run. The log is filled up straight in etcd behind the
// real runs (10,000 enqueues would take minutes), then a reap trims it.
func TestCountsSurviveTrimmedLog(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	c := raw(t, srv)
	ctx := context.Background()
	const runs = 30
	for i := range runs {
		tk := mustEnqueue(t, st, req(fmt.Sprintf("p%d", i), "p", 1, 10*time.Second), store.Held)
		if ok, err := st.Release(ctx, tk, store.Released); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	before := mustCounts(t, st, "p")
	prefix := "/" + t.Name() + "/events/other/"
	for i := 0; i < store.MaxEvents+200; i += 100 {
		var ops []clientv3.Op
		for j := i; j < i+100; j++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sf%05d.admitted", prefix, j),
				fmt.Sprintf(`{"v":2,"i":0,"kind":"admitted","limit":"other","ticket":"f%05d","fence":1,"slot":0}`, j)))
		}
		if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Reap(ctx, store.ReapOptions{}); err != nil {
		t.Fatal(err)
	}
	if evs, err := st.Events(ctx, "p", store.MaxEvents); err != nil || len(evs) != 0 {
		t.Fatalf("events of p after the trim: %d, %v; want none (trimmed)", len(evs), err)
	}
	after := mustCounts(t, st, "p")
	if after.Admitted != runs || after.Released != runs || after.Hold.Count != runs || after.Hold.Sum != before.Hold.Sum {
		t.Fatalf("counts after the log was trimmed: %+v, want %+v", after, before)
	}
}

// A counts key no store could have written is ErrCorrupt, for Counts and
// for the write that would count into it (never read as zero and written
// over).
func TestHostileCountsAreCorrupt(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := raw(t, srv)
	ctx := context.Background()
	for i, v := range []string{
		`{"v":2,"limit":"x","admitted":`,
		`{"v":1,"limit":"x"}`,
		`{"v":3,"limit":"x"}`,
		`{"v":2,"limit":"y"}`,
		`{"v":2,"limit":"x","admitted":2,"wait":{"buckets":[1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"count":1,"sum":0}}`,
		`{"v":2,"limit":"x","hold":{"buckets":[2],"count":2,"sum":1}}`,
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			st := open(t, srv, etcdstore.Options{})
			if _, err := st.SetLimit(ctx, "x", 1); err != nil {
				t.Fatal(err)
			}
			key := "/" + strings.ReplaceAll(t.Name(), "/", "_") + "/counts/x"
			if _, err := c.Put(ctx, key, v); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Counts(ctx, "x"); !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Counts over %s: %v, want ErrCorrupt", v, err)
			}
			if _, err := st.Enqueue(ctx, req("a", "x", 1, 10*time.Second)); !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Enqueue counting into %s: %v, want ErrCorrupt", v, err)
			}
			resp, err := c.Get(ctx, key)
			if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != v {
				t.Fatalf("the hostile counts were written over: %v, %v", resp, err)
			}
		})
	}
}

// Counts left without their limit (written by hand: removing a limit
// deletes its counts) do not pass to a limit made under that name: it
// counts from zero, made by SetLimit or by an enqueue.
func TestCountsOfNewLimitStartAtZero(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	c := raw(t, srv)
	ctx := context.Background()
	left := `{"v":2,"limit":"%s","admitted":7,"released":7,"wait":{"buckets":[7,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"count":7,"sum":0}}`
	for _, n := range []string{"set", "enq"} {
		if _, err := c.Put(ctx, "/"+t.Name()+"/counts/"+n, fmt.Sprintf(left, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.SetLimit(ctx, "set", 1); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, st, req("a", "enq", 1, 10*time.Second), store.Held)
	if got := mustCounts(t, st, "set"); got.Admitted != 0 || got.Released != 0 {
		t.Errorf("counts of a limit made by SetLimit over counts left behind: %+v, want zero", got)
	}
	if got := mustCounts(t, st, "enq"); got.Admitted != 1 || got.Released != 0 {
		t.Errorf("counts of a limit made by an enqueue over counts left behind: %+v, want its one admission", got)
	}
}

// A "lost" release sent twice (a retried request, or a late duplicate the
// network delivers) leaves counts that are the log's tally: the event
// counted as often as the log shows it. The simulation found the second
// one counted again while it overwrote the first one's event key.
func TestCountsOfRepeatedLost(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	a := mustEnqueue(t, st, req("a", "x", 1, 10*time.Second), store.Held)
	if ok, err := st.Release(ctx, a, store.ForceReleased); err != nil || !ok {
		t.Fatal(ok, err)
	}
	for range 2 {
		if ok, err := st.Release(ctx, a, store.Lost); err != nil || ok {
			t.Fatalf("late Release(lost) of a ticket gone: %v, %v; want false, nil", ok, err)
		}
	}
	if got, want := mustCounts(t, st, "x"), tally(t, st, "x"); got.Lost != want.Lost {
		t.Fatalf("counts of x say %d lost, the log %d", got.Lost, want.Lost)
	}
}
