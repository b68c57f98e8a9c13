package etcdstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// keyTTL is the lease of keyReq's tickets, renewed to it too: longer than
// any loaded machine takes to run a test, so that none expires under one
// (the tests that want a lease over revoke it).
const keyTTL = 10 * time.Minute

// keyReq is a request of key k on limit, with the job's URL.
func keyReq(id, limit, k string, slots int) store.EnqueueRequest {
	r := req(id, limit, slots, keyTTL)
	r.Key = k
	r.Holder.URL = "https://ci.invalid/runs/" + id
	return r
}

// superseded checks that id is gone as superseded by by: Get wraps
// ErrNotFound, Renew ErrLost, both with a *store.SupersededError naming it.
func superseded(t *testing.T, st store.Store, tk store.Ticket, by string) {
	t.Helper()
	ctx := context.Background()
	var se *store.SupersededError
	_, err := st.Get(ctx, tk.ID)
	if !errors.Is(err, store.ErrNotFound) || !errors.As(err, &se) || se.By.Ticket != by || se.ID != tk.ID {
		t.Fatalf("Get %s: %v; want ErrNotFound and a SupersededError by %s", tk.ID, err, by)
	}
	if se.By.URL != "https://ci.invalid/runs/"+by || se.By.Host != "etcdstore.invalid" || se.By.Pid != 1 {
		t.Fatalf("Get %s: successor %+v; want its host, pid and URL", tk.ID, se.By)
	}
	se = nil
	_, err = st.Renew(ctx, tk, keyTTL)
	if !errors.Is(err, store.ErrLost) || !errors.As(err, &se) || se.By.Ticket != by {
		t.Fatalf("Renew %s: %v; want ErrLost and a SupersededError by %s", tk.ID, err, by)
	}
}

// Supersede removes, in the enqueue's own step, the older waiting tickets
// of the same key sharing a limit, and only those: not the held one, not
// one of another key, not one of the key in another limit. Each handle
// (the writer's, another's) then sees the removed one superseded.
func TestSupersedeRemovesOlderWaitersOfTheKey(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	other := open(t, srv, etcdstore.Options{Prefix: "/" + t.Name()})
	ctx := context.Background()
	h := mustEnqueue(t, st, keyReq("h", "l", "main", 1), store.Held)
	w1 := mustEnqueue(t, st, keyReq("w1", "l", "main", 1), store.Waiting)
	w2 := mustEnqueue(t, other, keyReq("w2", "l", "main", 1), store.Waiting)
	mustEnqueue(t, st, keyReq("x", "l", "Main", 1), store.Waiting)
	mustEnqueue(t, st, keyReq("y", "m", "main", 1), store.Held)
	mustEnqueue(t, st, keyReq("z", "m", "main", 1), store.Waiting)
	r := keyReq("n", "l", "main", 1)
	r.Supersede = true
	n := mustEnqueue(t, st, r, store.Waiting)
	if n.Key != "main" || n.Holder.URL != "https://ci.invalid/runs/n" || n.Position != 2 || len(n.Replaces) != 0 {
		t.Fatalf("n: %+v; want key main, its URL, second in line behind x, replacing none", n)
	}
	for _, s := range []store.Store{st, other} {
		superseded(t, s, w1, "n")
		superseded(t, s, w2, "n")
	}
	for _, id := range []string{"h", "x", "y", "z"} {
		if got := mustGet(t, st, id); got.Stop != nil {
			t.Fatalf("%s: %+v, want it untouched", id, got)
		}
	}
	evs, err := st.Events(ctx, "l", 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if e.Kind == "superseded" {
			got = append(got, e.Ticket+" by "+e.By)
		}
	}
	if want := "w1 by n,w2 by n"; strings.Join(got, ",") != want {
		t.Fatalf("superseded events %q, want %q", got, want)
	}
	if ok, err := st.Release(ctx, h, store.Released); err != nil || !ok {
		t.Fatalf("Release h: %v %v", ok, err)
	}
	if x := mustGet(t, st, "x"); x.State != store.Held {
		t.Fatalf("x: %+v, want held after h", x)
	}
}

