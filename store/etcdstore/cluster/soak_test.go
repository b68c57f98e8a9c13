package cluster

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

// TestFaultSoak (SLOTCTL_CLUSTER_SOAK=1): for SLOTCTL_CLUSTER_SOAK_TIME
// (default 5m) jobs of half a second go through a limit of 2, about ten
// queued at any time, while one fault at a time hits a random member, 4 s
// after the last one ended: paused 8 s (past the TTL), SIGKILLed and
// restarted 5 s later, or stopped (SIGTERM) and started again. A quorum is always up, so every job must exit
// 0; the whole history must be a FIFO semaphore's.
func TestFaultSoak(t *testing.T) {
	skipUnlessEnabled(t)
	if !soak {
		t.Skip("a soak of minutes: SLOTCTL_CLUSTER_SOAK=1")
	}
	length := 5 * time.Minute
	if d, err := time.ParseDuration(os.Getenv("SLOTCTL_CLUSTER_SOAK_TIME")); err == nil && d > 0 {
		length = d
	}
	c := startCluster(t)
	js := newJobs(t, "soak", "soak", 2)
	js.obs = c.observe(js.prefix)
	url := storeURL(js.prefix, c.endpoints()...)
	end := time.Now().Add(length)
	stop := make(chan struct{})
	fed := make(chan int)
	go func() { // keep about ten jobs running or queued
		n := 0
		defer func() { fed <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			live := 0
			for _, j := range js.all() {
				if !j.exited() {
					live++
				}
			}
			for ; live < 10; live++ {
				js.start(fmt.Sprintf("s%05d", n), url, 500*time.Millisecond, false, "--ttl", faultTTL, "--wait", "120s")
				n++
			}
		}
	}()
	var faults []string
	for time.Now().Before(end) {
		time.Sleep(4 * time.Second)
		i := rand.IntN(len(c.members))
		role := "follower"
		if i == c.leader() {
			role = "leader"
		}
		switch rand.IntN(3) {
		case 0:
			c.pause(i)
			time.Sleep(8 * time.Second)
			c.resume(i)
			faults = append(faults, "pause "+role)
		case 1:
			c.kill(i)
			time.Sleep(5 * time.Second)
			c.restart(i)
			faults = append(faults, "kill "+role)
		case 2:
			c.stop(i)
			time.Sleep(time.Second)
			c.restart(i)
			faults = append(faults, "restart "+role)
		}
	}
	close(stop)
	started := <-fed
	js.waitAll(150 * time.Second)
	most := js.check(c)
	codes := js.exitCodes()
	first, last := time.Now(), time.Time{}
	for _, j := range js.all() {
		if j.start.Before(first) {
			first = j.start
		}
		if j.exit.After(last) {
			last = j.exit
		}
	}
	stall, _ := js.longestStall(first, last)
	record(t, fmt.Sprintf("soak: %s of faults, %d jobs, limit 2", length, started), "all exit 0; porcupine legal; 0 overlaps",
		fmt.Sprintf("%s; most children at once %d; longest stall %s; faults: %s", fmtCodes(codes), most, ms(stall), strings.Join(faults, ", ")), codes[0] == started && most <= js.slots)
	if codes[0] != started {
		t.Errorf("exits: %s; want all %d to exit 0", fmtCodes(codes), started)
		js.showUnexpected(0, 3)
	}
}
