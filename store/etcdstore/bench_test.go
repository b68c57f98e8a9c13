package etcdstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// The one-limit path costs the round trips it cost before tickets of
// several limits: an uncontended Enqueue is a lease grant beside a read,
// then one transaction; its Release a read, one transaction and the
// lease's revocation. A ticket of two limits costs the same.
func TestRoundTripsOfEnqueueAndRelease(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	for _, limits := range [][]string{{"one"}, {"one", "two"}} {
		count, n := countCalls()
		st := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{count}, Prefix: fmt.Sprintf("/rt/%d", len(limits))})
		// A first run creates the limits and the day lease.
		warm := multi("warm", limits, 1, 4)
		tk := mustEnqueue(t, st, warm, store.Held)
		if _, err := st.Release(ctx, tk, store.Released); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the revocation is sent after Release returns
		n.Store(0)
		tk = mustEnqueue(t, st, multi("t", limits, 1, 4), store.Held)
		if got := n.Load(); got != 3 {
			t.Errorf("%d limits: Enqueue took %d round trips, want 3 (grant, read, commit)", len(limits), got)
		}
		n.Store(0)
		if _, err := st.Release(ctx, tk, store.Released); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if got := n.Load(); got != 3 {
			t.Errorf("%d limits: Release took %d round trips, want 3 (read, commit, revoke)", len(limits), got)
		}
	}
}

// BenchmarkEnqueueRelease is one uncontended run's store work, Enqueue
// (admitted at once) and Release, on one limit and on two:
//
//	go test -run '^$' -bench EnqueueRelease -count 10 ./store/etcdstore/
func BenchmarkEnqueueRelease(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.Options{Fsync: true})
	ctx := context.Background()
	for _, limits := range [][]string{{"build"}, {"build", "db"}} {
		b.Run(fmt.Sprintf("limits=%d", len(limits)), func(b *testing.B) {
			st, err := etcdstore.New(etcdstore.Options{Endpoints: []string{srv.Endpoint}, Prefix: fmt.Sprintf("/bench/%d/%d", len(limits), time.Now().UnixNano())})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			i := 0
			for b.Loop() {
				i++
				r := multi(fmt.Sprintf("t%d", i), limits, 1, 4)
				tk, err := st.Enqueue(ctx, r)
				if err != nil || tk.State != store.Held {
					b.Fatalf("Enqueue: %+v, %v", tk, err)
				}
				if ok, err := st.Release(ctx, tk, store.Released); err != nil || !ok {
					b.Fatalf("Release: %v, %v", ok, err)
				}
			}
		})
	}
}

// BenchmarkHandoff is a mutex's handoff, on one limit and on two: from the
// holder's Release to the waiter, on another handle, seeing itself held
// (its bell's ring and its Get):
//
//	go test -run '^$' -bench Handoff -count 10 ./store/etcdstore/
func BenchmarkHandoff(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.Options{Fsync: true})
	ctx := context.Background()
	for _, limits := range [][]string{{"build"}, {"build", "db"}} {
		b.Run(fmt.Sprintf("limits=%d", len(limits)), func(b *testing.B) {
			prefix := fmt.Sprintf("/handoff/%d/%d", len(limits), time.Now().UnixNano())
			var sts []*etcdstore.Store
			for range 2 {
				st, err := etcdstore.New(etcdstore.Options{Endpoints: []string{srv.Endpoint}, Prefix: prefix})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				sts = append(sts, st)
			}
			holder, waiter := sts[0], sts[1]
			h, err := holder.Enqueue(ctx, multi("h0", limits, 1, 1))
			if err != nil || h.State != store.Held {
				b.Fatalf("Enqueue: %+v, %v", h, err)
			}
			var relT, allT time.Duration
			defer func() {
				b.ReportMetric(float64(relT.Microseconds())/float64(b.N), "release-us")
				b.ReportMetric(float64(allT.Microseconds())/float64(b.N), "all-us")
			}()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				id := fmt.Sprintf("w%d", i)
				bell, err := waiter.Watch(ctx, id)
				if err != nil {
					b.Fatal(err)
				}
				w, err := waiter.Enqueue(ctx, multi(id, limits, 1, 1))
				if err != nil || w.State != store.Waiting {
					b.Fatalf("Enqueue %s: %+v, %v", id, w, err)
				}
				time.Sleep(2 * time.Millisecond) // the bell's watches are set
				b.StartTimer()
				t0 := time.Now()
				if ok, err := holder.Release(ctx, h, store.Released); err != nil || !ok {
					b.Fatalf("Release: %v, %v", ok, err)
				}
				relT += time.Since(t0)
				for w.State != store.Held {
					select {
					case <-bell.C():
					case <-time.After(5 * time.Second):
						b.Fatalf("%s: no ring", id)
					}
					if w, err = waiter.Get(ctx, id); err != nil {
						b.Fatal(err)
					}
				}
				allT += time.Since(t0)
				b.StopTimer()
				bell.Close()
				holder, waiter = waiter, holder // the new holder releases next
				h = w
				b.StartTimer()
			}
		})
	}
}
