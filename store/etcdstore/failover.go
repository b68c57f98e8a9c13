package etcdstore

// Failover inside the lease (docs/leases.md rule 15: a stalled replica is
// not a lost lease).
//
// The etcd client keeps a connection to every endpoint and spreads
// requests over them (gRPC round robin). A member that stops answering
// (SIGSTOP, a hung disk, a partition that keeps the TCP connection up)
// keeps its connection READY until gRPC's keepalive gives up on it (30 s
// + 3 s here; gRPC allows no less than 10 s + the timeout): longer than a
// short lease. Every request sent there meanwhile would hang for its whole
// budget, and a renewal's budget is what is left of the lease.
//
// So each request's budget (the caller's deadline, at most RequestTimeout)
// is split into attempts (attemptsPerRequest: the first gets a third of
// it, the next half of what is left, the last all of it), and:
//
//   - an attempt that times out sets its endpoint aside (quarantine): the
//     client's endpoints are set to the others (SetEndpoints), which closes
//     that connection, so the requests and watches on it fail over at once
//     (a watch resumes on another member from its revision), and the next
//     attempt goes to another member. The endpoint comes back after a pause
//     that doubles while it keeps failing (quarantineMin..quarantineMax); a
//     member still stalled then does not finish gRPC's handshake, so its new
//     connection never becomes READY and is not picked. The last endpoint is
//     never set aside.
//   - a request that is safe to repeat (a read, a grant) is sent again, to
//     another member, each time an attempt's timeout passes unanswered
//     (hedged: the earlier attempts go on, so that a member that is only
//     slow still answers within the budget, as before), and the first
//     answer wins; a keep-alive is tried again at its attempt's timeout,
//     on a new stream (keepalive.go); a write ends at it (its outcome is
//     unknown: the caller reads and plans again, which its compares make
//     safe: see unknownOutcome).
//
// A stalled member thus costs one attempt (a third of a request's budget)
// per quarantine, not every request's whole budget.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// attemptsPerRequest is how many attempts a request's budget is split into.
const attemptsPerRequest = 3

// minAttempt is the shortest attempt (unless less is left): a healthy
// member answers well within it.
const minAttempt = 100 * time.Millisecond

// quarantineMin and quarantineMax bound how long an endpoint whose attempt
// timed out is set aside.
const (
	quarantineMin = time.Second
	quarantineMax = 16 * time.Second
)

// attemptTimeout is the timeout of attempt i (0-based) of a request with
// left of its budget.
func attemptTimeout(left time.Duration, i int) time.Duration {
	n := max(attemptsPerRequest-i, 1)
	a := left / time.Duration(n)
	if a < minAttempt {
		a = min(minAttempt, left)
	}
	return a
}

// AttemptTimeout is the longest that one attempt of a request with budget
// waits for a member (the first attempt's timeout): what a stalled member
// costs a request before it fails over.
func AttemptTimeout(budget time.Duration) time.Duration { return attemptTimeout(budget, 0) }

// failover keeps the endpoints the client uses: all of them but those set
// aside after a timed-out attempt.
type failover struct {
	all []string
	c   *clientv3.Client // set once New has the client

	mu      sync.Mutex
	remote  map[string]string // a connection's remote address -> its endpoint
	out     map[string]time.Time
	strikes map[string]int
	timer   *time.Timer
	closed  bool
}

func newFailover(endpoints []string) *failover {
	return &failover{all: slices.Clone(endpoints), remote: map[string]string{}, out: map[string]time.Time{}, strikes: map[string]int{}}
}

// dial connects to an endpoint, noting which endpoint the connection's
// remote address is (a peer is known by its address; the endpoint may be a
// name).
func (f *failover) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.remote[conn.RemoteAddr().String()] = addr
	f.mu.Unlock()
	return conn, nil
}

