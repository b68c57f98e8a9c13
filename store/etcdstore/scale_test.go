package etcdstore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// received counts the bytes of the unary answers a handle receives.
func received() (grpc.DialOption, *atomic.Int64) {
	var n atomic.Int64
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if m, ok := reply.(proto.Message); ok && err == nil {
			n.Add(int64(proto.Size(m)))
		}
		return err
	}), &n
}

// scaleWaiters is the queue length of the scale tests: SLOTCTL_SCALE_WAITERS,
// else def.
func scaleWaiters(t *testing.T, def int) int {
	if v := os.Getenv("SLOTCTL_SCALE_WAITERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 8 {
			t.Fatalf("SLOTCTL_SCALE_WAITERS=%q: want a number of at least 8", v)
		}
		return n
	}
	if raceEnabled {
		// The race detector slows every round trip several times: a
		// queue of def waiters at once then measures the detector, not
		// the store (300 cancels at once: a third ran out of their 5 s).
		return max(def/4, 8)
	}
	return def
}

// fill enqueues n waiters behind one holder of limit (slots 1), 16 at once.
func fill(t *testing.T, st *etcdstore.Store, limit string, from, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := from; i < from+n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := st.Enqueue(context.Background(), req(fmt.Sprintf("w%05d", i), limit, 1, time.Minute)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestWaiterCostIndependentOfQueue: what a waiter far back in the queue
// receives when it joins, while it waits (its bell) and when it is
// cancelled does not grow with the queue. Before light.go its bell read the whole limit (every
// record) at each wake, and its cancel read it again: 1,594 waiters
// cancelled at once each read 1,594 records, and none finished within its
// 5s. The same waiter is measured behind a short and a 4x longer queue.
func TestWaiterCostIndependentOfQueue(t *testing.T) {
	longtest.Skip(t, "a scale test: hundreds of waiters")
	srv := etcdtest.Start(t, etcdtest.Options{})
	long := scaleWaiters(t, 400)
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	if _, err := st.Enqueue(ctx, req("holder", "q", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	measure := func(id string) (enqueue, bell, cancel int64) {
		count, n := received()
		w := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{count}, Prefix: "/" + t.Name()})
		tk, err := w.Enqueue(ctx, req(id, "q", 1, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		enqueue = n.Load()
		start := n.Load()
		b, err := w.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // the bell reads and settles to watching
		bell = n.Load() - start
		start = n.Load()
		if removed, err := w.Cancel(ctx, tk); err != nil || !removed {
			t.Fatalf("cancel %s = %v, %v", id, removed, err)
		}
		cancel = n.Load() - start
		b.Close()
		return enqueue, bell, cancel
	}
	fill(t, st, "q", 0, long/4)
	shortEnqueue, shortBell, shortCancel := measure("m-short")
	fill(t, st, "q", long/4, long-long/4)
	longEnqueue, longBell, longCancel := measure("m-long")
	t.Logf("waiter behind %d: enqueue %d B, bell %d B, cancel %d B; behind %d: enqueue %d B, bell %d B, cancel %d B",
		long/4, shortEnqueue, shortBell, shortCancel, long, longEnqueue, longBell, longCancel)
	if longEnqueue > 2*shortEnqueue+4096 {
		t.Errorf("an enqueue received %d bytes behind %d waiters, %d behind %d: want it independent of the queue", longEnqueue, long, shortEnqueue, long/4)
	}
	if longBell > 2*shortBell+4096 {
		t.Errorf("a waiter's bell received %d bytes behind %d waiters, %d behind %d: want it independent of the queue", longBell, long, shortBell, long/4)
	}
	if longCancel > 2*shortCancel+4096 {
		t.Errorf("a waiter's cancel received %d bytes behind %d waiters, %d behind %d: want it independent of the queue", longCancel, long, shortCancel, long/4)
	}
}

// TestMassCancel: every waiter of a long queue cancelled at once (each its
// own handle, as each is its own slotctl process, each with slotctl run's
// 5s budget) removes its ticket.
func TestMassCancel(t *testing.T) {
	longtest.Skip(t, "a scale test: hundreds of handles")
	srv := etcdtest.Start(t, etcdtest.Options{})
	n := scaleWaiters(t, 300)
	ctx := context.Background()
	st := open(t, srv, etcdstore.Options{})
	if _, err := st.Enqueue(ctx, req("holder", "mass", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	type waiter struct {
		st *etcdstore.Store
		t  store.Ticket
	}
	ws := make([]waiter, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range ws {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			h, err := etcdstore.New(etcdstore.Options{Endpoints: []string{srv.Endpoint}, Prefix: "/" + t.Name()})
			if err != nil {
				t.Error(err)
				return
			}
			tk, err := h.Enqueue(ctx, req(fmt.Sprintf("c%05d", i), "mass", 1, time.Minute))
			if err != nil {
				t.Error(err)
			}
			ws[i] = waiter{h, tk}
		}()
	}
	wg.Wait()
	defer func() {
		for _, w := range ws {
			if w.st != nil {
				w.st.Close()
			}
		}
	}()
	if t.Failed() {
		return
	}
	start := time.Now()
	var failed atomic.Int32
	var firstErr atomic.Value
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if removed, err := w.st.Cancel(cctx, w.t); err != nil || !removed {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("%v, %v", removed, err))
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	snap, err := st.Snapshot(ctx, "mass")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d waiters cancelled at once in %v; %d failed; %d tickets left", n, took.Round(time.Millisecond), failed.Load(), len(snap.Tickets))
	if failed.Load() > 0 {
		t.Errorf("%d of %d cancels failed, first: %v", failed.Load(), n, firstErr.Load())
	}
	if len(snap.Tickets) != 1 {
		t.Errorf("%d tickets left, want the holder's only", len(snap.Tickets))
	}
}

// TestEnqueueBurst: a burst of enqueues into a long queue, each from a
// handle of its own (as each is its own slotctl process, connecting),
// all at once: none fails.
func TestEnqueueBurst(t *testing.T) {
	longtest.Skip(t, "a scale test: hundreds of handles")
	srv := etcdtest.Start(t, etcdtest.Options{})
	n := scaleWaiters(t, 400)
	burst := max(n/4, 8)
	ctx := context.Background()
	st := open(t, srv, etcdstore.Options{})
	if _, err := st.Enqueue(ctx, req("holder", "burst", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	fill(t, st, "burst", 0, n)
	var wg sync.WaitGroup
	var failed atomic.Int32
	var firstErr atomic.Value
	var slowest atomic.Int64
	start := time.Now()
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := etcdstore.New(etcdstore.Options{Endpoints: []string{srv.Endpoint}, Prefix: "/" + t.Name()})
			if err != nil {
				t.Error(err)
				return
			}
			defer h.Close()
			t0 := time.Now()
			if _, err := h.Enqueue(ctx, req(fmt.Sprintf("b%05d", i), "burst", 1, time.Minute)); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
			if d := int64(time.Since(t0)); d > slowest.Load() {
				slowest.Store(d)
			}
		}()
	}
	wg.Wait()
	t.Logf("burst of %d enqueues into a queue of %d: %v, slowest %v, %d failed", burst, n, time.Since(start).Round(time.Millisecond),
		time.Duration(slowest.Load()).Round(time.Millisecond), failed.Load())
	if failed.Load() > 0 {
		t.Errorf("%d of %d enqueues failed, first: %v", failed.Load(), burst, firstErr.Load())
	}
}
