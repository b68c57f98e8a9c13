package etcdstore_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		url       string
		endpoints []string
		prefix    string
	}{
		{"etcd://127.0.0.1:2379", []string{"127.0.0.1:2379"}, "/slotctl"},
		{"etcd://a:1,B:2/", []string{"a:1", "b:2"}, "/slotctl"},
		{"etcd://[::1]:2379/x/y/", []string{"[::1]:2379"}, "/x/y"},
		{"etcd://h:2379//team//slots", []string{"h:2379"}, "/team/slots"},
	} {
		eps, prefix, err := etcdstore.ParseURL(c.url)
		if err != nil || strings.Join(eps, " ") != strings.Join(c.endpoints, " ") || prefix != c.prefix {
			t.Errorf("ParseURL(%q) = %q, %q, %v; want %q, %q", c.url, eps, prefix, err, c.endpoints, c.prefix)
		}
	}
	for _, bad := range []string{"etcd://", "etcd:///p", "etcd://h", "etcd://h:0", "etcd://h:x", "etcd://:1",
		"etcd://u:p@h:1", "etcd://h:1?tls=1", "etcd://h:1/a b", "etcd://h:1/../x", "bolt://h:1"} {
		if eps, p, err := etcdstore.ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) = %q, %q; want an error", bad, eps, p)
		}
	}
	st, err := etcdstore.New(etcdstore.Options{Endpoints: []string{"h1:2379", "h2:2379"}, Prefix: "team/"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.String(); got != "etcd://h1:2379,h2:2379/team" {
		t.Errorf("String() = %q", got)
	}
}

func open(t *testing.T, srv *etcdtest.Server, o etcdstore.Options) *etcdstore.Store {
	t.Helper()
	o.Endpoints = []string{srv.Endpoint}
	if o.Prefix == "" {
		o.Prefix = "/" + strings.ReplaceAll(t.Name(), "/", "_")
	}
	st, err := etcdstore.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func req(id, limit string, slots int, ttl time.Duration) store.EnqueueRequest {
	return store.EnqueueRequest{ID: id, Limit: limit, Slots: slots, TTL: ttl,
		Holder: store.Holder{Host: "etcdstore.invalid", Pid: 1, Argv: []string{id}}}
}

// loseAnswers makes the gRPC connection drop the answer (after the server
// applied the request) of the first transaction that lose picks.
func loseAnswers(lose func(*pb.TxnRequest) bool) (grpc.DialOption, *atomic.Int32) {
	l := &loser{}
	l.arm(func(req any) bool {
		tr, ok := req.(*pb.TxnRequest)
		return ok && lose(tr)
	})
	return l.option(), &l.lost
}

// writes reports whether a transaction would put or delete a key containing part.
func writes(tr *pb.TxnRequest, part string, put bool) bool {
	for _, op := range tr.Success {
		if p := op.GetRequestPut(); p != nil && put && strings.Contains(string(p.Key), part) {
			return true
		}
		if d := op.GetRequestDeleteRange(); d != nil && !put && strings.Contains(string(d.Key), part) {
			return true
		}
	}
	return false
}

// A create whose answer is lost is retried and finds its own ticket: one
// ticket, not two; a release whose answer is lost frees one slot, once.
func TestLostAnswerIsRetriedOnce(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	dropCreate, lostCreate := loseAnswers(func(tr *pb.TxnRequest) bool { return writes(tr, "/ids/a", true) })
	st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{dropCreate}, Prefix: "/lost"})
	a, err := st.Enqueue(ctx, req("a", "l", 1, 5*time.Second))
	if err != nil {
		t.Fatalf("Enqueue A with its answer lost: %v", err)
	}
	if lostCreate.Load() != 1 {
		t.Fatalf("the test lost %d answers, want 1", lostCreate.Load())
	}
	if a.State != store.Held {
		t.Fatalf("A: %s, want held", a.State)
	}
	b, err := st.Enqueue(ctx, req("b", "l", 1, 5*time.Second))
	if err != nil || b.State != store.Waiting {
		t.Fatalf("Enqueue B: %+v, %v; want waiting", b, err)
	}
	sn, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(sn.Tickets) != 2 || sn.Tickets[0].ID != "a" || sn.Tickets[0].Fence != a.Fence {
		t.Fatalf("snapshot after a lost create: %+v, want A (fence %d) and B once each", sn.Tickets, a.Fence)
	}

	dropRelease, lostRelease := loseAnswers(func(tr *pb.TxnRequest) bool { return writes(tr, "/tickets/l/a", false) })
	st2 := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{dropRelease}, Prefix: "/lost"})
	ok, err := st2.Release(ctx, a, store.Released)
	if err != nil || !ok || lostRelease.Load() != 1 {
		t.Fatalf("Release A with its answer lost: %v, %v (lost %d); want true", ok, err, lostRelease.Load())
	}
	if ok, err := st2.Release(ctx, a, store.Released); err != nil || ok {
		t.Fatalf("Release A again: %v, %v; want false", ok, err)
	}
	got, err := st.Get(ctx, "b")
	if err != nil || got.State != store.Held {
		t.Fatalf("B after A's release: %+v, %v; want held", got, err)
	}
	c, err := st.Enqueue(ctx, req("c", "l", 1, 5*time.Second))
	if err != nil || c.State != store.Waiting {
		t.Fatalf("C: %+v, %v; want waiting behind B (one slot, freed once)", c, err)
	}
	evs, err := st.Events(ctx, "l", 100)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, e.Kind+" "+e.Ticket)
	}
	if want := "admitted a,released a,admitted b"; strings.Join(kinds, ",") != want {
		t.Fatalf("events %q, want %q", kinds, want)
	}
}