// endpointOf is the endpoint of a peer, "" if unknown.
func (f *failover) endpointOf(p *peer.Peer) string {
	if p == nil || p.Addr == nil {
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.remote[p.Addr.String()]
}

// answered notes that an endpoint answered: its next quarantine is short again.
func (f *failover) answered(ep string) {
	if ep == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.strikes, ep)
}

// stalled sets an endpoint aside after an attempt on it timed out, unless
// it is the last one in use.
func (f *failover) stalled(ep string) {
	if ep == "" || len(f.all) < 2 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.out[ep]; ok || f.closed || len(f.out)+1 >= len(f.all) {
		return
	}
	d := quarantineMin << min(f.strikes[ep], 4)
	f.strikes[ep]++
	f.out[ep] = time.Now().Add(min(d, quarantineMax))
	f.applyLocked()
}

// applyLocked gives the client the endpoints not set aside, and arms the
// timer that brings the first of those back.
func (f *failover) applyLocked() {
	now := time.Now()
	var next time.Time
	for ep, until := range f.out {
		if !until.After(now) {
			delete(f.out, ep)
		} else if next.IsZero() || until.Before(next) {
			next = until
		}
	}
	var use []string
	for _, ep := range f.all {
		if _, ok := f.out[ep]; !ok {
			use = append(use, ep)
		}
	}
	if f.c != nil && !slices.Equal(use, f.c.Endpoints()) {
		f.c.SetEndpoints(use...)
	}
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	if !next.IsZero() {
		f.timer = time.AfterFunc(time.Until(next), func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if !f.closed {
				f.applyLocked()
			}
		})
	}
}

// Quarantined lists the endpoints set aside now (tests, and the operator's view).
func (s *Store) Quarantined() []string {
	f := s.fo
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, ep := range f.all {
		if _, ok := f.out[ep]; ok {
			out = append(out, ep)
		}
	}
	return out
}

func (f *failover) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.timer != nil {
		f.timer.Stop()
	}
}

// budget is what a request may still take: until ctx's deadline, or
// RequestTimeout without one.
func (s *Store) budget(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return s.o.RequestTimeout
}

// unary splits every unary request into attempts (see the file comment).
// A request that is safe to repeat is hedged (unaryHedged); a write's
// attempt ends at its timeout, and so does the request.
func (s *Store) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if repeatable(method, req) {
		return s.unaryHedged(ctx, method, req, reply, cc, invoker, opts...)
	}
	actx, cancel := context.WithTimeout(ctx, attemptTimeout(s.budget(ctx), 0))
	defer cancel()
	var p peer.Peer
	err := invoker(actx, method, req, reply, cc, append(slices.Clip(opts), grpc.Peer(&p))...)
	switch {
	case err == nil:
		s.fo.answered(s.fo.endpointOf(&p))
		s.sawTerm(reply)
	case errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		s.fo.stalled(s.fo.endpointOf(&p))
	}
	return err
}

// attempt is the outcome of one attempt of a hedged request.
type attempt struct {
	i     int
	reply any
	p     *peer.Peer
	err   error
}

