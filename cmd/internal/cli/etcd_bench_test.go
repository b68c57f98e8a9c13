//go:build bench

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// TestCompareEtcd measures slotctl on etcd side by side with etcdctl lock,
// on one etcd server (in this process, fsyncing as a production one does),
// interleaved so that the machine's noise hits both alike:
//
//	go test -tags bench -run CompareEtcd -v ./cmd/internal/cli
//
// etcdctl is found on PATH or at $SLOTCTL_BENCH_ETCDCTL (etcdctl v3.7.3:
// build go.etcd.io/etcd/etcdctl/v3 from a module that requires it; it has
// replace directives, so go install ...@v3.7.3 refuses). SLOTCTL_BENCH_RUNS
// sets the runs of each (default 30). It reports medians; it asserts
// nothing, since timings on a shared machine are not a pass/fail.
//
// Two measures: an uncontended run of "true" (start to exit), and the
// handoff on a mutex: the holder's child exits, the waiter's child starts
// (each child is sh running date, whose cost is included).
func TestCompareEtcd(t *testing.T) {
	runs := benchRuns(30)
	etcdctl := os.Getenv("SLOTCTL_BENCH_ETCDCTL")
	if etcdctl == "" {
		etcdctl, _ = exec.LookPath("etcdctl")
	}
	dir := t.TempDir()
	// As released: slotctl hands etcd stores to slotctl-etcd beside it.
	bin, binEtcd := filepath.Join(dir, "slotctl"), filepath.Join(dir, "slotctl-etcd")
	buildSlotctl(t, bin, releaseSlotctl)
	buildSlotctl(t, binEtcd, releaseSlotctlEtcd)
	srv := etcdtest.Start(t, etcdtest.Options{Fsync: true})
	ep := srv.Endpoint
	env := append(os.Environ(), "HOME="+dir, "SLOTCTL_STORE=etcd://"+ep+"/bench")

	type tool struct {
		name   string
		run    func(limit string, argv ...string) *exec.Cmd
		queued func(limit string) bool // whether someone waits on limit
	}
	queued := func(limit string) bool {
		c := exec.Command(binEtcd, "limit", "ls", "-o", "json", limit)
		c.Env = env
		out, _ := c.Output()
		return strings.Contains(string(out), `"waiting": 1,`)
	}
	tools := []tool{
		{"slotctl run (execs slotctl-etcd) -- true", benchRunWith(bin), queued},
		{"slotctl-etcd run -- true", benchRunWith(binEtcd), queued},
	}
	ref := -1 // etcdctl's index
	if etcdctl != "" {
		ref = len(tools)
		tools = append(tools, tool{"etcdctl lock NAME -- true",
			func(limit string, argv ...string) *exec.Cmd {
				return exec.Command(etcdctl, append([]string{"--endpoints", ep, "lock", "/bench-etcdctl/" + limit, "--"}, argv...)...)
			}, nil})
	} else {
		t.Logf("etcdctl not found (PATH or SLOTCTL_BENCH_ETCDCTL): slotctl alone")
	}
	tools = append(tools, tool{"true (exec alone)", func(string, ...string) *exec.Cmd { return exec.Command("true") }, nil})

	// Uncontended runs.
	times := make([][]time.Duration, len(tools))
	for i := -1; i < runs; i++ { // run -1 warms up caches and creates the limit
		for j, tl := range tools {
			cmd := tl.run("x", "true")
			cmd.Env = env
			start := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", tl.name, err, out)
			}
			if i >= 0 {
				times[j] = append(times[j], time.Since(start))
			}
		}
	}

	// Handoffs on a mutex.
	hand := make([][]time.Duration, len(tools)-1)
	for i := 0; i < runs; i++ {
		for j, tl := range tools[:len(tools)-1] {
			d := handoff(t, dir, env, tl.run, tl.queued, fmt.Sprintf("h%d", j))
			hand[j] = append(hand[j], d)
		}
	}

	q := benchQuantile
	fmt.Printf("%-40s %10s %10s %10s\n", "uncontended run (etcd store)", "median", "p90", "vs etcdctl")
	for j, tl := range tools {
		ratio := "-"
		if ref >= 0 {
			ratio = fmt.Sprintf("%.2fx", float64(q(times[j], 50))/float64(q(times[ref], 50)))
		}
		fmt.Printf("%-40s %10s %10s %10s\n", tl.name, q(times[j], 50), q(times[j], 90), ratio)
	}
	fmt.Printf("%-40s %10s %10s %10s\n", "handoff (child exit -> next child start)", "p50", "p95", "max")
	for j, tl := range tools[:len(tools)-1] {
		name := strings.Fields(tl.name)[0]
		fmt.Printf("%-40s %10s %10s %10s\n", name, q(hand[j], 50), q(hand[j], 95), q(hand[j], 100))
	}
	fmt.Printf("(%d interleaved runs each, etcd %s with fsync, %s)\n", runs, ep, time.Now().UTC().Format(time.RFC3339))

	etcdIdle(t, dir, env, bin, queued)
}

