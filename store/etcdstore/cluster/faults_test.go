package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

// The figures of the fault scenarios: --ttl 6s, limit 2, jobs of
// one second each, on all three members.
const (
	faultTTL  = "6s"
	faultJobs = 30
	lateJobs  = 6 // started during a fault
	jobLength = time.Second
)

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

// startBatch starts n jobs of jobLength on every member's endpoint, named
// PREFIX00, PREFIX01, ...
func startBatch(js *jobs, c *cluster, prefix string, n int) {
	url := storeURL(js.prefix, c.endpoints()...)
	for i := range n {
		js.start(fmt.Sprintf("%s%02d", prefix, i), url, jobLength, false, "--ttl", faultTTL, "--wait", "120s")
	}
}

// TestPausedMember: one member (the leader, then a follower) SIGSTOPped for
// 10 s, past the 6 s TTL, with a quorum still up, while 30 jobs go through a
// limit of 2 (and 6 more arrive 3 s into the pause). Goal: no exit 76 (no ticket lost, waiting or held), no
// overlap, admissions go on during the pause.
func TestPausedMember(t *testing.T) {
	skipUnlessEnabled(t)
	for _, which := range []string{"leader", "follower"} {
		t.Run(which, func(t *testing.T) {
			c := startCluster(t)
			js := newJobs(t, "pause", "pause", 2)
			js.obs = c.observe(js.prefix)
			target := c.leader()
			if which == "follower" {
				target = c.follower()
			}
			startBatch(js, c, "j", faultJobs)
			time.Sleep(3 * time.Second)
			var resumeAt time.Time
			pauseAt := time.Now()
			c.pause(target)
			t.Logf("%s paused m%d (the %s)", pauseAt.Format("15:04:05.000"), target, which)
			defer func() { t.Logf("%s resumed m%d", resumeAt.Format("15:04:05.000"), target) }()
			// Jobs keep arriving: new processes, whose first requests may
			// go to the paused member.
			time.Sleep(3 * time.Second)
			startBatch(js, c, "late", lateJobs)
			time.Sleep(time.Until(pauseAt.Add(10 * time.Second)))
			c.resume(target)
			resumeAt = time.Now()
			js.waitAll(120 * time.Second)
			v := js.verify(c)
			most := v.most
			codes := js.exitCodes()
			// A paused leader, as it resumes, revokes the leases that
			// "expired" in its stale view (its lessor saw no renewal for
			// 10 s), and the revokes commit: etcd-io/etcd#15247 was fixed by
			// checking leadership before revoking (ensureLeadership), but
			// the check is skipped while the member's raft ticks are
			// recent (isActive), which they are at once after SIGCONT. Live
			// leases go, held ones included; a settle keeps those tickets
			// under holds that their holders take over (docs/leases.md
			// rule 16), so that no job pays for it.
			deleted := js.obs.deletedTicketsBetween(resumeAt, resumeAt.Add(time.Second))
			staleRevoke := which == "leader" && deleted > 0
			if staleRevoke {
				t.Logf("%d ticket keys were deleted within 1 s of resuming m%d: the ex-leader's stale lessor revoked their leases (etcd-io/etcd#15247); its log on leases:\n%s",
					deleted, target, c.members[target].grepLog("lease", "revok"))
			}
			if most > js.slots {
				_, when := maxConcurrent(js.intervals())
				js.explain(when)
				for i, m := range c.members {
					t.Logf("m%d's log on leases:\n%s", i, m.grepLog("lease", "revok"))
				}
			}
			during := js.admittedBetween(pauseAt, resumeAt)
			stall, _ := js.longestStall(pauseAt, resumeAt)
			met := codes[76] == 0 && most <= js.slots && during > 0 && v.porcupine == "Ok"
			measured := fmt.Sprintf("%d exits 76 (%s); most children at once %d (porcupine %s); %d admitted during the pause, longest stall in it %s", codes[76], fmtCodes(codes), most, v.porcupine, during, ms(stall))
			if staleRevoke {
				measured += fmt.Sprintf("; the resumed leader revoked %d live tickets (etcd-io/etcd#15247)", deleted)
			}
			record(t, "member paused 10 s ("+which+"), --ttl 6s, 30 jobs (+6 started during the pause), limit 2", "0 exits 76, 0 overlaps, admissions continue during the pause", measured, met)
			t.Logf("history: %d jobs, %d tickets in the store, %d operations: porcupine %s; at most %d children at once", len(js.all()), v.tickets, v.ops, v.porcupine, most)
			if v.err != nil {
				t.Errorf("history: %v", v.err)
			}
			if v.porcupine != "Ok" {
				t.Errorf("porcupine: %s on %d operations (not a FIFO semaphore of %d slots):\n%s", v.porcupine, v.ops, js.slots, v.info)
			}
			if most > js.slots {
				t.Errorf("%d children ran at once (limit %d)", most, js.slots)
			}
			if codes[76] != 0 {
				t.Errorf("%d of %d jobs exited 76 with a quorum up", codes[76], faultJobs+lateJobs)
				js.showUnexpected(0, 2)
			}
			if during == 0 {
				t.Errorf("nobody was admitted during the 10 s pause of the %s", which)
			}
			if codes[0] != faultJobs+lateJobs {
				t.Errorf("exits: %s; want all %d to exit 0", fmtCodes(codes), faultJobs+lateJobs)
				if codes[76] == 0 {
					js.showUnexpected(0, 3)
				}
			}
		})
	}
}