// unaryHedged sends a request that is safe to repeat again, to another
// member, each time an attempt's timeout passes without an answer (at most
// attemptsPerRequest at once), and takes the first answer. An attempt is
// not cancelled at its timeout: a member that is only slow (a large read
// on a busy cluster) still answers within the request's budget, as
// before. The members of the attempts the answer overtook are set aside
// (failover): slower than another by an attempt's timeout at least, or
// stalled.
func (s *Store) unaryHedged(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	end := time.Now().Add(s.budget(ctx))
	actx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	// A caller's grpc.Peer is filled from the answer taken, never by the
	// attempts themselves: two of them would write it at once (go test -race).
	var callerPeers []*peer.Peer
	own := make([]grpc.CallOption, 0, len(opts)+1)
	for _, o := range opts {
		if pc, ok := o.(grpc.PeerCallOption); ok {
			callerPeers = append(callerPeers, pc.PeerAddr)
			continue
		}
		own = append(own, o)
	}
	opts = own
	results := make(chan attempt, attemptsPerRequest)
	start := func(i int) {
		r := reply
		if i > 0 { // its own answer: reply may still be written by the first
			r = reflect.New(reflect.TypeOf(reply).Elem()).Interface()
		}
		p := &peer.Peer{}
		go func() {
			err := invoker(actx, method, req, r, cc, append(slices.Clip(opts), grpc.Peer(p))...)
			results <- attempt{i, r, p, err}
		}()
	}
	started, pending := 1, 1
	start(0)
	next := time.NewTimer(attemptTimeout(time.Until(end), 0))
	defer next.Stop()
	var last error
	for {
		select {
		case <-next.C:
			if started < attemptsPerRequest && time.Until(end) > minAttempt {
				start(started)
				started++
				pending++
				next.Reset(attemptTimeout(time.Until(end), started-1))
			}
			continue
		case a := <-results:
			pending--
			if a.err != nil {
				last = a.err
				if errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
					s.fo.stalled(s.fo.endpointOf(a.p)) // no answer in the whole budget
				}
				if pending == 0 {
					return last
				}
				continue
			}
			s.fo.answered(s.fo.endpointOf(a.p))
			s.sawTerm(a.reply)
			cancel() // the others: their members were overtaken
			for range pending {
				if o := <-results; o.err != nil && o.i < a.i {
					s.fo.stalled(s.fo.endpointOf(o.p))
				}
			}
			if a.i != 0 { // the first attempt is over: reply is ours to write
				m, ok := reply.(proto.Message)
				if !ok {
					return fmt.Errorf("etcd store: %s answer of type %T", method, reply)
				}
				proto.Reset(m)
				proto.Merge(m, a.reply.(proto.Message))
			}
			for _, cp := range callerPeers {
				*cp = *a.p
			}
			return nil
		}
	}
}

// peerKey carries, in an attempt's context, where the stream interceptor
// notes the stream's peer.
type peerKey struct{}

// stream notes the peer of a stream opened by an attempt (the keep-alive
// stream, keepalive.go).
func (s *Store) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err == nil {
		if at, ok := ctx.Value(peerKey{}).(*peer.Peer); ok {
			if p, ok := peer.FromContext(cs.Context()); ok {
				*at = *p
			}
		}
	}
	return cs, err
}

// keepAliveOnce renews a lease once, in attempts within ctx's budget, on
// the Store's keep-alive stream (keepalive.go): a keep-alive is safe to
// repeat (the server restarts the lease from the one it gets last; the
// holder counts from its own send time, earlier). It returns the send time
// of the request that was answered.
func (s *Store) keepAliveOnce(ctx context.Context, lease int64) (*clientv3.LeaseKeepAliveResponse, time.Duration, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	end := time.Now().Add(s.budget(cctx))
	for i := 0; ; i++ {
		actx, acancel := context.WithTimeout(cctx, attemptTimeout(time.Until(end), i))
		resp, sent, st, err := s.ka.once(actx, lease)
		timedOut := err != nil && errors.Is(actx.Err(), context.DeadlineExceeded) && cctx.Err() == nil
		acancel()
		// The term first: a member behind the cluster's says nothing of
		// the lease, not even that it is gone (a resumed stale leader
		// revoked it in its own lessor only).
		if err == nil && s.staleTerm(resp.Header) {
			// A member behind the cluster's term answered: a leader that
			// was paused (SIGSTOP) and has not yet heard of its successor
			// renews the lease in its own lessor only, which the real
			// leader never sees. Not an ack: set it aside, try another
			// (on a new stream: this one goes to that member).
			st.close()
			s.fo.stalled(st.endpoint())
			if time.Until(end) <= minAttempt {
				return nil, sent, fmt.Errorf("keep-alive answered only by a member behind the cluster (raft term %d, the cluster's %d)", resp.Header.GetRaftTerm(), s.term.Load())
			}
			continue
		}
		if err == nil && resp.TTL <= 0 {
			return nil, sent, rpctypes.ErrLeaseNotFound // as clientv3's KeepAliveOnce
		}
		if err == nil {
			s.fo.answered(st.endpoint())
			s.sawHeader(resp.Header)
			return &clientv3.LeaseKeepAliveResponse{ResponseHeader: resp.Header, ID: clientv3.LeaseID(resp.ID), TTL: resp.TTL}, sent, nil
		}
		if !timedOut || time.Until(end) <= 0 {
			return nil, sent, err
		}
		st.close()
		s.fo.stalled(st.endpoint())
	}
}