// etcdIdle: docs/leases.md §8's idle goal on etcd. N waiters (SLOTCTL_BENCH_WAITERS,
// default 200) queue behind a holder; their CPU over 10 s, by schedstat
// (every thread) and utime+stime, and the etcd server's (this process)
// meanwhile. A waiter there watches, renews its lease by keep-alive every
// TTL/3 and polls every 5 s as a fallback.
func etcdIdle(t *testing.T, dir string, env []string, bin string, queued func(string) bool) {
	n := 200
	if v, err := strconv.Atoi(os.Getenv("SLOTCTL_BENCH_WAITERS")); err == nil && v > 0 {
		n = v
	}
	fifo := filepath.Join(dir, "idle.fifo")
	if err := exec.Command("mkfifo", fifo).Run(); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command(bin, "run", "--limit", "idle", "--", "sh", "-c", "touch idle.held; read x < idle.fifo")
	holder.Env, holder.Dir = env, dir
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	ptWaitFor(t, "idle holder", 10*time.Second, func() bool { return ptExists(filepath.Join(dir, "idle.held")) })
	waiters := make([]*exec.Cmd, n)
	pids := make([]int, n)
	for i := range waiters {
		w := exec.Command(bin, "run", "--limit", "idle", "--", "true")
		w.Env, w.Dir = env, dir
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		waiters[i], pids[i] = w, w.Process.Pid
	}
	defer func() {
		for _, w := range waiters {
			w.Process.Kill()
			w.Wait()
		}
	}()
	ptWaitFor(t, "waiters queued", 2*time.Minute, func() bool {
		c := exec.Command(bin, "limit", "ls", "-o", "json", "idle")
		c.Env = env
		out, _ := c.Output()
		return strings.Contains(string(out), fmt.Sprintf(`"waiting": %d,`, n))
	})
	time.Sleep(time.Second)
	const window = 10 * time.Second
	ticks0, ns0 := cmpCPU(t, pids)
	_, srv0 := cmpCPU(t, []int{os.Getpid()})
	w0 := time.Now()
	time.Sleep(window)
	ticks1, ns1 := cmpCPU(t, pids)
	_, srv1 := cmpCPU(t, []int{os.Getpid()})
	elapsed := time.Since(w0).Seconds()
	cpu, cpuSched := float64(ticks1-ticks0)/100, float64(ns1-ns0)/1e9
	fmt.Printf("idle: %d waiters on etcd over %.1fs: %.2f%% of one core (schedstat %.2f CPU-s, utime+stime %.2f CPU-s); the etcd server meanwhile %.2f CPU-s\n",
		n, elapsed, max(cpu, cpuSched)/elapsed*100, cpuSched, cpu, float64(srv1-srv0)/1e9)
	cmpPoke(t, fifo)
	if err := holder.Wait(); err != nil {
		t.Fatalf("idle holder: %v", err)
	}
	t0 := time.Now()
	for i, w := range waiters {
		if err := w.Wait(); err != nil {
			t.Fatalf("waiter %d: %v", i, err)
		}
	}
	fmt.Printf("idle: released, all %d admitted in %s\n", n, time.Since(t0).Round(time.Millisecond))
}

// benchRuns is SLOTCTL_BENCH_RUNS, or def.
func benchRuns(def int) int {
	if n, err := strconv.Atoi(os.Getenv("SLOTCTL_BENCH_RUNS")); err == nil && n > 0 {
		return n
	}
	return def
}

// benchRunWith runs COMMAND under bin run --limit LIMIT.
func benchRunWith(bin string) func(limit string, argv ...string) *exec.Cmd {
	return func(limit string, argv ...string) *exec.Cmd {
		return exec.Command(bin, append([]string{"run", "--limit", limit, "--"}, argv...)...)
	}
}

// benchQuantile is the p-th percentile of ts, rounded to 10 µs.
func benchQuantile(ts []time.Duration, p int) time.Duration {
	s := slices.Clone(ts)
	slices.Sort(s)
	return s[min(len(s)*p/100, len(s)-1)].Round(10 * time.Microsecond)
}

