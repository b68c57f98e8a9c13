package etcdstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// dropWatchEvents makes the gRPC connection drop every watch response that
// carries events: a bell's watch is created and stays open, and never
// hears of a change (a member that lost them, a compaction under a slow
// watcher). dropped counts them.
func dropWatchEvents() (grpc.DialOption, *atomic.Int32) {
	var dropped atomic.Int32
	return grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Watch/Watch" {
			return cs, err
		}
		return &eventDropper{ClientStream: cs, dropped: &dropped}, nil
	}), &dropped
}

type eventDropper struct {
	grpc.ClientStream
	dropped *atomic.Int32
}

func (d *eventDropper) RecvMsg(m any) error {
	for {
		if err := d.ClientStream.RecvMsg(m); err != nil {
			return err
		}
		if r, ok := m.(*pb.WatchResponse); ok && len(r.Events) > 0 {
			d.dropped.Add(1)
			continue
		}
		return nil
	}
}

// A waiter whose bell misses every watch event learns of its admission at
// its next poll (Get) when a release promoted it, and at its next renewal
// when nobody wrote (the holder's lease expired): the renewal of the next
// in line settles the limit and admits it. The bell is a hint; what the
// waiter relies on is its own calls.
func TestLostWatchEventsLearnedByPollAndRenewal(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	st := open(t, srv, etcdstore.Options{})
	drop, dropped := dropWatchEvents()
	deaf := open(t, srv, etcdstore.Options{Prefix: "/" + t.Name(), DialOptions: []grpc.DialOption{drop}})

	// Released: the release promotes the waiter.
	h, err := st.Enqueue(ctx, req("h", "rel", 1, 30*time.Second))
	if err != nil || h.State != store.Held {
		t.Fatalf("h: %+v, %v; want held", h, err)
	}
	bell, err := deaf.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	if w, err := deaf.Enqueue(ctx, req("w", "rel", 1, 30*time.Second)); err != nil || w.State != store.Waiting {
		t.Fatalf("w: %+v, %v; want waiting", w, err)
	}
	settle(bell)
	if _, err := st.Release(ctx, h, store.Released); err != nil {
		t.Fatal(err)
	}
	if rings(bell) {
		t.Fatalf("the bell rang with its events dropped (%d dropped): the fault was not injected", dropped.Load())
	}
	if dropped.Load() == 0 {
		t.Fatal("no watch event was dropped: the fault was not injected")
	}
	if got, err := deaf.Get(ctx, "w"); err != nil || got.State != store.Held {
		t.Fatalf("w's poll after the release: %+v, %v; want held", got, err)
	}

	// Expired: nobody writes; the waiter's bell would have settled.
	h2, err := st.Enqueue(ctx, req("h2", "exp", 1, 2*time.Second))
	if err != nil || h2.State != store.Held {
		t.Fatalf("h2: %+v, %v; want held", h2, err)
	}
	bell2, err := deaf.Watch(ctx, "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer bell2.Close()
	w2, err := deaf.Enqueue(ctx, req("w2", "exp", 1, 30*time.Second))
	if err != nil || w2.State != store.Waiting {
		t.Fatalf("w2: %+v, %v; want waiting", w2, err)
	}
	before := dropped.Load()
	// h2's lease ends 2s after its grant; the server's revoker acts
	// within its own tick, later on a loaded machine.
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-bell2.C():
			t.Fatalf("the bell rang with its events dropped: the fault was not injected")
		case <-time.After(500 * time.Millisecond):
		}
		// Its record stays, shown with no time left, until a settle.
		if g, err := st.Get(ctx, "h2"); (err != nil || g.Remaining == 0) && dropped.Load() > before {
			break // h2's lease is gone, and w2's bell missed it
		}
		if time.Now().After(deadline) {
			t.Fatalf("h2's 2s lease did not end, or its end was not dropped from the watch (%d dropped), in 15s", dropped.Load()-before)
		}
	}
	// Nobody settled: the ticket still waits, its limit free.
	if got, err := deaf.Get(ctx, "w2"); err != nil || got.State != store.Waiting {
		t.Fatalf("w2 before its renewal: %+v, %v; want waiting (nothing settled)", got, err)
	}
	got, err := deaf.Renew(ctx, w2, 30*time.Second)
	if err != nil || got.State != store.Held {
		t.Fatalf("w2's renewal after h2's lease ended: %+v, %v; want held", got, err)
	}
}
