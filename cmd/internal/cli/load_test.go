package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
)

// burn starts n busy loops, each its own process, killed when the test ends.
func burn(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		})
	}
}

// TestLoadIsNotDeath: with the CPU oversubscribed twice over (two busy
// loops a core), a churn of short jobs on 2s leases and a queue of waiters
// behind a holder lose no run: no exit 76 (a late renewal taken for a
// death), no exit 69 (a store busy with the others' writes). Waiters not
// yet in line write nothing, and a waiter that finds the store locked keeps
// trying (docs/leases.md rule 17).
//
// Long only: the claim is for a machine loaded twice over, which this test
// makes itself; beside the rest of go test ./... the machine is loaded more.
func TestLoadIsNotDeath(t *testing.T) {
	longtest.Skip(t, "loads the machine twice over for a minute")
	e := newPTEnvAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	burn(t, 2*runtime.NumCPU())
	waiters := 200
	if n, err := strconv.Atoi(os.Getenv("SLOTCTLTEST_LOAD_WAITERS")); err == nil && n > 0 {
		waiters = n
	}

	t.Run("churn", func(t *testing.T) {
		const n = 40
		ps := make([]*ptProc, n)
		for i := range ps {
			ps[i] = e.start(ctx, fmt.Sprintf("churn%02d", i), "run", "--limit", "churn", "--slots", "3", "--ttl", "2s", "--", "sleep", "0.3")
		}
		bad := 0
		for _, p := range ps {
			if code := p.wait(t, 3*time.Minute); code != 0 {
				bad++
				t.Errorf("%s exited %d, want 0; stderr:\n%s", p.name, code, p.stderr())
			}
		}
		t.Logf("%d runs of sleep 0.3 on 3 slots with 2s leases beside %d busy loops: %d lost", n, 2*runtime.NumCPU(), bad)
	})

	t.Run("waiters", func(t *testing.T) {
		// The default lease: the enqueues of a whole queue at once, on a
		// machine this busy, hold the store's lock for seconds together.
		gate, started := e.path("go"), e.path("started")
		holder := e.start(ctx, "holder", "run", "--limit", "queue", "--", "sh", "-c",
			fmt.Sprintf(": > %s; while [ ! -e %s ]; do sleep 0.05; done", started, gate))
		for {
			if _, err := os.Stat(started); err == nil {
				break
			}
			select {
			case <-holder.done:
				t.Fatalf("the holder exited %d before its job started; stderr:\n%s", holder.cmd.ProcessState.ExitCode(), holder.stderr())
			case <-time.After(20 * time.Millisecond):
			}
		}
		ps := make([]*ptProc, waiters)
		for i := range ps {
			ps[i] = e.start(ctx, fmt.Sprintf("waiter%03d", i), "run", "--limit", "queue", "--", "true")
		}
		// Every waiter says it waits once its ticket is written.
		deadline := time.Now().Add(3 * time.Minute)
		for _, p := range ps {
			for !strings.Contains(p.stderr(), "waiting for limit") {
				select {
				case <-p.done:
					t.Fatalf("%s exited %d before it waited; stderr:\n%s", p.name, p.cmd.ProcessState.ExitCode(), p.stderr())
				case <-time.After(50 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s did not join the queue within 3m", p.name)
				}
			}
		}
		time.Sleep(3 * time.Second)
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		bad := 0
		for _, p := range append([]*ptProc{holder}, ps...) {
			if code := p.wait(t, 3*time.Minute); code != 0 {
				bad++
				t.Errorf("%s exited %d, want 0; stderr:\n%s", p.name, code, p.stderr())
			}
		}
		t.Logf("%d waiters behind a holder beside %d busy loops: %d lost", waiters, 2*runtime.NumCPU(), bad)
	})
}