// repeatable reports whether a request may be sent again when an attempt
// timed out: it changes nothing, or repeating it is harmless (an extra
// lease granted expires unused; a revoke of a revoked lease fails, and
// nobody reads that error).
func repeatable(method string, req any) bool {
	switch method {
	case "/etcdserverpb.KV/Range", "/etcdserverpb.Lease/LeaseTimeToLive", "/etcdserverpb.Lease/LeaseLeases",
		"/etcdserverpb.Lease/LeaseGrant", "/etcdserverpb.Lease/LeaseRevoke",
		"/etcdserverpb.Maintenance/Status", "/etcdserverpb.Cluster/MemberList", "/etcdserverpb.Auth/Authenticate":
		return true
	case "/etcdserverpb.KV/Txn":
		tr, ok := req.(*pb.TxnRequest)
		if !ok {
			return false
		}
		for _, ops := range [][]*pb.RequestOp{tr.Success, tr.Failure} {
			for _, op := range ops {
				if op.GetRequestRange() == nil {
					return false
				}
			}
		}
		return true
	}
	return false
}

// sawTerm notes the raft term of an answer (its header's), so that an
// answer from a member behind it can be told (staleTerm).
func (s *Store) sawTerm(reply any) {
	if h, ok := reply.(interface{ GetHeader() *pb.ResponseHeader }); ok {
		s.sawHeader(h.GetHeader())
	}
}

func (s *Store) sawHeader(h *pb.ResponseHeader) { s.sawRaftTerm(h.GetRaftTerm()) }

func (s *Store) sawRaftTerm(t uint64) {
	for {
		cur := s.term.Load()
		if t <= cur || s.term.CompareAndSwap(cur, t) {
			return
		}
	}
}

// staleTerm reports whether an answer comes from a member behind the
// highest raft term this handle has seen.
//
// etcd's leader confirms its leadership before it renews a lease, except
// when its raft loop ticked in the last three heartbeats (isActive in
// etcdserver's ensureLeadership): a leader that was stopped (SIGSTOP, a VM
// paused) ticks again the moment it resumes, before it hears of the
// leader elected meanwhile, and for those milliseconds renews leases in
// its own lessor only, answering with its old term. The cluster suite
// caught it: holders counted such acks, the real leader expired their
// leases, and their slots were handed on while their jobs ran.
func (s *Store) staleTerm(h *pb.ResponseHeader) bool {
	return h != nil && h.GetRaftTerm() < s.term.Load()
}

// again reports, after a write whose outcome is unknown (unknownOutcome),
// whether the step that began at start may read and try once more: its
// caller's deadline, or RequestTimeout from start without one, is not
// reached. It pauses a moment first (jittered), so that during an
// election the retries are spread over it rather than spent at once.
func (s *Store) again(ctx context.Context, start time.Time) bool {
	end := start.Add(s.o.RequestTimeout)
	if dl, ok := ctx.Deadline(); ok {
		end = dl
	}
	pause := time.Duration(20+rand.IntN(30)) * time.Millisecond
	if ctx.Err() != nil || time.Until(end) < pause+minAttempt {
		return false
	}
	select {
	case <-time.After(pause):
		return true
	case <-ctx.Done():
		return false
	}
}
