package etcdstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
	"github.com/slotctl/slotctl/store/storetest"
)

func mustResize(t *testing.T, st store.Store, tk store.Ticket, w int) store.Ticket {
	t.Helper()
	got, err := st.Resize(context.Background(), tk, w)
	if err != nil {
		t.Fatalf("Resize %s to %d: %v", tk.ID, w, err)
	}
	return got
}

// slotKeys reads the slot keys of limit: index -> the ticket id it holds.
func slotKeys(t *testing.T, c *clientv3.Client, st *etcdstore.Store, limit string) map[int]string {
	t.Helper()
	_, prefix, err := etcdstore.ParseURL(st.String())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(context.Background(), prefix+"/slots/"+limit+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		i, err := strconv.Atoi(k[strings.LastIndexByte(k, '/')+1:])
		if err != nil {
			t.Fatalf("slot key %s", k)
		}
		out[i] = string(kv.Value)
	}
	return out
}

// wantSlotKeys checks that the slot keys of limit are exactly those of the
// tickets' indexes there.
func wantSlotKeys(t *testing.T, c *clientv3.Client, st *etcdstore.Store, limit string, tks ...store.Ticket) {
	t.Helper()
	want := map[int]string{}
	for _, tk := range tks {
		for _, i := range tk.In(limit) {
			want[i] = tk.ID
		}
	}
	if got := slotKeys(t, c, st, limit); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("slot keys of %q: %v, want %v", limit, got, want)
	}
}

// A growth stops at the bound of one transaction (limits × (weight+3) <=
// MaxTicketKeys), so that the ticket stays removable in one; its slot keys
// follow its indexes, and a release deletes them all.
func TestResizeKeyBound(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	c := raw(t, srv)
	var sixteen []string
	for i := range store.MaxLimits {
		sixteen = append(sixteen, fmt.Sprintf("l%02d", i))
	}
	for _, tc := range []struct {
		limits []string
		want   int
	}{{[]string{"one"}, 61}, {[]string{"two", "three"}, 29}, {sixteen, 1}} {
		tk := mustEnqueue(t, st, multi("big-"+tc.limits[0], tc.limits, 1, 100), store.Held)
		tk = mustResize(t, st, tk, 100)
		if tk.Weighs() != tc.want {
			t.Fatalf("%d limits: grown to weight %d, want %d", len(tc.limits), tk.Weighs(), tc.want)
		}
		last := tc.limits[len(tc.limits)-1]
		wantSlotKeys(t, c, st, last, tk)
		if got := mustGet(t, st, tk.ID); !slices.Equal(got.In(last), tk.In(last)) {
			t.Fatalf("Get: %v, Resize said %v", got.In(last), tk.In(last))
		}
		tk = mustResize(t, st, tk, 1)
		wantSlotKeys(t, c, st, last, tk)
		if ok, err := st.Release(context.Background(), tk, store.Released); err != nil || !ok {
			t.Fatalf("Release: %v, %v", ok, err)
		}
		wantSlotKeys(t, c, st, last)
	}
}

// The slot keys of a resized ticket are under its lease: when it expires
// (the holder crashed and nobody renews) they all go at once, and a
// waiter's renewal admits the next ticket to all of them. A ticket of the
// previous release's records resizes too.
func TestResizeExpiryFreesAll(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	c := raw(t, srv)
	ctx := context.Background()
	writeLegacy(t, srv, st, 2*time.Second)
	a := mustGet(t, st, storetest.LegacyIDs[0])
	legacyB := mustGet(t, st, storetest.LegacyIDs[1])
	if ok, err := st.Release(ctx, legacyB, store.Released); err != nil || !ok {
		t.Fatalf("Release: %v, %v", ok, err)
	}
	legacyC := mustGet(t, st, storetest.LegacyIDs[2])
	if ok, err := st.Release(ctx, legacyC, store.Released); err != nil || !ok {
		t.Fatalf("Release: %v, %v", ok, err)
	}
	a = mustResize(t, st, a, 2)
	if !slices.Equal(a.In(storetest.LegacyLimit), []int{0, 1}) {
		t.Fatalf("legacy-a grown: %v, want [0 1]", a.In(storetest.LegacyLimit))
	}
	wantSlotKeys(t, c, st, storetest.LegacyLimit, a)
	w := mustEnqueue(t, st, multi("w", []string{storetest.LegacyLimit}, 2, 2), store.Waiting)
	deadline := time.Now().Add(10 * time.Second)
	for {
		srv.Advance(500 * time.Millisecond)
		got, err := st.Renew(ctx, w, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == store.Held {
			if !slices.Equal(got.In(storetest.LegacyLimit), []int{0, 1}) {
				t.Fatalf("w holds %v, want [0 1]", got.In(storetest.LegacyLimit))
			}
			wantSlotKeys(t, c, st, storetest.LegacyLimit, got)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("w still waits after legacy-a's lease ran out: slot keys %v", slotKeys(t, c, st, storetest.LegacyLimit))
		}
	}
}

// A growth decided before a waiter joined does not commit after it: the
// transaction compares that no ticket joined its limits since the read.
// Here the waiter joins between the growth's read and its commit (its
// Enqueue runs, on another handle, while the growth's transaction is on its
// way): the growth retries, sees it, and takes nothing.
func TestResizeGrowthRacingAWaiter(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	other := open(t, srv, etcdstore.Options{Prefix: "/race"})
	var joined atomic.Int32
	join := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if tr, ok := req.(*pb.TxnRequest); ok && writes(tr, ".resized.", true) && joined.Add(1) == 1 {
			if _, err := other.Enqueue(ctx, multi("w", []string{"cpu"}, 4, 4)); err != nil {
				t.Errorf("Enqueue W: %v", err)
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{join}, Prefix: "/race"})
	a := mustEnqueue(t, st, multi("a", []string{"cpu"}, 1, 4), store.Held)
	got := mustResize(t, st, a, 3)
	if joined.Load() == 0 {
		t.Fatal("the growth wrote no resized event: the race never ran")
	}
	if got.Weighs() != 1 {
		t.Fatalf("A grew to %d past W, which joined before the growth committed", got.Weighs())
	}
	if w := mustGet(t, st, "w"); w.State != store.Waiting {
		t.Fatalf("W: %s, want waiting (A holds 1 of 4, W asks 4)", w.State)
	}
}
