package etcdstore

// One keep-alive stream per Store, shared by every renewal.
//
// clientv3's KeepAliveOnce opens a gRPC stream, sends one request, reads
// one answer and closes it: about 130 system calls per renewal, the most
// of what an idle waiter costs. Here a renewal is one message each way on
// a stream that stays open.
//
// The server reads a stream's requests one at a time and answers each
// before it reads the next (v3rpc's leaseKeepAlive), so the answers to one
// lease's requests come back in the order they were sent: each goes to
// the oldest caller still waiting on that lease. A caller that gave up
// keeps its place in that line until its answer comes: an answer must
// never be taken for a later request, whose send time (what the holder
// fences on) is later than the renewal the answer is for.
//
// keepAliveOnce (failover.go) keeps its attempts: an attempt that times
// out closes the stream and sets its member aside, and the next attempt
// opens a stream to another member; a stream that fails (its member set
// aside, its connection lost) fails the callers waiting on it, who send
// again on a new stream within their attempt, as KeepAliveOnce did.

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// errStreamClosed ends a keep-alive stream this handle closed (an attempt
// on it timed out, or its member answered at a stale term): the callers
// waiting on it send again.
var errStreamClosed = status.Error(codes.Unavailable, "keep-alive stream closed by the client")

// kaStreams holds the keep-alive stream of a Store, opening one when a
// renewal needs it.
type kaStreams struct {
	s    *Store
	open chan struct{} // a lock that a waiting caller can give up on (one token)

	mu  sync.Mutex
	cur *kaStream // nil or ended: the next renewal opens one
}

func newKAStreams(s *Store) *kaStreams {
	k := &kaStreams{s: s, open: make(chan struct{}, 1)}
	k.open <- struct{}{}
	return k
}

// kaStream is one LeaseKeepAlive stream and the callers waiting on it.
type kaStream struct {
	cs     pb.Lease_LeaseKeepAliveClient
	cancel context.CancelFunc
	ep     string // the endpoint of its member

	sendMu sync.Mutex // Send is not safe for concurrent use, and the line must be in send order

	mu      sync.Mutex
	waiting map[int64][]chan *pb.LeaseKeepAliveResponse // lease -> callers, in send order
	err     error                                       // why it ended
	done    chan struct{}                               // closed when it ended
}

