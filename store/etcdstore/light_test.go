package etcdstore_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// TestCancelBehindALeavingWaiterStaysLight: a waiter that leaves while the
// waiter just ahead of it leaves too (its removal's compare on that key
// fails) reads the new key ahead and removes itself again, without reading
// the queue: a crowd cancelled at once must not each settle the whole
// limit, every settle conflicting with the others (a mass cancel of 300
// took seconds, and some ran out of their budget).
func TestCancelBehindALeavingWaiterStaysLight(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	prefix := "/" + t.Name()
	other := open(t, srv, etcdstore.Options{Prefix: prefix})
	if _, err := other.Enqueue(ctx, req("h", "crowd", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Enqueue(ctx, req("w1", "crowd", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	w2, err := other.Enqueue(ctx, req("w2", "crowd", 1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	// On the leaving waiter's handle: w2 leaves just before w3's light
	// removal (the transaction whose Else reads w3's own key) is sent;
	// every read of the queue's records is counted.
	var armed atomic.Bool
	var queueReads, ahead atomic.Int32
	hook := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, rq, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !armed.Load() {
			return invoker(ctx, method, rq, reply, cc, opts...)
		}
		var ops []*pb.RequestOp
		switch r := rq.(type) {
		case *pb.TxnRequest:
			if len(r.Failure) == 1 && strings.HasSuffix(string(r.Failure[0].GetRequestRange().GetKey()), "/tickets/crowd/w3") && ahead.Add(1) == 1 {
				if removed, err := other.Cancel(ctx, w2); err != nil || !removed {
					t.Errorf("cancel of w2, the waiter ahead: %v, %v", removed, err)
				}
			}
			ops = r.Success
		case *pb.RangeRequest:
			ops = []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: r}}}
		}
		for _, op := range ops {
			if rr := op.GetRequestRange(); rr != nil && strings.Contains(string(rr.Key), "/records/") && len(rr.RangeEnd) > 0 {
				queueReads.Add(1)
			}
		}
		return invoker(ctx, method, rq, reply, cc, opts...)
	})
	st := open(t, srv, etcdstore.Options{Prefix: prefix, DialOptions: []grpc.DialOption{hook}})
	w3, err := st.Enqueue(ctx, req("w3", "crowd", 1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	removed, err := st.Cancel(ctx, w3)
	armed.Store(false)
	if err != nil || !removed {
		t.Fatalf("cancel of w3: %v, %v", removed, err)
	}
	if got := ahead.Load(); got < 2 {
		t.Fatalf("%d light removals of w3 sent, want the one that lost to w2 leaving and another", got)
	}
	if got := queueReads.Load(); got != 0 {
		t.Errorf("the cancel read the queue's records %d times: want a light removal behind w1, the new waiter ahead", got)
	}
	sn, err := other.Snapshot(ctx, "crowd")
	if err != nil {
		t.Fatal(err)
	}
	if len(sn.Tickets) != 2 {
		t.Errorf("%d tickets left, want the holder and w1", len(sn.Tickets))
	}
}