// handoff runs a holder and a waiter on one mutex and returns the time from
// the holder's child's exit to the waiter's child's start.
func handoff(t *testing.T, dir string, env []string, run func(string, ...string) *exec.Cmd, queued func(string) bool, limit string) time.Duration {
	t.Helper()
	for _, f := range []string{"held", "go", "end", "start"} {
		os.Remove(filepath.Join(dir, limit+"."+f))
	}
	p := func(f string) string { return filepath.Join(dir, limit+"."+f) }
	holder := run(limit, "sh", "-c", fmt.Sprintf(`touch %s; while [ ! -e %s ]; do sleep 0.005; done; exec date +%%s%%N > %s`, p("held"), p("go"), p("end")))
	waiter := run(limit, "sh", "-c", fmt.Sprintf(`exec date +%%s%%N > %s`, p("start")))
	for _, c := range []*exec.Cmd{holder, waiter} {
		c.Env, c.Dir = env, dir
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	ptWaitFor(t, "holder's child", 10*time.Second, func() bool { return ptExists(p("held")) })
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	if queued != nil {
		ptWaitFor(t, "waiter queued", 10*time.Second, func() bool { return queued(limit) })
	}
	time.Sleep(300 * time.Millisecond) // the waiter is asleep, as waiters are
	if err := os.WriteFile(p("go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := holder.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	if err := waiter.Wait(); err != nil {
		t.Fatalf("waiter: %v", err)
	}
	return time.Duration(ptReadInt(t, p("start")) - ptReadInt(t, p("end")))
}

// TestCompareEtcdLs is docs/leases.md §8's inspection goal on etcd: the whole
// `slotctl-etcd ls -o json` over 10,000 live tickets across 100 limits (2
// held, 98 waiting each), whose leases another handle granted and keeps,
// median of SLOTCTL_BENCH_RUNS (default 15) after one that warms up:
//
//	go test -tags bench -run CompareEtcdLs -v ./cmd/internal/cli
func TestCompareEtcdLs(t *testing.T) {
	runs := 15
	if n, err := strconv.Atoi(os.Getenv("SLOTCTL_BENCH_RUNS")); err == nil && n > 0 {
		runs = n
	}
	dir := t.TempDir()
	binEtcd := filepath.Join(dir, "slotctl-etcd")
	buildSlotctl(t, binEtcd, releaseSlotctlEtcd)
	srv := etcdtest.Start(t, etcdtest.Options{Fsync: true})
	st, err := etcdstore.New(etcdstore.Options{Endpoints: []string{srv.Endpoint}, Prefix: "/bench"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for l := range 100 {
		wg.Go(func() {
			limit := fmt.Sprintf("limit-%03d", l)
			for i := range 100 {
				if _, err := st.Enqueue(context.Background(), store.EnqueueRequest{
					ID: fmt.Sprintf("%08x%024x", l*100+i, l*7919+i), Limit: limit, Slots: 2, TTL: time.Hour,
					Holder: store.Holder{Host: "build-host-07", Pid: 10000 + l*100 + i, User: "ci",
						Argv: []string{"make", "-C", "/srv/ci/" + limit, "-j4", fmt.Sprintf("job=%d", i)}},
				}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("built 10,000 tickets across 100 limits in %s", time.Since(t0).Round(time.Millisecond))
	env := append(os.Environ(), "HOME="+dir, "SLOTCTL_STORE=etcd://"+srv.Endpoint+"/bench")
	var times []time.Duration
	for i := -1; i < runs; i++ {
		cmd := exec.Command(binEtcd, "ls", "-o", "json")
		cmd.Env = env
		start := time.Now()
		out, err := cmd.Output()
		d := time.Since(start)
		if err != nil {
			t.Fatalf("ls -o json: %v", err)
		}
		if i < 0 {
			var snap struct {
				Tickets []struct {
					Remaining float64 `json:"lease_remaining_seconds"`
				} `json:"tickets"`
			}
			if err := json.Unmarshal(out, &snap); err != nil || len(snap.Tickets) != 10000 {
				t.Fatalf("ls -o json: %d tickets, %v; want 10000", len(snap.Tickets), err)
			}
			for _, tk := range snap.Tickets {
				if tk.Remaining <= 0 {
					t.Fatalf("ls -o json: a live ticket shown expired (remaining %v)", tk.Remaining)
				}
			}
			continue
		}
		times = append(times, d)
	}
	slices.Sort(times)
	fmt.Printf("ls -o json, 10,000 tickets / 100 limits on etcd, whole command: median %s, p90 %s, min %s (%d runs, %s)\n",
		times[len(times)/2].Round(time.Millisecond), times[len(times)*9/10].Round(time.Millisecond), times[0].Round(time.Millisecond), runs, time.Now().UTC().Format(time.RFC3339))
}
