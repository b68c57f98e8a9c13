package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/renew"
)

// waitersSize is the size of TestManyWaiters and its yardstick: 200 by
// default, 2,000 with SLOTCTL_CLUSTER_SOAK=1, N (a multiple of 100) with
// SLOTCTL_CLUSTER_WAITERS=N.
func waitersSize() (n, cancelN int, label string) {
	n, cancelN = 200, 200
	if soak {
		n, cancelN = 2000, 1000
	}
	if v, err := strconv.Atoi(os.Getenv("SLOTCTL_CLUSTER_WAITERS")); err == nil && v >= 100 {
		n, cancelN = v/100*100, min(v/100*100, 1000)
	}
	label = fmt.Sprintf("%d waiters", n)
	if n < 2000 {
		label += ", scaled down from 2,000"
	}
	return n, cancelN, label
}

// TestManyLockWaiters is TestManyWaiters' yardstick: the same queue of
// waiters, in the same bursts of 100 behind one holder, as `etcdctl lock`
// processes (etcd's own Mutex: a key per waiter under one prefix, ordered
// by create revision, each waiter watching the key just before its own,
// one keep-alive stream per process, TTL 30 s), on a cluster of its own:
// the waiters that fail to queue, the members' CPU per waiter while they
// queue, and the idle CPU of the waiters and of the members. It asserts
// nothing of the figures (they are the yardstick), only that the queue
// forms. etcdctl: SLOTCTL_CLUSTER_ETCDCTL, else the one on PATH (Debian's
// etcd-client).
func TestManyLockWaiters(t *testing.T) {
	skipUnlessEnabled(t)
	etcdctl := os.Getenv("SLOTCTL_CLUSTER_ETCDCTL")
	if etcdctl == "" {
		etcdctl, _ = exec.LookPath("etcdctl")
	}
	if etcdctl == "" {
		t.Skip("no etcdctl (SLOTCTL_CLUSTER_ETCDCTL, or on PATH): the yardstick needs it")
	}
	window := 2 * renew.WaitPeriod(30*time.Second, 10*time.Second)
	n, _, size := waitersSize()
	c := startCluster(t)
	js := newJobs(t, "lock", "lock", 1)
	js.env = append(js.env, "ETCDCTL_API=3")
	const name = "yardstick"
	lock := func(job string, argv ...string) *job {
		return js.startBin(job, etcdctl, append([]string{"--endpoints", strings.Join(c.endpoints(), ","), "lock", "--ttl", "30", name}, argv...)...)
	}
	queued := func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.cli.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return resp.Count, nil
	}
	holder := lock("holder", "sleep", "1200")
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, err := queued(); err == nil && got == 1 {
			break
		}
		if time.Now().After(deadline) || holder.exited() {
			t.Fatalf("the holder's lock key is not there within 15 s; its output:\n%s", tail(holder.stderr(), 600))
		}
	}

	cpu0 := c.runTime()
	var waiters []*job
	slowest := time.Duration(0)
	for b := 0; b < n/100; b++ {
		began := time.Now()
		for i := range 100 {
			waiters = append(waiters, lock(fmt.Sprintf("w%04d", b*100+i), "true"))
		}
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			want := int64(1 + len(waiters) - countExited(waiters))
			if got, err := queued(); err == nil && got == want {
				break
			}
		}
		slowest = max(slowest, time.Since(began))
	}
	enqueueCPU := c.runTime() - cpu0
	failed := countExited(waiters)
	shown := map[int]bool{}
	for _, j := range waiters {
		if j.exited() && !shown[j.code] {
			shown[j.code] = true
			t.Logf("%s exited %d (one of each status); output:\n%s", j.name, j.code, tail(j.stderr(), 800))
		}
	}
	record(t, "yardstick: etcdctl lock, enqueue bursts of 100 ("+size+")", "(yardstick)",
		fmt.Sprintf("%d of %d exited instead of waiting (%s); slowest burst queued in %s; members' CPU while they queued %s, %.2f ms per waiter",
			failed, n, fmtCodes(exitsOf(waiters)), ms(slowest), ms(enqueueCPU), float64(enqueueCPU)/float64(time.Millisecond)/float64(n)), true)
	var live []*job
	for _, w := range waiters {
		if !w.exited() {
			live = append(live, w)
		}
	}
	if len(live) == 0 {
		t.Fatal("no etcdctl lock waiter is waiting")
	}
	time.Sleep(3 * time.Second)
	before, wakes0 := schedstat(live)
	m0 := c.runTime()
	time.Sleep(window)
	after, wakes1 := schedstat(live)
	members := c.runTime() - m0
	core := float64(after-before) / float64(window) * 100
	per200 := core * 200 / float64(len(live))
	wakes := float64(wakes1-wakes0) / window.Seconds() / float64(len(live))
	record(t, fmt.Sprintf("yardstick: etcdctl lock idle waiters, TTL 30 s (%d waiters, %s)", len(live), window), "(yardstick)",
		fmt.Sprintf("%.2f%% of a core for %d, %.2f%% per 200 (%.1f thread wake-ups per second per waiter); the members %.2f%% of a core",
			core, len(live), per200, wakes, float64(members)/float64(window)*100), true)
}
