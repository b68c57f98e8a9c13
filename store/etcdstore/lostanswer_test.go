package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// loser drops the answer of the first request that its armed predicate
// picks, after the server applied it.
type loser struct {
	pick atomic.Pointer[func(req any) bool]
	then atomic.Pointer[func()] // run once the answer is lost, before the caller hears
	lost atomic.Int32
}

func (l *loser) option() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if p := l.pick.Load(); p != nil && err == nil && (*p)(req) {
			l.pick.Store(nil)
			if then := l.then.Swap(nil); then != nil {
				(*then)()
			}
			l.lost.Add(1)
			return status.Error(codes.Unavailable, "test: the answer was lost")
		}
		return err
	})
}

// arm makes the next request that pick picks lose its answer.
func (l *loser) arm(pick func(req any) bool) { l.pick.Store(&pick) }

// armThen is arm, with then run after the server applied the request and
// before its caller hears: what another client does meanwhile.
func (l *loser) armThen(pick func(req any) bool, then func()) {
	l.then.Store(&then)
	l.arm(pick)
}

func txnWrites(part string, put bool) func(any) bool {
	return func(req any) bool {
		tr, ok := req.(*pb.TxnRequest)
		return ok && writes(tr, part, put)
	}
}

// TestLostAnswersAreRetried: a write that committed but whose answer was
// lost (an etcd member gone after the commit) is read and planned again,
// and finds its own effect: the caller gets the answer, not "unavailable",
// and nothing is applied twice.
func TestLostAnswersAreRetried(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	var l loser
	st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{l.option()}, Prefix: "/lostadmin"})
	step := func(what string, pick func(any) bool, do func() error) {
		t.Helper()
		lost := l.lost.Load()
		l.arm(pick)
		if err := do(); err != nil {
			t.Fatalf("%s with its answer lost: %v", what, err)
		}
		if l.lost.Load() != lost+1 {
			t.Fatalf("%s: the test lost %d answers, want 1", what, l.lost.Load()-lost)
		}
	}
	// etcd's client retries a lease grant itself.
	step("the lease grant of an enqueue", func(req any) bool { _, ok := req.(*pb.LeaseGrantRequest); return ok }, func() error {
		_, err := st.Enqueue(ctx, req("a", "l", 1, 10*time.Second))
		return err
	})
	step("SetLimit", txnWrites("/limits/l", true), func() error {
		lim, err := st.SetLimit(ctx, "l", 3)
		if err == nil && (lim.Slots != 3 || lim.Held != 1) {
			t.Errorf("SetLimit answered %+v, want 3 slots, 1 held", lim)
		}
		return err
	})
	step("SetPolicy", txnWrites("/limits/l", true), func() error {
		lim, err := st.SetPolicy(ctx, "l", store.PolicyChange{Rate: &store.Rate{N: 2, Per: time.Hour}})
		if err == nil && lim.Policy.Rate.N != 2 {
			t.Errorf("SetPolicy answered %+v, want a rate of 2 an hour", lim.Policy)
		}
		return err
	})
	a, err := st.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	step("SetChild", txnWrites("/tickets/l/a", true), func() error {
		got, err := st.SetChild(ctx, a, 4242, 77)
		if err == nil && got.Holder.Pgid != 4242 {
			t.Errorf("SetChild answered pgid %d, want 4242", got.Holder.Pgid)
		}
		return err
	})
	step("Resize", txnWrites("/slots/l/", true), func() error {
		got, err := st.Resize(ctx, a, 2)
		if err == nil && got.Weighs() != 2 {
			t.Errorf("Resize answered weight %d, want 2", got.Weighs())
		}
		return err
	})
	sn, err := st.Snapshot(ctx, "l")
	if err != nil {
		t.Fatal(err)
	}
	if len(sn.Tickets) != 1 || sn.Limits[0].Held != 2 || sn.Limits[0].Slots != 3 {
		t.Fatalf("after the retried writes: limits %+v, tickets %+v; want one ticket of weight 2 in 3 slots", sn.Limits, sn.Tickets)
	}
	if _, err := st.Release(ctx, a, store.Released); err != nil {
		t.Fatal(err)
	}
	step("RemoveLimit", txnWrites("/limits/l", false), func() error { return st.RemoveLimit(ctx, "l", false) })
	if err := st.RemoveLimit(ctx, "l", false); !errors.Is(err, store.ErrLimitNotFound) {
		t.Fatalf("RemoveLimit again: %v, want ErrLimitNotFound", err)
	}
	step("the tombstone of a cancel before its create", txnWrites("/ids/never", true), func() error {
		_, err := st.Cancel(ctx, store.Ticket{ID: "never", Limit: "l"})
		return err
	})
	if _, err := st.Enqueue(ctx, req("never", "l", 1, 10*time.Second)); !errors.Is(err, store.ErrRemoved) {
		t.Fatalf("the create after its cancel: %v, want ErrRemoved", err)
	}
}

