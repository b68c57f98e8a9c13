//go:build bench

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestCompareOverhead measures slotctl run's own cost side by side with its
// peers, interleaved so that the machine's noise hits all alike:
//
//	go test -tags bench -run Compare -v ./cmd/slotctl
//
// SLOTCTL_BENCH_RUNS sets the number of runs of each (default 30). A peer
// that is not installed is skipped. It reports medians and ratios; it
// asserts nothing, since timings on a shared machine are not a pass/fail.
func TestCompareOverhead(t *testing.T) {
	runs := 30
	if n, err := strconv.Atoi(os.Getenv("SLOTCTL_BENCH_RUNS")); err == nil && n > 0 {
		runs = n
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "slotctl")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("build slotctl: %v", err)
	}
	store := filepath.Join(dir, "store", "slots.db")
	lockfile := filepath.Join(dir, "flock.lock")
	type peer struct {
		name string
		argv []string
	}
	peers := []peer{
		{"slotctl run --limit x -- true", []string{bin, "run", "--store", store, "--limit", "x", "--", "true"}},
		{"flock FILE true", []string{"flock", lockfile, "true"}},
		{"sem --fg --id x true", []string{"sem", "--will-cite", "--fg", "--id", "slotctl-bench-" + strconv.Itoa(os.Getpid()), "true"}},
		{"true (exec alone)", []string{"true"}},
	}
	var avail []peer
	for _, p := range peers {
		if _, err := exec.LookPath(p.argv[0]); err != nil {
			t.Logf("skipping %q: %s not installed", p.name, p.argv[0])
			continue
		}
		avail = append(avail, p)
	}
	times := make([][]time.Duration, len(avail))
	for i := -1; i < runs; i++ { // run -1 warms up caches and creates the store
		for j, p := range avail {
			cmd := exec.Command(p.argv[0], p.argv[1:]...)
			cmd.Env = append(os.Environ(), "HOME="+dir)
			start := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", p.name, err, out)
			}
			if i >= 0 {
				times[j] = append(times[j], time.Since(start))
			}
		}
	}
	ref := map[string]time.Duration{}
	for j, p := range avail {
		slices.Sort(times[j])
		ref[p.name] = times[j][len(times[j])/2]
	}
	fmt.Printf("%-32s %10s %10s %10s\n", "command", "median", "p90", "vs flock")
	for j, p := range avail {
		ts := times[j]
		med, p90 := ts[len(ts)/2], ts[len(ts)*9/10]
		ratio := "-"
		if f, ok := ref["flock FILE true"]; ok {
			ratio = fmt.Sprintf("%.2fx", float64(med)/float64(f))
		}
		fmt.Printf("%-32s %10s %10s %10s\n", p.name, med.Round(10*time.Microsecond), p90.Round(10*time.Microsecond), ratio)
	}
	fmt.Printf("(%d interleaved runs each, %s)\n", runs, time.Now().UTC().Format(time.RFC3339))
}
