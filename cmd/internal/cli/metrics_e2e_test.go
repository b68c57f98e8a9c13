package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// TestMetricsAfterRuns drives real slotctl processes on a bbolt store
// through admitted, busy (--wait ran out), superseded, reaped and lost
// runs, then parses slotctl metrics back with expfmt and checks every
// series against the store's own Counts and Snapshot, and the counters
// against what the script did; promtool checks the same output.
func TestMetricsAfterRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes; skipped with -short")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "slots.db")
	env := []string{"HOME=" + dir, "XDG_CONFIG_HOME=" + filepath.Join(dir, "cfg"), "XDG_STATE_HOME=" + filepath.Join(dir, "state"),
		"SLOTCTL_STORE=" + path, "PATH=" + filepath.Dir(slotctlPath(t)) + ":" + os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0", testguard.Env()}
	slotctl := func(extraEnv []string, args ...string) *exec.Cmd {
		cmd := exec.Command("slotctl", args...)
		cmd.Env = append(append([]string{}, env...), extraEnv...)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}
	run := func(want int, extraEnv []string, args ...string) string {
		t.Helper()
		cmd := slotctl(extraEnv, args...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		out, err := cmd.Output()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("slotctl %s: %v", strings.Join(args, " "), err)
		}
		if code != want {
			t.Fatalf("slotctl %s: exit %d, want %d\n%s", strings.Join(args, " "), code, want, errb.String())
		}
		return string(out)
	}
	start := func(args ...string) (*exec.Cmd, chan int) {
		t.Helper()
		cmd := slotctl(nil, args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		done := make(chan int, 1)
		go func() {
			err := cmd.Wait()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				done <- ee.ExitCode()
				return
			}
			done <- 0
		}()
		return cmd, done
	}
	waitExit := func(what string, done chan int, want int) {
		t.Helper()
		select {
		case code := <-done:
			if code != want {
				t.Fatalf("%s: exit %d, want %d", what, code, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: still running after 30s", what)
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	st, err := boltstore.New(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	waiting := func(limit string) int {
		snap, err := st.Snapshot(ctx, limit)
		if err != nil || len(snap.Limits) != 1 {
			return -1
		}
		return snap.Limits[0].Waiting
	}

	// Three plain runs: admitted and released.
	for range 3 {
		run(0, nil, "run", "--limit", "m", "--", "true")
	}
	// A holder with a lease short enough to see lost soon, long enough that
	// a loaded machine does not lose it by itself.
	_, holder := start("run", "--limit", "m", "--ttl", "6s", "--", "sh", "-c", "touch held; exec sleep 60")
	waitFor("the holder", func() bool { _, err := os.Stat(filepath.Join(dir, "held")); return err == nil })
	// Busy: --wait runs out.
	run(exitBusy, nil, "run", "--limit", "m", "--wait", "200ms", "--", "true")
	// Superseded: a waiter of key k, then a newer run of k with --supersede
	// that is not admitted either (busy).
	_, older := start("run", "--limit", "m", "--key", "k", "--", "touch", "older-ran")
	waitFor("the older waiter", func() bool { return waiting("m") == 1 })
	run(exitBusy, nil, "run", "--limit", "m", "--key", "k", "--supersede", "--wait", "0", "--", "true")
	waitExit("the superseded waiter", older, exitBusy)
	// Reaped and lost: to a process an hour ahead the holder's lease has
	// expired; its admission reaps it, and the holder finds its lease lost.
	run(0, []string{"SLOTCTLTEST_CLOCK_OFFSET=1h"}, "run", "--limit", "m", "--no-wait", "--", "true")
	waitExit("the holder whose lease was lost", holder, exitLost)
	// Now a holder and a waiter on a second limit, for the gauges.
	_, _ = start("run", "--limit", "n", "--", "sh", "-c", "touch held-n; exec sleep 60")
	waitFor("the holder of n", func() bool { _, err := os.Stat(filepath.Join(dir, "held-n")); return err == nil })
	_, _ = start("run", "--limit", "n", "--", "true")
	waitFor("the waiter of n", func() bool { return waiting("n") == 1 })
	time.Sleep(1100 * time.Millisecond) // ages of at least a second

	text := run(0, nil, "metrics")
	counts, err := st.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fams := parseMetrics(t, []byte(text))
	byLimit := map[string]store.Counts{}
	for _, c := range counts {
		byLimit[c.Limit] = c
	}
	m := byLimit["m"]
	for name, want := range map[string]uint64{"admitted": 5, "released": 4, "busy": 2, "superseded": 1, "reaped": 1, "lost": 1, "cancelled": 0, "replaced": 0, "force_released": 0} {
		if got := countsField(m, name); got != want {
			t.Errorf("store's %s count of m = %d, want %d (the script's)", name, got, want)
		}
	}
	for _, l := range snap.Limits {
		c := byLimit[l.Name]
		for _, n := range []string{"admitted", "released", "cancelled", "busy", "superseded", "replaced", "reaped", "lost", "force_released"} {
			name := "slotctl_limit_" + n + "_total"
			if got, want := metricValue(t, fams, name, l.Name), float64(countsField(c, n)); got != want {
				t.Errorf("%s{limit=%q} = %v, store says %v", name, l.Name, got, want)
			}
		}
		for _, h := range []struct {
			name string
			h    store.Histogram
		}{{metricWaitTime, c.Wait}, {metricHoldTime, c.Hold}} {
			s, _ := series(fams, h.name, l.Name)
			ph := s.GetHistogram()
			if ph.GetSampleCount() != h.h.Count || ph.GetSampleSum() != h.h.Sum {
				t.Errorf("%s{limit=%q}: count %d sum %v, store says %d %v", h.name, l.Name, ph.GetSampleCount(), ph.GetSampleSum(), h.h.Count, h.h.Sum)
			}
			var cum uint64
			for i, b := range ph.Bucket[:len(store.HistogramBounds)] {
				if i < len(h.h.Buckets) {
					cum += h.h.Buckets[i]
				}
				if b.GetUpperBound() != store.HistogramBounds[i] || b.GetCumulativeCount() != cum {
					t.Errorf("%s{limit=%q} bucket le=%v: %d, store says %d (le=%v)", h.name, l.Name, b.GetUpperBound(), b.GetCumulativeCount(), cum, store.HistogramBounds[i])
				}
			}
		}
		for name, want := range map[string]float64{metricSlots: float64(l.Slots), metricHeld: float64(l.Held), metricWaiting: float64(l.Waiting)} {
			if got := metricValue(t, fams, name, l.Name); got != want {
				t.Errorf("%s{limit=%q} = %v, snapshot says %v", name, l.Name, got, want)
			}
		}
	}
	if c := byLimit["m"]; c.Wait.Count != c.Admitted || c.Hold.Count == 0 {
		t.Errorf("m: %d waits for %d admissions, %d holds", c.Wait.Count, c.Admitted, c.Hold.Count)
	}
	if h, w := metricValue(t, fams, metricHeld, "n"), metricValue(t, fams, metricWaiting, "n"); h != 1 || w != 1 {
		t.Errorf("n: held %v waiting %v, want 1 1", h, w)
	}
	// The ages: at least the second slept, less than the test has run.
	for _, name := range []string{metricWaiterAge, metricHolderAge} {
		if age := metricValue(t, fams, name, "n"); age < 1 || age > 120 {
			t.Errorf("%s{limit=\"n\"} = %v, want 1..120", name, age)
		}
		if age := metricValue(t, fams, name, "m"); age != 0 {
			t.Errorf("%s{limit=\"m\"} = %v, want 0 (none)", name, age)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "older-ran")); err == nil {
		t.Errorf("the superseded waiter ran its command")
	}
	promtoolCheck(t, []byte(text))
}

// countsField is a counter of c by its metric's name, read here and not
// through metrics.go's table, so that a wrong entry there is caught.
func countsField(c store.Counts, name string) uint64 {
	return map[string]uint64{"admitted": c.Admitted, "released": c.Released, "cancelled": c.Cancelled, "busy": c.Busy,
		"superseded": c.Superseded, "replaced": c.Replaced, "reaped": c.Reaped, "lost": c.Lost, "force_released": c.ForceReleased}[name]
}
