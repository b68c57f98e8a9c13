package etcdstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// keepAliveStreams counts the LeaseKeepAlive streams a handle opens and
// lets the test rewrite or hold each answer it receives.
func keepAliveStreams(answer func(*pb.LeaseKeepAliveResponse)) (grpc.DialOption, *atomic.Int32) {
	var opened atomic.Int32
	return grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
			return cs, err
		}
		opened.Add(1)
		return &heldStream{ClientStream: cs, answer: answer}, nil
	}), &opened
}

type heldStream struct {
	grpc.ClientStream
	answer func(*pb.LeaseKeepAliveResponse)
}

func (s *heldStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*pb.LeaseKeepAliveResponse); ok && err == nil && s.answer != nil {
		s.answer(r)
	}
	return err
}

func openInternal(t *testing.T, srv *etcdtest.Server, opts ...grpc.DialOption) *Store {
	t.Helper()
	s, err := New(Options{Endpoints: []string{srv.Endpoint}, Prefix: "/" + t.Name(), DialOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestKeepAlivesShareOneStreamEachItsOwnAnswer: many renewals at once, of
// leases of different TTLs, over one stream: each gets the answer for its
// own lease (its ID and its TTL), and the handle opens one stream for all
// of them, not one per renewal.
func TestKeepAlivesShareOneStreamEachItsOwnAnswer(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	count, opened := keepAliveStreams(nil)
	s := openInternal(t, srv, count)
	ctx := context.Background()
	const n = 40
	leases := make([]int64, n)
	for i := range n {
		g, err := s.c.Grant(ctx, int64(10+i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = int64(g.ID)
	}
	var wg sync.WaitGroup
	for round := range 5 {
		for i, id := range leases {
			for range 3 { // the same lease from several callers at once too
				wg.Add(1)
				go func() {
					defer wg.Done()
					ka, _, err := s.keepAliveOnce(ctx, id)
					if err != nil {
						t.Errorf("round %d: keep-alive of lease %x: %v", round, id, err)
						return
					}
					if int64(ka.ID) != id || ka.TTL != int64(10+i) {
						t.Errorf("round %d: keep-alive of lease %x (TTL %ds) answered with lease %x, TTL %ds", round, id, 10+i, int64(ka.ID), ka.TTL)
					}
				}()
			}
		}
		wg.Wait()
	}
	if got := opened.Load(); got != 1 {
		t.Errorf("%d keep-alive streams opened for %d renewals, want 1", got, 5*3*n)
	}
}

// TestKeepAliveOfACallerThatGaveUpIsNotAnothers: a caller that gives up
// waiting keeps its place in its lease's line, so the answer to its
// request does not go to the next caller of the same lease, who sent
// later (the holder fences on its own send time: an older renewal's
// answer would overstate its lease).
func TestKeepAliveOfACallerThatGaveUpIsNotAnothers(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	hold := make(chan struct{})
	var seq atomic.Int64
	tag := func(r *pb.LeaseKeepAliveResponse) {
		if seq.Add(1) == 1 {
			<-hold // the first answer comes only once its caller gave up
		}
		r.Header.Revision = -seq.Load() // which answer this is: -1, -2, ...
	}
	count, opened := keepAliveStreams(tag)
	s := openInternal(t, srv, count)
	ctx := context.Background()
	g, err := s.c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	first, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, _, _, err := s.ka.once(first, int64(g.ID)); err == nil {
		t.Fatal("the first keep-alive was answered while its answer was held")
	}
	done := make(chan *pb.LeaseKeepAliveResponse, 1)
	go func() {
		resp, _, _, err := s.ka.once(ctx, int64(g.ID))
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	time.Sleep(100 * time.Millisecond) // the second is sent, on the same stream
	close(hold)
	resp := <-done
	if resp == nil {
		return
	}
	if got := resp.Header.Revision; got != -2 {
		t.Errorf("the second keep-alive got answer %d, want the second (-2): the first caller's answer went to it", -got)
	}
	if got := opened.Load(); got != 1 {
		t.Errorf("%d streams opened, want 1 (a caller that gives up does not close the stream)", got)
	}
}

// TestKeepAliveTimedOutClosesItsStream: an attempt that times out closes
// the stream, and the next attempt opens another and is answered within
// the request's budget.
func TestKeepAliveTimedOutClosesItsStream(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	var stall atomic.Bool
	stalled := make(chan struct{})
	count, opened := keepAliveStreams(func(*pb.LeaseKeepAliveResponse) {
		if stall.CompareAndSwap(true, false) {
			<-stalled // this stream's member stopped answering
		}
	})
	s := openInternal(t, srv, count)
	defer close(stalled)
	ctx := context.Background()
	g, err := s.c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.keepAliveOnce(ctx, int64(g.ID)); err != nil {
		t.Fatal(err)
	}
	stall.Store(true)
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ka, _, err := s.keepAliveOnce(rctx, int64(g.ID))
	if err != nil {
		t.Fatalf("keep-alive with its stream stalled: %v", err)
	}
	if ka.TTL <= 0 {
		t.Fatalf("TTL %d", ka.TTL)
	}
	if got := opened.Load(); got != 2 {
		t.Errorf("%d streams opened, want 2: the stalled one closed, a new one for the next attempt", got)
	}
}

// TestKeepAliveStreamOnAStalledMemberFailsOver: the member under the
// keep-alive stream stalls; the renewal's attempt there times out, the
// member is set aside, and the next attempt is answered on a new stream
// to another member, within the budget.
func TestKeepAliveStreamOnAStalledMemberFailsOver(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	var eps []string
	proxies := map[string]*etcdtest.Proxy{}
	for range 3 {
		p := etcdtest.NewProxy(t, srv.Endpoint)
		eps = append(eps, p.Addr)
		proxies[p.Addr] = p
	}
	s, err := New(Options{Endpoints: eps, Prefix: "/" + t.Name(), RequestTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	g, err := s.c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.keepAliveOnce(ctx, int64(g.ID)); err != nil {
		t.Fatal(err)
	}
	s.ka.mu.Lock()
	first := s.ka.cur
	s.ka.mu.Unlock()
	p := proxies[first.endpoint()]
	if p == nil {
		t.Fatalf("the stream's endpoint %q is none of %v", first.endpoint(), eps)
	}
	p.Stall(true)
	defer p.Stall(false)
	// Within its budget: the stalled attempt ends at its own timeout, and
	// the next goes elsewhere (the whole budget on the stalled member
	// would be an error here).
	ka, _, err := s.keepAliveOnce(ctx, int64(g.ID))
	if err != nil {
		t.Fatalf("keep-alive with the stream's member stalled: %v", err)
	}
	if ka.TTL <= 0 {
		t.Fatalf("TTL %d", ka.TTL)
	}
	if q := s.Quarantined(); len(q) != 1 || q[0] != first.endpoint() {
		t.Errorf("quarantined %v, want [%s]", q, first.endpoint())
	}
	s.ka.mu.Lock()
	now := s.ka.cur
	s.ka.mu.Unlock()
	if now == first || now.endpoint() == first.endpoint() {
		t.Errorf("still on the stalled member's stream (%s)", now.endpoint())
	}
}