// Replace asks the held ticket of its key to stop: the holder's bell, on
// another handle, rings within a second; Get and Renew return the stop
// request; the new ticket is admitted only once the replaced one is gone,
// though a slot is free beside it.
func TestReplaceRingsHolderAndWaitsForRelease(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	holder := open(t, srv, etcdstore.Options{})
	newer := open(t, srv, etcdstore.Options{Prefix: "/" + t.Name()})
	ctx := context.Background()
	bell, err := holder.Watch(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	h := mustEnqueue(t, holder, keyReq("h", "l", "deploy", 2), store.Held)
	if !rings(bell) {
		t.Fatal("no ring for the admission")
	}
	// The holder's own rewrite (SetChild) is no news to it, but its watch
	// may see the rewrite before SetChild's answer records it: a ring is a
	// hint (store.Bell), so a spurious one is drained, not an error.
	h, err = holder.SetChild(ctx, h, 4242, 17)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-bell.C():
	case <-time.After(300 * time.Millisecond):
	}
	r := keyReq("n", "l", "deploy", 2)
	r.Replace = true
	t0 := time.Now()
	n := mustEnqueue(t, newer, r, store.Waiting)
	if !slices.Equal(n.Replaces, []string{"h"}) {
		t.Fatalf("n: %+v, want it replacing h", n)
	}
	select {
	case <-bell.C():
	case <-time.After(time.Second):
		t.Fatal("the holder's bell did not ring within 1s of the stop request")
	}
	t.Logf("stop request heard %v after the enqueue began", time.Since(t0))
	want := store.Successor{Ticket: "n", Host: "etcdstore.invalid", Pid: 1, URL: "https://ci.invalid/runs/n"}
	if got := mustGet(t, holder, "h"); got.Stop == nil || *got.Stop != want || got.State != store.Held || got.Holder.Pgid != 4242 {
		t.Fatalf("h after the replace: %+v; want held, its child kept, stop %+v", got, want)
	}
	rn, err := holder.Renew(ctx, h, keyTTL)
	if err != nil || rn.Stop == nil || *rn.Stop != want {
		t.Fatalf("Renew h: %+v, %v; want it renewed, with the stop request", rn, err)
	}
	evs, err := newer.Events(ctx, "l", 100)
	if err != nil {
		t.Fatal(err)
	}
	if e := evs[len(evs)-1]; e.Kind != "replaced" || e.Ticket != "h" || e.By != "n" {
		t.Fatalf("last event %+v, want h replaced by n", e)
	}
	// A slot is free, but n waits for h.
	if got := mustGet(t, newer, "n"); got.State != store.Waiting {
		t.Fatalf("n: %+v, admitted beside the ticket it replaces", got)
	}
	mustEnqueue(t, newer, keyReq("o", "l", "other", 2), store.Waiting) // behind n: FIFO
	if ok, err := holder.Release(ctx, h, store.Released); err != nil || !ok {
		t.Fatalf("Release h: %v %v", ok, err)
	}
	if got := mustGet(t, newer, "n"); got.State != store.Held {
		t.Fatalf("n after h's release: %+v, want held", got)
	}
}

// A stop request is part of the held ticket: it survives a restart of the
// server, and a new handle reads it.
func TestStopSurvivesRestart(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	mustEnqueue(t, st, keyReq("h", "l", "k", 1), store.Held)
	r := keyReq("n", "l", "k", 1)
	r.Replace = true
	mustEnqueue(t, st, r, store.Waiting)
	srv.Stop()
	srv.Restart()
	again := open(t, srv, etcdstore.Options{Prefix: "/" + t.Name()})
	h := mustGet(t, again, "h")
	if h.Stop == nil || h.Stop.Ticket != "n" || h.State != store.Held {
		t.Fatalf("h after a restart: %+v, want held with n's stop request", h)
	}
	if n := mustGet(t, again, "n"); n.State != store.Waiting || !slices.Equal(n.Replaces, []string{"h"}) {
		t.Fatalf("n after a restart: %+v, want waiting, replacing h", n)
	}
}

// keysUnder lists every key under prefix with its mod revision.
func keysUnder(t *testing.T, c *clientv3.Client, prefix string) map[string]int64 {
	t.Helper()
	resp, err := c.Get(context.Background(), prefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.ModRevision
	}
	return out
}