// TestLostAnswerOfReapReported: a reap whose removal landed but whose
// answer was lost still reports the ticket it removed.
func TestLostAnswerOfReapReported(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	var l loser
	st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{l.option()}, Prefix: "/lostreap"})
	if _, err := st.Enqueue(ctx, req("x", "r", 1, time.Second)); err != nil {
		t.Fatal(err)
	}
	// Nothing renews x: its lease ends within 2s (TTLs are whole seconds,
	// and the server's revoker may take a moment more).
	deadline := time.Now().Add(20 * time.Second)
	for {
		sn, err := st.Snapshot(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		if len(sn.Tickets) == 1 && sn.Tickets[0].Remaining <= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("x's lease did not end within 20s: %+v", sn.Tickets)
		}
		time.Sleep(200 * time.Millisecond)
	}
	l.arm(txnWrites("/records/r/x", false))
	rm, err := st.Reap(ctx, store.ReapOptions{})
	if err != nil {
		t.Fatalf("Reap with its answer lost: %v", err)
	}
	if l.lost.Load() != 1 {
		t.Fatalf("the test lost %d answers, want 1", l.lost.Load())
	}
	if len(rm) != 1 || rm[0].Ticket.ID != "x" {
		t.Fatalf("Reap reported %+v, want x removed once", rm)
	}
	if _, err := st.Get(ctx, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("x after the reap: %v, want not found", err)
	}
}

// TestLostLimitRemovalSparesTheNextLimit: a forced limit rm whose answer
// was lost, after which another client made the limit again, is done: its
// retry does not remove the new limit and its tickets.
func TestLostLimitRemovalSparesTheNextLimit(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	var l loser
	st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{l.option()}, Prefix: "/lostrm"})
	other := open(t, srv, etcdstore.Options{Prefix: "/lostrm"})
	if _, err := st.Enqueue(ctx, req("old", "l", 1, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	var made error
	l.armThen(txnWrites("/limits/l", false), func() { _, made = other.Enqueue(ctx, req("new", "l", 1, 10*time.Second)) })
	if err := st.RemoveLimit(ctx, "l", true); err != nil {
		t.Fatalf("RemoveLimit with its answer lost: %v", err)
	}
	if made != nil || l.lost.Load() != 1 {
		t.Fatalf("the enqueue in between: %v; %d answers lost, want 1", made, l.lost.Load())
	}
	if _, err := st.Get(ctx, "new"); err != nil {
		t.Fatalf("the ticket of the limit made again: %v, want it kept", err)
	}
	if _, err := st.Get(ctx, "old"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the removed limit's ticket: %v, want not found", err)
	}
}

// An enqueue whose write landed but whose answer was lost finds its
// ticket on the next try, and the ticket keeps the lease the enqueue
// granted: it renews, it is not revoked as unused. Both paths: the full
// one (a short queue) and the light one (behind a live waiter in a queue
// longer than one read takes).
func TestLostEnqueueAnswerKeepsTheLease(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		waiters int
	}{{"full path", 1}, {"light path", 70}} {
		var l loser
		st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{l.option()}, Prefix: "/lostenq/" + strings.ReplaceAll(c.name, " ", "-")})
		mustEnqueue(t, st, req("h", "l", 1, 10*time.Second), store.Held)
		for i := range c.waiters {
			mustEnqueue(t, st, req(fmt.Sprintf("w%03d", i), "l", 1, 10*time.Second), store.Waiting)
		}
		l.arm(txnWrites("/tickets/l/new", true))
		tk, err := st.Enqueue(ctx, req("new", "l", 1, 10*time.Second))
		if err != nil || l.lost.Load() != 1 {
			t.Fatalf("%s: Enqueue with its answer lost: %+v, %v (%d answers lost, want 1)", c.name, tk, err, l.lost.Load())
		}
		time.Sleep(200 * time.Millisecond) // a revocation of the lease would be sent by now
		if got, err := st.Renew(ctx, tk, 10*time.Second); err != nil || got.State != store.Waiting {
			t.Fatalf("%s: Renew of the ticket whose create was unanswered: %+v, %v; want it waiting on its lease", c.name, got, err)
		}
	}
}

