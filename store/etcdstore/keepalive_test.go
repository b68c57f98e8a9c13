package etcdstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// TestRenewOfARevokedLeaseIsLost: a lease revoked on the server while the
// handle's keep-alive stream is open (it renewed on it just before) is
// reported lost at the next renewal, on that stream, not retried as a
// failed request.
func TestRenewOfARevokedLeaseIsLost(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	counted, answers := staleKeepAlives(0) // counts the keep-alive answers, changes none
	st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{counted}})
	ctx := context.Background()
	tk, err := st.Enqueue(ctx, req("r1", "revoked", 1, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := st.Enqueue(ctx, req("r2", "revoked", 1, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Renew(ctx, tk, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	revokeBehind(t, []*clientv3.Client{raw(t, srv)}, "/"+t.Name(), tk)
	answers.Store(0)
	_, err = st.Renew(ctx, tk, 30*time.Second)
	// The keep-alive's answer says so (TTL 0), before any read would find
	// the ticket's key gone with its lease.
	if !errors.Is(err, store.ErrLost) || !strings.Contains(err.Error(), "lease expired") {
		t.Fatalf("renew of a revoked lease: %v, want lost: lease expired", err)
	}
	// Retried as a failed request, it would have asked again until the
	// request's budget ran out.
	if got := answers.Load(); got != 1 {
		t.Errorf("lost after %d keep-alive answers: want it at the first", got)
	}
	if _, err := st.Renew(ctx, keep, 30*time.Second); err != nil {
		t.Errorf("another ticket's renewal after the loss: %v", err)
	}
}

// TestRenewThroughABrokenStream: the connection under the keep-alive
// stream is dropped while renewals wait on it (their requests held by a
// stalled proxy): each sends again on a new stream and succeeds, well
// within its budget. Many renewals of one handle wait on it at once.
func TestRenewThroughABrokenStream(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := etcdtest.NewProxy(t, srv.Endpoint)
	st := openAt(t, []*etcdtest.Proxy{p}, etcdstore.Options{})
	ctx := context.Background()
	var tks []store.Ticket
	for _, id := range []string{"b1", "b2", "b3", "b4", "b5", "b6"} {
		tk, err := st.Enqueue(ctx, req(id, "broken", 1, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Renew(ctx, tk, 30*time.Second); err != nil { // the stream is open
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	p.Stall(true)
	var wg sync.WaitGroup
	errs := make([]error, len(tks))
	took := make([]time.Duration, len(tks))
	for i, tk := range tks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = st.Renew(ctx, tk, 30*time.Second)
			took[i] = time.Since(start)
		}()
	}
	time.Sleep(300 * time.Millisecond) // sent, waiting on the stream
	p.Cut()
	wg.Wait()
	attempt := etcdstore.AttemptTimeout(5 * time.Second)
	for i, err := range errs {
		if err != nil {
			t.Errorf("renew %s through a dropped connection: %v", tks[i].ID, err)
		} else if took[i] >= attempt {
			t.Errorf("renew %s took %v: want it sent again when the stream broke, not at its attempt's timeout (%v)", tks[i].ID, took[i], attempt)
		}
	}
}

// TestReleaseAfterTheServerEndedTheLease: a ticket whose lease the server
// ended (revoked here; expired alike) is refused its renewal, yet its
// record stays, shown with nothing left, until a step settles its limits;
// its holder's release removes that record, once, as a release at the
// deadline does on every store (the simulation's model counts on it).
func TestReleaseAfterTheServerEndedTheLease(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	r := req("e1", "ended", 1, 30*time.Second)
	r.Limits = []string{"ended", "other"}
	tk, err := st.Enqueue(ctx, r)
	if err != nil || tk.State != store.Held {
		t.Fatalf("enqueue: %+v, %v", tk, err)
	}
	revokeBehind(t, []*clientv3.Client{raw(t, srv)}, "/"+t.Name(), tk)
	if _, err := st.Renew(ctx, tk, 30*time.Second); !errors.Is(err, store.ErrLost) {
		t.Fatalf("renewal after the lease ended: %v, want lost", err)
	}
	snap, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Tickets) != 2 {
		t.Fatalf("the snapshot after the lease ended lists %d views, want e1's record under both limits", len(snap.Tickets))
	}
	for _, v := range snap.Tickets {
		if v.ID != "e1" || v.Remaining != 0 {
			t.Fatalf("the snapshot after the lease ended shows %s under %s with %v left", v.ID, v.Limit, v.Remaining)
		}
	}
	if removed, err := st.Release(ctx, tk, store.Lost); err != nil || !removed {
		t.Fatalf("release of the record left: removed %v, %v; want removed", removed, err)
	}
	if removed, err := st.Release(ctx, tk, store.Lost); err != nil || removed {
		t.Fatalf("a second release: removed %v, %v; want not removed", removed, err)
	}
	if snap, err := st.Snapshot(ctx); err != nil || len(snap.Tickets) != 0 {
		t.Fatalf("the snapshot after the release: %+v, %v", snap.Tickets, err)
	}
}