// Max-waiting counts after the superseded ones are gone, and a refusal
// writes nothing: no ticket, no supersede, no stop request, no limit.
func TestMaxWaitingRefusalWritesNothing(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := raw(t, srv)
	prefix := "/" + t.Name()
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	mustEnqueue(t, st, keyReq("h", "l", "main", 1), store.Held)
	mustEnqueue(t, st, keyReq("w", "l", "main", 1), store.Waiting)
	one := 1
	r := keyReq("n", "l", "main", 1)
	r.Supersede, r.MaxWaiting = true, &one
	n := mustEnqueue(t, st, r, store.Waiting) // w goes first: 0 waiting
	mustEnqueue(t, st, keyReq("o", "l", "other", 1), store.Waiting)
	before := keysUnder(t, c, prefix)
	r = keyReq("p", "l", "main", 1)
	r.Replace, r.MaxWaiting = true, &one
	r.Limits = []string{"l", "fresh"}
	r.Limit = ""
	_, err := st.Enqueue(ctx, r)
	var qf *store.QueueFullError
	if !errors.Is(err, store.ErrQueueFull) || !errors.As(err, &qf) || qf.Limit != "l" || qf.Waiting != 1 || qf.Max != 1 {
		t.Fatalf("Enqueue p: %v; want a QueueFullError: l has 1 waiting (o; n superseded), at most 1", err)
	}
	if after := keysUnder(t, c, prefix); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a refused enqueue wrote:\nbefore %v\nafter  %v", before, after)
	}
	if got := mustGet(t, st, "n"); got.State != store.Waiting {
		t.Fatalf("n: %+v, want still waiting", got)
	}
	if got := mustGet(t, st, "h"); got.Stop != nil {
		t.Fatalf("h: %+v, asked to stop by a refused enqueue", got)
	}
	zero := 0
	r = keyReq("q", "free", "main", 1)
	r.MaxWaiting = &zero
	mustEnqueue(t, st, r, store.Held) // admitted at once: never refused
	_ = n
}

// A supersede of more waiters than one transaction holds removes them
// all: as many per transaction as fit, then the ticket.
func TestSupersedeOfManyWaiters(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	mustEnqueue(t, st, keyReq("h", "l", "main", 1), store.Held)
	var ws []store.Ticket
	for i := range 60 {
		ws = append(ws, mustEnqueue(t, st, keyReq(fmt.Sprintf("w%d", i), "l", "main", 1), store.Waiting))
	}
	mustEnqueue(t, st, keyReq("x", "l", "other", 1), store.Waiting)
	r := keyReq("n", "l", "main", 1)
	r.Supersede = true
	n := mustEnqueue(t, st, r, store.Waiting)
	if n.Position != 2 {
		t.Fatalf("n: %+v, want second, behind x", n)
	}
	for _, w := range ws {
		superseded(t, st, w, "n")
	}
	sn, err := st.Snapshot(context.Background(), "l")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tk := range sn.Tickets {
		ids = append(ids, tk.ID)
	}
	if strings.Join(ids, " ") != "h x n" {
		t.Fatalf("tickets %q, want h x n", ids)
	}
}

// failWritesFrom lets k of a handle's transactions that write ticket
// records through and fails the rest (k 0: all of them), as when the store
// goes away midway; failed counts the ones refused.
func failWritesFrom(k int) (o grpc.DialOption, failed *atomic.Int32) {
	var seen atomic.Int32
	failed = new(atomic.Int32)
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if tr, ok := req.(*pb.TxnRequest); ok && (writes(tr, "/records/", true) || writes(tr, "/records/", false)) {
			if int(seen.Add(1)) > k {
				failed.Add(1)
				return status.Error(codes.Unavailable, "test: the store went away")
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}), failed
}