// TestLeaderKilled: the leader SIGKILLed, restarted 5 s later, while 20 jobs
// go through a limit of 2 (and 6 more arrive during the election). Goal: the longest stretch with jobs waiting and
// a slot free is at most 3 s; no overlap.
func TestLeaderKilled(t *testing.T) {
	skipUnlessEnabled(t)
	c := startCluster(t)
	js := newJobs(t, "kill", "kill", 2)
	js.obs = c.observe(js.prefix)
	const n = 20
	startBatch(js, c, "j", n)
	time.Sleep(3 * time.Second)
	old := c.leader()
	killAt := time.Now()
	c.kill(old)
	startBatch(js, c, "late", lateJobs) // arriving during the election
	_, electedAt, ok := c.waitNewLeader(old, 10*time.Second)
	time.Sleep(time.Until(killAt.Add(5 * time.Second)))
	c.restart(old)
	js.waitAll(120 * time.Second)
	most := js.check(c)
	first, last := time.Time{}, time.Time{}
	for _, j := range js.all() {
		if first.IsZero() || j.start.Before(first) {
			first = j.start
		}
		if j.exit.After(last) {
			last = j.exit
		}
	}
	stall, at := js.longestStall(first, last)
	codes := js.exitCodes()
	election := "no new leader within 10 s"
	if ok {
		election = ms(electedAt.Sub(killAt))
	}
	met := stall <= 3*time.Second && most <= js.slots
	record(t, "leader SIGKILL, restarted 5 s later (20 jobs, +6 started during the election, limit 2)", "longest stall with waiters and free slots ≤ 3 s; 0 overlaps",
		fmt.Sprintf("longest stall %s (began %s the kill); new leader after %s; most children at once %d; %s", ms(stall), relative(at.Sub(killAt)), election, most, fmtCodes(codes)), met)
	if stall > 3*time.Second {
		t.Errorf("admissions stalled %s with jobs waiting and a slot free (goal: at most 3 s)", ms(stall))
	}
	if codes[0] != n+lateJobs {
		t.Errorf("exits: %s; want all %d to exit 0", fmtCodes(codes), n+lateJobs)
		js.showUnexpected(0, 2)
	}
}

// TestRollingRestart: every member stopped (SIGTERM) and started again in
// turn while 30 jobs go through a limit of 2. Goal: all 30 exit 0.
func TestRollingRestart(t *testing.T) {
	skipUnlessEnabled(t)
	c := startCluster(t)
	js := newJobs(t, "roll", "roll", 2)
	js.obs = c.observe(js.prefix)
	url := storeURL(js.prefix, c.endpoints()...)
	for i := range faultJobs { // 2 s each: the work outlasts the restarts
		js.start(fmt.Sprintf("j%02d", i), url, 2*time.Second, false, "--ttl", faultTTL, "--wait", "120s")
	}
	time.Sleep(2 * time.Second)
	began := time.Now()
	var steps, stops []string
	for i := range c.members {
		t0 := time.Now()
		c.stop(i)
		t1 := time.Now()
		time.Sleep(time.Second)
		c.restart(i)
		steps = append(steps, fmt.Sprintf("m%d: stop %s, start %s", i, ms(t1.Sub(t0)), ms(time.Since(t1)-time.Second)))
		stops = append(stops, ms(t1.Sub(t0)))
		time.Sleep(time.Second)
	}
	took := time.Since(began)
	t.Logf("rolling restart: %s", strings.Join(steps, "; "))
	js.waitAll(120 * time.Second)
	most := js.check(c)
	codes := js.exitCodes()
	// Not a goal of the issue, but what an operator sees: how long
	// admissions stopped while the members restarted.
	stall, _ := js.longestStall(began, began.Add(took))
	admittedDuring := js.admittedBetween(began, began.Add(took))
	record(t, "rolling restart of all members under 30 jobs", "all 30 exit 0",
		fmt.Sprintf("%s; most children at once %d; the restart took %s (SIGTERM to exit: %s), %d admitted meanwhile, longest stall %s",
			fmtCodes(codes), most, ms(took), strings.Join(stops, ", "), admittedDuring, ms(stall)), codes[0] == faultJobs && most <= js.slots)
	if codes[0] != faultJobs {
		t.Errorf("exits: %s; want all %d to exit 0", fmtCodes(codes), faultJobs)
		js.showUnexpected(0, 2)
	}
}

