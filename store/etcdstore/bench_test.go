package etcdstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
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
		// A new handle (each slotctl run is one) takes over the day lease
		// that tombstones and events go under, as read with its first
		// step: no grant, nor a question, of its own.
		count, n = countCalls()
		cold := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{count}, Prefix: fmt.Sprintf("/rt/%d", len(limits))})
		tk = mustEnqueue(t, cold, multi("cold", limits, 1, 4), store.Held)
		if got := n.Load(); got != 3 {
			t.Errorf("%d limits: a new handle's Enqueue took %d round trips, want 3 (grant, read, commit)", len(limits), got)
		}
		count, n = countCalls()
		other := open(t, srv, etcdstore.Options{DialOptions: []grpc.DialOption{count}, Prefix: fmt.Sprintf("/rt/%d", len(limits))})
		if removed, err := other.Release(ctx, tk, store.ForceReleased); err != nil || !removed {
			t.Fatalf("a new handle's release: %v, %v", removed, err)
		}
		time.Sleep(100 * time.Millisecond)
		if got := n.Load(); got != 4 {
			t.Errorf("%d limits: a new handle's Release of a ticket it does not know took %d round trips, want 4 (its id, its limits, commit, revoke)", len(limits), got)
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

// reader10k is a handle on 10,000 tickets (build10k) that granted none of
// their leases, as the ls or metrics process did not.
func reader10k(b *testing.B) *etcdstore.Store {
	b.Helper()
	srv := etcdtest.Start(b, etcdtest.Options{})
	prefix := fmt.Sprintf("/10k/%d", time.Now().UnixNano())
	build10k(b, srv, prefix)
	st, err := etcdstore.New(etcdstore.Options{Endpoints: []string{srv.Endpoint}, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// build10k enqueues 10,000 tickets across 100 limits of 2 slots (2 held
// and 98 waiting each, a one-hour TTL) under prefix, from a handle that
// stays open (its leases are its own; a reader must be another handle).
func build10k(b *testing.B, srv *etcdtest.Server, prefix string) {
	b.Helper()
	st, err := etcdstore.New(etcdstore.Options{Endpoints: []string{srv.Endpoint}, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for l := range 100 {
		wg.Go(func() {
			limit := fmt.Sprintf("limit-%03d", l)
			for i := range 100 {
				_, err := st.Enqueue(ctx, store.EnqueueRequest{
					ID: fmt.Sprintf("%08x%024x", l*100+i, l*7919+i), Limit: limit, Slots: 2, TTL: time.Hour,
					Holder: store.Holder{Host: "build-host-07", Pid: 10000 + l*100 + i, User: "ci",
						Argv: []string{"make", "-C", "/srv/ci/" + limit, "-j4", fmt.Sprintf("job=%d", i)}},
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.Logf("built 10,000 tickets in %s", time.Since(start).Round(time.Millisecond))
}

// BenchmarkSnapshot10k is what `ls -o json` asks of the store: a snapshot
// of 10,000 live tickets across 100 limits, read by a handle that granted
// none of their leases (as the ls process did not):
//
//	go test -run '^$' -bench Snapshot10k -count 10 ./store/etcdstore/
func BenchmarkSnapshot10k(b *testing.B) {
	st := reader10k(b)
	ctx := context.Background()
	var times []time.Duration
	for b.Loop() {
		t0 := time.Now()
		sn, err := st.Snapshot(ctx)
		times = append(times, time.Since(t0))
		if err != nil || len(sn.Tickets) != 10000 || len(sn.Limits) != 100 {
			b.Fatalf("Snapshot: %d tickets in %d limits, %v; want 10000 in 100", len(sn.Tickets), len(sn.Limits), err)
		}
		for _, tk := range sn.Tickets {
			if tk.Remaining <= 0 || tk.Remaining > time.Hour+time.Second {
				b.Fatalf("ticket %s: remaining %s, want in (0, 1h]", tk.ID, tk.Remaining)
			}
		}
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
}

// BenchmarkHeads10k is what `slotctl metrics` and a waiting run's status
// line ask of the store: the heads (store.Heads) of the 100 limits of
// 10,000 live tickets, on a handle that granted none of their leases:
//
//	go test -run '^$' -bench Heads10k -count 10 ./store/etcdstore/
func BenchmarkHeads10k(b *testing.B) {
	st := reader10k(b)
	ctx := context.Background()
	var times []time.Duration
	for b.Loop() {
		t0 := time.Now()
		sn, err := store.Heads(ctx, st)
		times = append(times, time.Since(t0))
		if err != nil || len(sn.Limits) != 100 {
			b.Fatalf("Heads: %d limits, %v; want 100", len(sn.Limits), err)
		}
		n := 0
		for _, l := range sn.Limits {
			n += l.Held + l.Waiting
		}
		if n != 10000 {
			b.Fatalf("Heads: %d tickets counted, want 10000", n)
		}
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
}

// BenchmarkRenewWaiter is one renewal of a waiter far back in a queue of
// 200 (SLOTCTLTEST_BENCH_AHEAD another length), on a handle of its own (as
// a waiting slotctl run is): the keep-alive and the read after it. With SLOTCTLTEST_BENCH_ETCD=HOST:PORT
// it runs against that server (another process), so that the process's
// CPU time is the client's alone; with SLOTCTLTEST_BENCH_ETCD_PID too, the
// server's CPU time per renewal is reported beside it:
//
//	go test -run '^$' -bench RenewWaiter -benchtime 2000x ./store/etcdstore/
//
// System calls per renewal: run it under strace -f -c at two -benchtime
// counts and divide the difference by the difference of the counts.
func BenchmarkRenewWaiter(b *testing.B) {
	endpoint := os.Getenv("SLOTCTLTEST_BENCH_ETCD")
	if endpoint == "" {
		endpoint = etcdtest.Start(b, etcdtest.Options{}).Endpoint
	}
	ctx := context.Background()
	prefix := fmt.Sprintf("/bench/renew/%d", time.Now().UnixNano())
	others, err := etcdstore.New(etcdstore.Options{Endpoints: []string{endpoint}, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	defer others.Close()
	ahead := 200
	if n, err := strconv.Atoi(os.Getenv("SLOTCTLTEST_BENCH_AHEAD")); err == nil && n >= 2 {
		ahead = n
	}
	for i := range ahead {
		if _, err := others.Enqueue(ctx, req(fmt.Sprintf("q%05d", i), "renew", 1, time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	st, err := etcdstore.New(etcdstore.Options{Endpoints: []string{endpoint}, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	tk, err := st.Enqueue(ctx, req("last", "renew", 1, time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := st.Renew(ctx, tk, time.Minute); err != nil {
		b.Fatal(err)
	}
	pid, _ := strconv.Atoi(os.Getenv("SLOTCTLTEST_BENCH_ETCD_PID"))
	self0, srv0 := cpuTime(os.Getpid()), cpuTime(pid)
	b.ResetTimer()
	for range b.N {
		if _, err := st.Renew(ctx, tk, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime(os.Getpid())-self0)/float64(b.N)/1e3, "process-µs-cpu/op")
	if pid > 0 {
		b.ReportMetric(float64(cpuTime(pid)-srv0)/float64(b.N)/1e3, "server-µs-cpu/op")
	}
}

// cpuTime is a process's utime+stime (/proc/PID/stat), in ns; 0 if unknown.
func cpuTime(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ 100
}