// A release wakes the waiter it promotes, not the queue: of twenty bells,
// one rings.
func TestReleaseRingsOneBell(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	st := open(t, srv, etcdstore.Options{})
	h, err := st.Enqueue(ctx, req("holder", "q", 1, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var bells []store.Bell
	for i := range 20 {
		id := fmt.Sprintf("w%02d", i)
		b, err := st.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if _, err := st.Enqueue(ctx, req(id, "q", 1, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		bells = append(bells, b)
	}
	settle(bells...)
	if _, err := st.Release(ctx, h, store.Released); err != nil {
		t.Fatal(err)
	}
	if !rings(bells[0]) {
		t.Fatal("the promoted waiter's bell did not ring")
	}
	time.Sleep(300 * time.Millisecond)
	for i, b := range bells[1:] {
		select {
		case <-b.C():
			t.Errorf("waiter w%02d's bell rang; only the promoted w00's should", i+1)
		default:
		}
	}
	if got, err := st.Get(ctx, "w00"); err != nil || got.State != store.Held {
		t.Fatalf("w00: %+v, %v; want held", got, err)
	}
}

// When a holder's lease expires nobody writes; the waiter that must
// outlast it sees its key go, settles the limit, and is admitted, without
// a reap or a renewal.
func TestExpiryAdmitsWaiterWithoutWriters(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	st := open(t, srv, etcdstore.Options{})
	h1, _ := st.Enqueue(ctx, req("h1", "x", 2, 2*time.Second))
	h2, _ := st.Enqueue(ctx, req("h2", "x", 2, 30*time.Second))
	if h1.State != store.Held || h2.State != store.Held {
		t.Fatalf("h1 %s, h2 %s; want both held", h1.State, h2.State)
	}
	bell, err := st.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	w, err := st.Enqueue(ctx, req("w", "x", 2, 30*time.Second))
	if err != nil || w.State != store.Waiting {
		t.Fatalf("w: %+v, %v; want waiting", w, err)
	}
	start := time.Now()
	for {
		select {
		case <-bell.C():
		case <-time.After(5 * time.Second):
			t.Fatalf("no ring %s after h1's 2s lease was due", time.Since(start))
		}
		got, err := st.Get(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		if got.State == store.Held {
			if got.Slot != h1.Slot {
				t.Errorf("w holds slot %d, want h1's %d", got.Slot, h1.Slot)
			}
			t.Logf("admitted %s after enqueue (h1's lease: 2s)", time.Since(start).Round(time.Millisecond))
			break
		}
	}
	if el := time.Since(start); el < 1500*time.Millisecond || el > 4*time.Second {
		t.Errorf("admitted after %s, want about h1's TTL (2s)", el)
	}
}

// An unreachable cluster is ErrUnavailable within the dial timeout, naming
// the endpoints; later calls of the same handle fail at once.
func TestUnreachable(t *testing.T) {
	// A dial timeout long enough that a loaded machine's scheduling delays
	// are small beside it: the bounds below tell "waited for the dial"
	// from "dialled again" and from "never gave up".
	st, err := etcdstore.New(etcdstore.Options{Endpoints: []string{"127.0.0.1:1", "127.0.0.1:2"}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	start := time.Now()
	_, err = st.Enqueue(context.Background(), req("a", "l", 1, 5*time.Second))
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "127.0.0.1:1, 127.0.0.1:2") {
		t.Fatalf("Enqueue: %v; want ErrUnavailable naming both endpoints", err)
	}
	if el := time.Since(start); el > 6*time.Second {
		t.Errorf("Enqueue failed after %s, want about the 2s dial timeout", el)
	}
	start = time.Now()
	if _, err := st.Release(context.Background(), store.Ticket{ID: "a"}, store.Cancelled); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Release: %v; want ErrUnavailable", err)
	}
	if el := time.Since(start); el > time.Second { // under the 2s dial timeout: not dialled again
		t.Errorf("a second call waited %s; want it to fail at once", el)
	}
}

// Over TLS with a client certificate, and with auth on: the store works
// with the right credentials under its prefix, and names the cluster when
// they are wrong.
func TestTLSAndAuth(t *testing.T) {
	certs := etcdtest.WriteCerts(t, t.TempDir())
	certs.ClientCertAuth = true
	srv := etcdtest.Start(t, etcdtest.Options{TLS: certs})
	tlsConfig := func() *tls.Config { return certs.ClientConfig(t) }
	srv.EnableAuth("alice", "s3cret", "/team/", tlsConfig())
	ctx := context.Background()

	st := open(t, srv, etcdstore.Options{Prefix: "/team/slots", TLS: tlsConfig(), Username: "alice", Password: "s3cret"})
	a, err := st.Enqueue(ctx, req("a", "l", 1, 3*time.Second))
	if err != nil || a.State != store.Held {
		t.Fatalf("Enqueue over TLS with auth: %+v, %v", a, err)
	}
	if _, err := st.Renew(ctx, a, 3*time.Second); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	// Another process (no knowledge of the lease) asks the server for it.
	other0 := open(t, srv, etcdstore.Options{Prefix: "/team/slots", TLS: tlsConfig(), Username: "alice", Password: "s3cret"})
	if sn, err := other0.Snapshot(ctx); err != nil || len(sn.Tickets) != 1 || sn.Tickets[0].Remaining < time.Second {
		t.Fatalf("Snapshot from another handle: %+v, %v; want A with its lease", sn, err)
	}
	if ok, err := st.Release(ctx, a, store.Released); !ok || err != nil {
		t.Fatalf("Release: %v, %v", ok, err)
	}
	if rm, err := st.Reap(ctx, store.ReapOptions{}); err != nil || len(rm) != 0 {
		t.Fatalf("Reap: %v, %v", rm, err)
	}

	// Wrong password, and a prefix outside the user's keys.
	_, err = etcdstore.New(etcdstore.Options{Endpoints: []string{srv.Endpoint}, TLS: tlsConfig(), Username: "alice", Password: "wrong", DialTimeout: 2 * time.Second})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "credentials") || !strings.Contains(err.Error(), srv.Endpoint) {
		t.Errorf("wrong password: %v; want ErrUnavailable naming the cluster and the credentials", err)
	}
	other := open(t, srv, etcdstore.Options{Prefix: "/elsewhere", TLS: tlsConfig(), Username: "alice", Password: "s3cret"})
	if _, err := other.Enqueue(ctx, req("b", "l", 1, 3*time.Second)); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("Enqueue outside the user's prefix: %v; want ErrUnavailable saying permission denied", err)
	}
	// No client certificate: the handshake fails, within the dial timeout.
	noCert := tlsConfig()
	noCert.Certificates = nil
	bare := open(t, srv, etcdstore.Options{Prefix: "/team/slots", TLS: noCert, DialTimeout: 500 * time.Millisecond})
	start := time.Now()
	if _, err := bare.Snapshot(ctx); !errors.Is(err, store.ErrUnavailable) || time.Since(start) > 2*time.Second {
		t.Errorf("without a client certificate: %v after %s; want ErrUnavailable within the dial timeout", err, time.Since(start))
	}
}

// A bell made on one handle rings for a ticket enqueued through another
// (it finds the ticket's limit in the store).
func TestBellOfAnotherHandle(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	a := open(t, srv, etcdstore.Options{Prefix: "/bells"})
	b := open(t, srv, etcdstore.Options{Prefix: "/bells"})
	h, err := b.Enqueue(ctx, req("h", "q", 1, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	bell, err := a.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	if w, err := b.Enqueue(ctx, req("w", "q", 1, 10*time.Second)); err != nil || w.State != store.Waiting {
		t.Fatalf("w: %+v, %v", w, err)
	}
	time.Sleep(500 * time.Millisecond) // past the bell's wait for a same-handle Enqueue
	for len(bell.C()) > 0 {
		<-bell.C()
	}
	if _, err := b.Release(ctx, h, store.Released); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bell.C():
	case <-time.After(5 * time.Second):
		t.Fatal("the bell did not ring when w was promoted")
	}
}

// countCalls counts the unary gRPC calls (reads, transactions, lease calls)
// a handle makes.
func countCalls() (grpc.DialOption, *atomic.Int32) {
	var n atomic.Int32
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}), &n
}

// The handoff's critical path is one commit and one watch event: the
// promoted waiter's Get answers from the event its bell saw, without a
// request of its own; once only, so that a later Get sees later changes.
func TestPromotionSeenByBellAnswersGet(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	holders := open(t, srv, etcdstore.Options{Prefix: "/handoff"})
	count, calls := countCalls()
	waiter := open(t, srv, etcdstore.Options{Prefix: "/handoff", DialOptions: []grpc.DialOption{count}})
	for round, limit := range []string{"head", "behind"} {
		h, err := holders.Enqueue(ctx, req("h-"+limit, limit, 1, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var ahead store.Ticket
		if limit == "behind" {
			// Behind another waiter: the bell watches that waiter's key,
			// and its own, which the release's commit rewrites.
			if ahead, err = holders.Enqueue(ctx, req("a-"+limit, limit, 1, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		id := fmt.Sprintf("w%d", round)
		bell, err := waiter.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer bell.Close()
		if w, err := waiter.Enqueue(ctx, req(id, limit, 1, 10*time.Second)); err != nil || w.State != store.Waiting {
			t.Fatalf("%s: %+v, %v; want waiting", id, w, err)
		}
		if limit == "behind" {
			if _, err := holders.Release(ctx, ahead, store.Cancelled); err != nil {
				t.Fatal(err)
			}
		}
		settle(bell)
		if _, err := holders.Release(ctx, h, store.Released); err != nil {
			t.Fatal(err)
		}
		if !rings(bell) {
			t.Fatalf("%s: the promoted waiter's bell did not ring", limit)
		}
		before := calls.Load()
		got, err := waiter.Get(ctx, id)
		if err != nil || got.State != store.Held || got.Slot != 0 || got.Remaining <= 0 {
			t.Fatalf("%s: Get after the ring: %+v, %v; want held on slot 0 with its lease", limit, got, err)
		}
		if n := calls.Load() - before; n != 0 {
			t.Errorf("%s: Get after the ring made %d requests; want none (the watch event showed the promotion)", limit, n)
		}
		// An operator removes it: the next Get reads, and says so.
		if ok, err := holders.Release(ctx, got, store.ForceReleased); !ok || err != nil {
			t.Fatalf("%s: force release: %v, %v", limit, ok, err)
		}
		if got, err := waiter.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: Get after a force release: %+v, %v; want ErrNotFound", limit, got, err)
		}
	}
}

// settle lets bells settle on their keys, then drops what they rang so far.
func settle(bells ...store.Bell) {
	time.Sleep(300 * time.Millisecond)
	for _, b := range bells {
		select {
		case <-b.C():
		default:
		}
	}
}

// rings waits up to 5s for b to ring.
func rings(b store.Bell) bool {
	select {
	case <-b.C():
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

// Renew on etcd keeps the lease's granted TTL (store.Store.Renew's doc):
// the ttl argument is checked, not applied. A renewal asking for an hour
// still leaves the ticket the 3s it was enqueued with, and the server
// expires it then.
func TestRenewKeepsGrantedTTL(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	a, err := st.Enqueue(ctx, req("a", "l", 1, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Renew(ctx, a, 0); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Renew with ttl 0: %v, want ErrInvalid", err)
	}
	got, err := st.Renew(ctx, a, time.Hour)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if got.TTL != 3*time.Second || got.Remaining > 3*time.Second || got.Remaining < time.Second {
		t.Fatalf("Renew(ttl 1h) of a 3s ticket: TTL %v, remaining %v; want the granted 3s kept", got.TTL, got.Remaining)
	}
	srv.Advance(4 * time.Second)
	if _, err := st.Renew(ctx, a, time.Hour); !errors.Is(err, store.ErrLost) {
		t.Fatalf("Renew 4s after a renewal asking for 1h: %v, want ErrLost (the lease kept its 3s)", err)
	}
}

// Close stops the watches of the bells still open: their goroutines end
// at once instead of retrying, once a second, on a closed client until
// each bell's own Close.
func TestCloseStopsBells(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	if _, err := st.Enqueue(ctx, req("a", "l", 1, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	bell, err := st.Watch(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	if b, err := st.Enqueue(ctx, req("b", "l", 1, 5*time.Second)); err != nil || b.State != store.Waiting {
		t.Fatalf("Enqueue b: %+v, %v; want it waiting behind a", b, err)
	}
	time.Sleep(300 * time.Millisecond) // the bell follows b's place in the queue
	select {
	case <-etcdstore.BellDone(bell):
		t.Fatal("the bell of a waiting ticket stopped before Close")
	default:
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-etcdstore.BellDone(bell):
	case <-time.After(3 * time.Second):
		t.Fatal("a bell's goroutine still runs 3s after the store's Close")
	}
}