// TestHolderReachesOnlyPausedMember: a holder whose --store names one
// member only; that member (a follower) is paused 10 s, past the TTL, while
// the others go on. The holder cannot renew: it must stop its child before
// its lease can expire (exit 76), and its slot goes to a waiter only after
// that; the jobs on all three members go on and exit 0.
func TestHolderReachesOnlyPausedMember(t *testing.T) {
	skipUnlessEnabled(t)
	c := startCluster(t)
	js := newJobs(t, "only", "only", 2)
	js.obs = c.observe(js.prefix)
	f := c.follower()
	h := js.start("holder", storeURL(js.prefix, c.members[f].cfg.Client), 120*time.Second, false, "--ttl", faultTTL, "--wait", "30s")
	waitFile(t, filepath.Join(js.dir, "holder.start"), 15*time.Second)
	const n = 10
	startBatch(js, c, "j", n)
	time.Sleep(2 * time.Second)
	pauseAt := time.Now()
	c.pause(f)
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
	}
	time.Sleep(time.Until(pauseAt.Add(10 * time.Second)))
	c.resume(f)
	js.waitAll(120 * time.Second)
	most := js.check(c)
	hEnd := h.childEnd
	// The first child to start after the holder's ended took its slot.
	var next time.Time
	for _, j := range js.all() {
		if j != h && j.childStart.After(hEnd) && (next.IsZero() || j.childStart.Before(next)) {
			next = j.childStart
		}
	}
	codes := js.exitCodes()
	codes[h.code]-- // the others'
	nextAfter := "none"
	if !next.IsZero() {
		nextAfter = ms(next.Sub(hEnd)) + " after that"
	}
	met := h.code == 76 && most <= js.slots && codes[0] == n
	record(t, "holder reaching only the paused member (paused 10 s, --ttl 6s)", "its child stopped before its slot is reused (exit 76); others exit 0; 0 overlaps",
		fmt.Sprintf("holder exit %d, its child stopped %s after the pause; next admission: %s; others: %s; most children at once %d",
			h.code, ms(hEnd.Sub(pauseAt)), nextAfter, fmtCodes(codes), most), met)
	if h.code != 76 {
		t.Errorf("the holder exited %d, want 76 (lease lost, child stopped); stderr:\n%s", h.code, tail(h.stderr(), 1500))
	}
	if codes[0] != n {
		t.Errorf("the jobs on all members: %s; want all %d to exit 0", fmtCodes(codes), n)
	}
}

// pidDeath returns a channel that gets the time pid dies (a pidfd becomes
// readable when the process exits, whoever its parent is).
func pidDeath(t *testing.T, pid int) <-chan time.Time {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	ch := make(chan time.Time, 1)
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != syscall.EINTR {
				break
			}
		}
		ch <- time.Now()
	}()
	return ch
}

