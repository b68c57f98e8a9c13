//go:build bench

package cli

// The counters' cost on the uncontended run, before/after (the goal: at
// most 5% on `run -- true`, median of 30 interleaved runs), on the
// comparison harness's helpers (compare_test.go):
//
//	SLOTCTL_BENCH=1 go test -tags bench ./cmd/internal/cli -run CountersCost -v
//	SLOTCTL_BENCH_BEFORE=<git ref> SLOTCTL_BENCH_RUNS=30 ...  # default 1dcad69
//	SLOTCTL_BENCH_AFTER=<git ref> ...   # build "after" from a ref, not the tree
//
// The tree's "after" has the counters and the metrics command's encoder
// (its package inits): SLOTCTL_BENCH_AFTER=wt-counts measures the counters
// alone, SLOTCTL_BENCH_BEFORE=wt-counts the encoder alone.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestCountersCost compares `slotctl run --limit x -- true` built from
// SLOTCTL_BENCH_BEFORE (default 1dcad69: the contract, before any backend
// kept counters) with the tree under test, each on its own store, 30
// interleaved runs (SLOTCTL_BENCH_RUNS), released builds. The goal: the
// median after is at most 5% above the median before.
func TestCountersCost(t *testing.T) {
	if os.Getenv("SLOTCTL_BENCH") != "1" {
		t.Skip("set SLOTCTL_BENCH=1 to compare run -- true before and after the counters")
	}
	ref := os.Getenv("SLOTCTL_BENCH_BEFORE")
	if ref == "" {
		ref = "1dcad69"
	}
	runs := cmpEnvInt("SLOTCTL_BENCH_RUNS", 30)
	dir := t.TempDir()
	before, after := filepath.Join(dir, "before"), filepath.Join(dir, "after")
	buildRef(t, ref, filepath.Join(dir, "before-src"), before)
	afterRef := os.Getenv("SLOTCTL_BENCH_AFTER")
	if afterRef == "" {
		afterRef = "the tree"
		buildSlotctl(t, after, releaseSlotctl)
	} else {
		buildRef(t, afterRef, filepath.Join(dir, "after-src"), after)
	}
	bins := []string{before, after}
	times := make([][]time.Duration, 2)
	for i := -1; i < runs; i++ {
		for k := range bins {
			j := (k + max(i, 0)) % 2
			sub := filepath.Join(dir, fmt.Sprint(j))
			cmd := exec.Command(bins[j], "run", "--limit", "x", "--", "true")
			cmd.Env = cmpEnv(sub)
			t0 := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s run: %v\n%s", bins[j], err, out)
			}
			if i >= 0 {
				times[j] = append(times[j], time.Since(t0))
			}
		}
	}
	b, a := cmpPct(times[0], 50), cmpPct(times[1], 50)
	r := float64(a) / float64(b)
	msg := fmt.Sprintf("run --limit x -- true: before (%s) median %s p90 %s; after (%s) median %s p90 %s: %.3f× (goal ≤ 1.05×, %d interleaved runs)",
		ref, cmpMS(b), cmpMS(cmpPct(times[0], 90)), afterRef, cmpMS(a), cmpMS(cmpPct(times[1], 90)), r, runs)
	t.Log(msg)
	fmt.Println(msg)
}

// buildRef builds slotctl from git ref (git archive into src) to bin, like the release.
func buildRef(t *testing.T, ref, src, bin string) {
	t.Helper()
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C ../../.. archive %s | tar -x -C %s", ref, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", ref, err, out)
	}
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/slotctl")
	build.Dir, build.Env = src, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", ref, err, out)
	}
}