// A supersede of more waiters than one transaction holds (one holder and
// 40 waiters of the key; 70 for a split in three) never strands the key,
// whichever of its transactions fails: the first failing leaves every
// older run as it was; a later one leaves the new ticket written, each
// older waiter waiting or superseded by it (never by a ticket that does
// not exist). A later settle on another handle finishes the supersede
// without admitting an older waiter: another enqueue on the limit once the
// holder's lease is gone, the new ticket's renewal, or the holder's
// release. The new run is then the only one of the key left, and its mark
// is gone.
func TestSplitSupersedeNeverStrandsTheKey(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	cl := raw(t, srv)
	for _, c := range []struct {
		waiters int
		replace bool
		finish  string // the later settle: "enqueue", "renew" or "release"
	}{{40, false, "enqueue"}, {40, true, "renew"}, {70, true, "release"}} {
		name := fmt.Sprintf("%d waiters, replace %v, %s", c.waiters, c.replace, c.finish)
		for k := 0; ; k++ {
			prefix := fmt.Sprintf("/split-%d-%v-%d", c.waiters, c.replace, k)
			st := open(t, srv, etcdstore.Options{Prefix: prefix})
			h := mustEnqueue(t, st, keyReq("h", "l", "main", 1), store.Held)
			var ws []store.Ticket
			for i := range c.waiters {
				ws = append(ws, mustEnqueue(t, st, keyReq(fmt.Sprintf("w%02d", i), "l", "main", 1), store.Waiting))
			}
			fail, failed := failWritesFrom(k)
			newer := open(t, srv, etcdstore.Options{Prefix: prefix, DialOptions: []grpc.DialOption{fail}})
			r := keyReq("n", "l", "main", 1)
			r.Supersede, r.Replace = !c.replace, c.replace
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			_, err := newer.Enqueue(ctx, r)
			cancel()
			newer.Close()
			ctx = context.Background()
			whole := failed.Load() == 0 // k is past the enqueue's last transaction
			if whole && k < 2 {
				t.Fatalf("%s: the enqueue took %d transactions; the test wants it split", name, k)
			}
			if k == 0 {
				// Nothing was written: every older run stands.
				if _, err := st.Get(ctx, "n"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("%s, k 0: Get n: %v; want not found", name, err)
				}
				for _, w := range ws {
					if _, err := st.Renew(ctx, w, keyTTL); err != nil {
						t.Fatalf("%s, k 0: Renew %s: %v; want it waiting on", name, w.ID, err)
					}
				}
				if got := mustGet(t, st, "h"); got.Stop != nil {
					t.Fatalf("%s, k 0: h asked to stop by an enqueue that wrote nothing: %+v", name, got)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s, k %d: Enqueue n: %v; want its ticket, written first", name, k, err)
			}
			n := mustGet(t, st, "n")
			if n.State != store.Waiting || c.replace != slices.Equal(n.Replaces, []string{"h"}) {
				t.Fatalf("%s, k %d: n %+v; want waiting, replacing h only with --replace", name, k, n)
			}
			// Each older waiter waits on, or is superseded by n, which exists.
			for _, w := range ws {
				var err error
				if c.finish == "release" {
					_, err = st.Renew(ctx, w, keyTTL) // the one next in line settles
				} else {
					_, err = st.Get(ctx, w.ID)
				}
				var se *store.SupersededError
				if err != nil && (!errors.As(err, &se) || se.By.Ticket != "n") {
					t.Fatalf("%s, k %d: %s: %v; want it waiting or superseded by n", name, k, w.ID, err)
				}
			}
			switch c.finish {
			case "enqueue":
				// The holder's lease ends (revoked, as on its expiry), which
				// settles nothing; the next enqueue on the limit does.
				resp, err := cl.Get(ctx, prefix+"/records/l/h")
				var hr struct{ Lease int64 }
				if err != nil || len(resp.Kvs) != 1 || json.Unmarshal(resp.Kvs[0].Value, &hr) != nil {
					t.Fatalf("%s, k %d: h's record: %v, %v", name, k, resp, err)
				}
				if _, err := cl.Revoke(ctx, clientv3.LeaseID(hr.Lease)); err != nil {
					t.Fatal(err)
				}
				mustEnqueue(t, st, keyReq("x", "l", "other", 1), store.Waiting)
			case "renew":
				// n's renewal settles, though it is far back in the queue.
				if _, err := st.Renew(ctx, n, keyTTL); err != nil {
					t.Fatalf("%s, k %d: Renew n: %v", name, k, err)
				}
				for _, w := range ws {
					superseded(t, st, w, "n")
				}
				if got := mustGet(t, st, "h"); got.Stop == nil || got.Stop.Ticket != "n" {
					t.Fatalf("%s, k %d: h %+v; want asked to stop by n", name, k, got)
				}
				fallthrough
			case "release":
				if ok, err := st.Release(ctx, h, store.Released); err != nil || !ok {
					t.Fatalf("%s, k %d: Release h: %v %v", name, k, ok, err)
				}
			}
			if got := mustGet(t, st, "n"); got.State != store.Held {
				t.Fatalf("%s, k %d: n once h is gone: %+v; want held", name, k, got)
			}
			for _, w := range ws {
				superseded(t, st, w, "n")
			}
			sn, err := st.Snapshot(ctx, "l")
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, tk := range sn.Tickets {
				ids = append(ids, tk.ID)
			}
			if want := map[bool]string{true: "n x", false: "n"}[c.finish == "enqueue"]; strings.Join(ids, " ") != want {
				t.Fatalf("%s, k %d: tickets %q; want %q", name, k, ids, want)
			}
			resp, err := cl.Get(ctx, prefix+"/records/l/n")
			if err != nil || len(resp.Kvs) != 1 || strings.Contains(string(resp.Kvs[0].Value), "supersed") {
				t.Fatalf("%s, k %d: n's record %v, %v; want it without the mark", name, k, resp, err)
			}
			if whole {
				t.Logf("%s: the enqueue took %d transactions", name, k)
				break
			}
		}
	}
}
