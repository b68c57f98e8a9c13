package cli

// The cost of slotctl metrics on a large store (goal: 100 limits and
// 10,000 tickets in at most 100 ms) and of the counters on the
// uncontended run (goal: at most 5% on `run -- true`, median of 30
// interleaved runs, before/after). Neither asserts a figure: the machine
// is shared; run them on a quiet one.
//
//	go test ./cmd/internal/cli -run XXX -bench Metrics100x10k -benchtime 10x
//	SLOTCTL_BENCH=1 go test ./cmd/internal/cli -run MetricsBinaryMedian -v
//	SLOTCTL_BENCH=1 go test -tags bench ./cmd/internal/cli -run CountersCost -v   # metrics_compare_test.go

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkMetrics100x10k is slotctl metrics in-process on 10,000 tickets
// across 100 limits, output discarded; it reports the median per run.
func BenchmarkMetrics100x10k(b *testing.B) {
	e := newLsEnv(b)
	lsBigStore(b, e.store)
	var times []time.Duration
	for b.Loop() {
		f, _, errOut := lsFactory(e.env, nil, false, 0)
		f.IO.Out = io.Discard
		t0 := time.Now()
		if code := Main(context.Background(), []string{"metrics"}, f); code != 0 {
			b.Fatalf("exit %d: %s", code, errOut)
		}
		times = append(times, time.Since(t0))
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2])/float64(time.Millisecond), "median-ms")
}

// TestMetricsBinaryMedian times the whole slotctl metrics command, as a
// process, on the 10,000-ticket store: 15 runs, stdout to /dev/null.
func TestMetricsBinaryMedian(t *testing.T) {
	if os.Getenv("SLOTCTL_BENCH") != "1" {
		t.Skip("set SLOTCTL_BENCH=1 to time slotctl metrics on 10,000 tickets")
	}
	bin := lsBin(t)
	e := newLsEnv(t)
	lsBigStore(t, e.store)
	const runs = 15
	run := func(args ...string) time.Duration {
		cmd := exec.Command(bin, args...)
		cmd.Env = lsProcEnv(e)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		t0 := time.Now()
		if err := cmd.Run(); err != nil {
			t.Fatalf("slotctl %s: %v: %s", strings.Join(args, " "), err, errb.String())
		}
		return time.Since(t0)
	}
	run("metrics")
	var times []time.Duration
	for range runs {
		times = append(times, run("metrics"))
	}
	slices.Sort(times)
	msg := fmt.Sprintf("slotctl metrics on 10,000 tickets / 100 limits: median %s (min %s, max %s, %d runs; goal ≤ 100ms)",
		times[runs/2].Round(100*time.Microsecond), times[0].Round(100*time.Microsecond), times[runs-1].Round(100*time.Microsecond), runs)
	t.Log(msg)
	fmt.Println(msg)
}