// TestHolderCutOff: a holder that reaches the cluster only through proxies
// the test cuts (a partition: nothing answers, nothing closes). Its child
// must be dead, every process of it, before the waiter behind it (on the
// members directly) starts — also when the child ignores SIGTERM, and only
// SIGKILL stops it.
func TestHolderCutOff(t *testing.T) {
	skipUnlessEnabled(t)
	for _, ignore := range []bool{false, true} {
		name := "child stops on SIGTERM"
		if ignore {
			name = "child ignores SIGTERM"
		}
		t.Run(map[bool]string{false: "term", true: "ignore-term"}[ignore], func(t *testing.T) {
			c := startCluster(t)
			js := newJobs(t, "cut", "cut", 1)
			var proxies []*proxy
			var via []string
			for _, m := range c.members {
				p := newProxy(t, m.cfg.Client)
				proxies = append(proxies, p)
				via = append(via, p.addr())
			}
			h := js.start("holder", storeURL(js.prefix, via...), 120*time.Second, ignore, "--ttl", faultTTL)
			waitFile(t, filepath.Join(js.dir, "holder.sleeppid"), 15*time.Second)
			shDead := pidDeath(t, int(readInt(filepath.Join(js.dir, "holder.pid"))))
			sleepDead := pidDeath(t, int(readInt(filepath.Join(js.dir, "holder.sleeppid"))))
			w := js.start("waiter", storeURL(js.prefix, c.endpoints()...), jobLength, false, "--ttl", faultTTL, "--wait", "60s")
			waitTickets(t, c, js.prefix, js.limit, 2)
			time.Sleep(1500 * time.Millisecond) // a renewal goes through the proxies first
			cutAt := time.Now()
			for _, p := range proxies {
				p.setCut(true)
			}
			var dead time.Time
			for _, ch := range []<-chan time.Time{shDead, sleepDead} {
				select {
				case at := <-ch:
					if at.After(dead) {
						dead = at
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("the cut-off holder's child still runs 30 s after the cut")
				}
			}
			js.waitAll(60 * time.Second)
			for _, p := range proxies {
				p.setCut(false)
			}
			h.died = dead // what the pidfds saw, not what the child wrote
			js.check(c)
			wStart := w.childStart
			met := !wStart.IsZero() && dead.Before(wStart) && h.code == 76
			record(t, "holder cut off by the proxy ("+name+")", "its child is dead before its replacement starts",
				fmt.Sprintf("child dead %s after the cut, replacement started %s after it (gap %s); holder exit %d, replacement exit %d",
					ms(dead.Sub(cutAt)), ms(wStart.Sub(cutAt)), ms(wStart.Sub(dead)), h.code, w.code), met)
			if wStart.IsZero() {
				t.Fatalf("the waiter never ran (exit %d); stderr:\n%s", w.code, tail(w.stderr(), 1500))
			}
			if !dead.Before(wStart) {
				t.Errorf("the replacement started at %s, the cut-off holder's child died at %s: they overlapped", wStart.Format(time.StampMicro), dead.Format(time.StampMicro))
			}
			if h.code != 76 {
				t.Errorf("the holder exited %d, want 76; stderr:\n%s", h.code, tail(h.stderr(), 1500))
			}
		})
	}
}

func waitFile(t *testing.T, path string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for readInt(path) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %s", filepath.Base(path), within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ticketCount is how many tickets limit has in the store.
func ticketCount(c *cluster, prefix, limit string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := c.cli.Get(ctx, "/"+prefix+"/tickets/"+limit+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return r.Count, nil
}

// waitTickets waits until limit has n tickets.
func waitTickets(t *testing.T, c *cluster, prefix, limit string, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := ticketCount(c, prefix, limit)
		if err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tickets in %q after 30s (err %v), want %d", got, limit, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChecksCatchAnOverlap: the checks fail on a real overlap. A holder cut
// off by the proxies runs with --on-lost continue, so its child goes on
// after its lease expired and the waiter behind it was admitted: porcupine
// must call the history illegal, and the interval check must see two
// children in one slot. (The model's own cases are
// TestModelRefusesOverlapAndQueueJumping; this is the whole pipeline, from
// processes and the store's replay to the verdict.)
func TestChecksCatchAnOverlap(t *testing.T) {
	skipUnlessEnabled(t)
	c := startCluster(t)
	js := newJobs(t, "overlap", "overlap", 1)
	var proxies []*proxy
	var via []string
	for _, m := range c.members {
		p := newProxy(t, m.cfg.Client)
		proxies = append(proxies, p)
		via = append(via, p.addr())
	}
	h := js.start("holder", storeURL(js.prefix, via...), 12*time.Second, false, "--ttl", faultTTL, "--on-lost", "continue")
	waitFile(t, filepath.Join(js.dir, "holder.start"), 15*time.Second)
	w := js.start("waiter", storeURL(js.prefix, c.endpoints()...), jobLength, false, "--ttl", faultTTL, "--wait", "60s")
	waitTickets(t, c, js.prefix, js.limit, 2)
	time.Sleep(1500 * time.Millisecond)
	for _, p := range proxies {
		p.setCut(true)
	}
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not admitted within 30 s of the cut")
	}
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder did not exit within 30 s of the cut")
	}
	for _, p := range proxies {
		p.setCut(false)
	}
	v := js.verify(c)
	t.Logf("holder exit %d, waiter exit %d: porcupine %s, at most %d children at once", h.code, w.code, v.porcupine, v.most)
	if v.err != nil {
		t.Errorf("history: %v", v.err)
	}
	if v.porcupine != "Illegal" {
		t.Errorf("porcupine says %s on a history where the waiter ran beside the holder's child", v.porcupine)
	}
	if v.most != 2 {
		t.Errorf("the interval check saw at most %d children at once, want 2 (the overlap)", v.most)
	}
}

// relative says d as "N ms after" or "N ms before".
func relative(d time.Duration) string {
	if d < 0 {
		return ms(-d) + " before"
	}
	return ms(d) + " after"
}