// get returns the open stream, opening one if there is none. It gives up
// when ctx ends.
func (k *kaStreams) get(ctx context.Context) (*kaStream, error) {
	k.mu.Lock()
	cur := k.cur
	k.mu.Unlock()
	if cur.live() {
		return cur, nil
	}
	select {
	case <-k.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { k.open <- struct{}{} }()
	k.mu.Lock()
	cur = k.cur
	k.mu.Unlock()
	if cur.live() { // another caller opened it meanwhile
		return cur, nil
	}
	// The stream outlives the attempt that opens it (until the client
	// closes); the attempt bounds only the wait for a connection.
	sctx, cancel := context.WithCancel(k.s.c.Ctx())
	var p peer.Peer
	stop := context.AfterFunc(ctx, cancel)
	cs, err := pb.NewLeaseClient(k.s.c.ActiveConnection()).LeaseKeepAlive(context.WithValue(sctx, peerKey{}, &p), grpc.WaitForReady(true))
	if !stop() {
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, clientv3.ContextError(ctx, err)
	}
	st := &kaStream{cs: cs, cancel: cancel, ep: k.s.fo.endpointOf(&p),
		waiting: map[int64][]chan *pb.LeaseKeepAliveResponse{}, done: make(chan struct{})}
	go st.recv()
	k.mu.Lock()
	k.cur = st
	k.mu.Unlock()
	return st, nil
}

func (st *kaStream) live() bool {
	if st == nil {
		return false
	}
	select {
	case <-st.done:
		return false
	default:
		return true
	}
}

// recv hands each answer to the caller first in its lease's line, until
// the stream ends.
func (st *kaStream) recv() {
	for {
		resp, err := st.cs.Recv()
		if err != nil {
			st.end(err)
			return
		}
		st.mu.Lock()
		line := st.waiting[resp.ID]
		if len(line) == 0 {
			st.mu.Unlock()
			st.end(status.Errorf(codes.Internal, "keep-alive answer for lease %x, which was not asked on this stream", resp.ID))
			return
		}
		ch := line[0]
		if len(line) == 1 {
			delete(st.waiting, resp.ID)
		} else {
			st.waiting[resp.ID] = line[1:]
		}
		st.mu.Unlock()
		ch <- resp // buffered: a caller that gave up does not block the others
	}
}

// end closes the stream for err (the first reason wins); its waiting
// callers see it ended.
func (st *kaStream) end(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err != nil {
		return
	}
	st.err = err
	st.cancel()
	close(st.done)
}

// once sends one keep-alive of lease on the Store's stream and waits for
// its answer. On a stream that ends before it answers, it sends again on
// a new one (after a short pause) until ctx ends, as clientv3's
// KeepAliveOnce does, unless the stream's error says retrying cannot help.
// It returns the stream it was answered on (or last tried: nil if none
// opened) and the send time of the request answered.
func (k *kaStreams) once(ctx context.Context, lease int64) (*pb.LeaseKeepAliveResponse, time.Duration, *kaStream, error) {
	var last *kaStream
	for {
		st, err := k.get(ctx)
		if err != nil {
			return nil, 0, last, err
		}
		last = st
		sent := k.s.leases.now()
		resp, err := st.ask(ctx, lease)
		if err == nil {
			return resp, sent, st, nil
		}
		if isHaltErr(ctx, err) {
			return nil, sent, st, clientv3.ContextError(ctx, err)
		}
		select {
		case <-time.After(time.Duration(10+rand.IntN(20)) * time.Millisecond):
		case <-ctx.Done():
			return nil, sent, st, clientv3.ContextError(ctx, err)
		}
	}
}

// ask sends one keep-alive on st and waits for its answer, the stream's
// end, or ctx's.
func (st *kaStream) ask(ctx context.Context, lease int64) (*pb.LeaseKeepAliveResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ch := make(chan *pb.LeaseKeepAliveResponse, 1)
	st.sendMu.Lock()
	st.mu.Lock()
	if st.err != nil {
		err := st.err
		st.mu.Unlock()
		st.sendMu.Unlock()
		return nil, err
	}
	st.waiting[lease] = append(st.waiting[lease], ch)
	st.mu.Unlock()
	// A Send held up by flow control (a member that stopped reading) must
	// not outlast the attempt: ending the stream unblocks it. The others
	// waiting on it send again (this caller's own end is not theirs).
	stop := context.AfterFunc(ctx, st.close)
	err := st.cs.Send(&pb.LeaseKeepAliveRequest{ID: lease})
	stop()
	st.sendMu.Unlock()
	if err != nil {
		// The stream has ended; Recv, in recv, has its real error.
		<-st.done
	}
	select {
	case resp := <-ch:
		return resp, nil
	case <-st.done:
		select {
		case resp := <-ch: // answered just before it ended
			return resp, nil
		default:
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		return nil, st.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// close ends st, if it is still open, so that the next attempt opens a
// stream to another member.
func (st *kaStream) close() {
	if st != nil {
		st.end(errStreamClosed)
	}
}

// endpoint is the endpoint of st's member, "" if unknown.
func (st *kaStream) endpoint() string {
	if st == nil {
		return ""
	}
	return st.ep
}

// isHaltErr reports whether a keep-alive that failed with err should not
// be sent again: ctx ended, or the error is not one of a member or
// connection that went away (as clientv3's isHaltErr).
func isHaltErr(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	c := status.Code(err)
	return c != codes.Unavailable && c != codes.Internal
}