// A waiter's release on the light path (behind a live waiter: one
// compare-and-delete of its own keys) whose answer was lost reports the
// removal it made, as a release on the full path does.
func TestLostLightReleaseAnswerReported(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	var l loser
	st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{l.option()}, Prefix: "/lostlight"})
	mustEnqueue(t, st, req("h", "l", 1, 10*time.Second), store.Held)
	mustEnqueue(t, st, req("w1", "l", 1, 10*time.Second), store.Waiting)
	w2 := mustEnqueue(t, st, req("w2", "l", 1, 10*time.Second), store.Waiting)
	l.arm(txnWrites("/records/l/w2", false))
	removed, err := st.Release(ctx, w2, store.Cancelled)
	if err != nil || !removed || l.lost.Load() != 1 {
		t.Fatalf("Release of w2 with its answer lost: %v, %v (%d answers lost); want removed", removed, err, l.lost.Load())
	}
	if _, err := st.Get(ctx, "w2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get w2 after its release: %v, want not found", err)
	}
}

// An enqueue whose write landed unanswered, and whose tries after it got
// no answer either (an election outlasting the request's time), says
// that its outcome is unknown, not only that the store is unavailable:
// the caller sends it again rather than take it as not written. Sent
// again, the same id finds its ticket.
func TestLostEnqueueThenSilenceSaysUnknown(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	var l loser
	var down atomic.Bool
	cut := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if down.Load() {
			return status.Error(codes.Unavailable, "test: no member answers")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{l.option(), cut}, RequestTimeout: time.Second})
	mustEnqueue(t, st, req("h", "l", 1, 10*time.Second), store.Held)
	l.armThen(txnWrites("/tickets/l/new", true), func() { down.Store(true) })
	_, err := st.Enqueue(ctx, req("new", "l", 1, 10*time.Second))
	if !errors.Is(err, store.ErrUnknownOutcome) || !errors.Is(err, store.ErrUnavailable) || l.lost.Load() != 1 {
		t.Fatalf("Enqueue with its answer lost, then no answer: %v (%d answers lost); want unavailable, outcome unknown", err, l.lost.Load())
	}
	down.Store(false)
	tk, err := st.Enqueue(ctx, req("new", "l", 1, 10*time.Second))
	if err != nil || tk.ID != "new" || tk.State != store.Waiting {
		t.Fatalf("Enqueue sent again: %+v, %v; want the ticket the lost write made, waiting", tk, err)
	}
	snap, err := st.Snapshot(ctx, "l")
	if err != nil || len(snap.Tickets) != 2 {
		t.Fatalf("snapshot: %+v, %v; want h and new", snap.Tickets, err)
	}
}
