//go:build bench

package cli

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/pgtest"
)

// TestComparePostgres measures slotctl on PostgreSQL side by side with the
// embedded store and flock, interleaved so that the machine's noise hits
// them alike:
//
//	go test -tags bench -run ComparePostgres -v ./cmd/internal/cli
//
// The server is the tests' own (internal/testkit/pgtest: a Unix socket,
// fsync off) unless SLOTCTL_PG_URL names one. SLOTCTL_BENCH_RUNS sets the
// runs of each (default 30). It reports medians and ratios; it asserts
// nothing, since timings on a shared machine are not a pass/fail.
//
// Two measures: an uncontended run of "true" (start to exit), and the
// handoff on a mutex: the holder's child exits, the waiter's child starts.
func TestComparePostgres(t *testing.T) {
	runs := benchRuns(30)
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("flock not found")
	}
	dir := t.TempDir()
	bin, binEtcd := filepath.Join(dir, "slotctl"), filepath.Join(dir, "slotctl-etcd")
	buildSlotctl(t, bin, releaseSlotctl)
	buildSlotctl(t, binEtcd, releaseSlotctlEtcd)
	bolt := cmpEnv(dir)
	pg := append(cmpEnv(dir), "SLOTCTL_STORE="+pgtest.URL(t)) // the later SLOTCTL_STORE wins

	type tool struct {
		name   string
		env    []string
		run    func(limit string, argv ...string) *exec.Cmd
		queued func(limit string) bool
	}
	queuedOn := func(env []string) func(string) bool {
		return func(limit string) bool {
			c := exec.Command(binEtcd, "limit", "ls", "-o", "json", limit)
			c.Env = env
			out, _ := c.Output()
			return strings.Contains(string(out), `"waiting": 1,`)
		}
	}
	tools := []tool{
		{"slotctl run, embedded store", bolt, benchRunWith(bin), queuedOn(bolt)},
		{"slotctl run (execs slotctl-etcd), postgres", pg, benchRunWith(bin), queuedOn(pg)},
		{"slotctl-etcd run, postgres", pg, benchRunWith(binEtcd), queuedOn(pg)},
		{"flock FILE true", bolt, func(limit string, argv ...string) *exec.Cmd {
			return exec.Command(flock, append([]string{filepath.Join(dir, limit+".flock")}, argv...)...)
		}, nil},
		{"true (exec alone)", bolt, func(string, ...string) *exec.Cmd { return exec.Command("true") }, nil},
	}
	const ref = 3 // flock

	times := make([][]time.Duration, len(tools))
	for i := -1; i < runs; i++ { // run -1 warms up caches and creates the limit
		for j, tl := range tools {
			cmd := tl.run("x", "true")
			cmd.Env = tl.env
			start := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", tl.name, err, out)
			}
			if i >= 0 {
				times[j] = append(times[j], time.Since(start))
			}
		}
	}
	handTools := tools[:len(tools)-1]
	hand := make([][]time.Duration, len(handTools))
	for i := 0; i < runs; i++ {
		for j, tl := range handTools {
			hand[j] = append(hand[j], handoff(t, dir, tl.env, tl.run, tl.queued, fmt.Sprintf("h%d", j)))
		}
	}

	q := benchQuantile
	fmt.Printf("%-44s %10s %10s %10s\n", "uncontended run", "median", "p90", "vs flock")
	for j, tl := range tools {
		fmt.Printf("%-44s %10s %10s %9.2fx\n", tl.name, q(times[j], 50), q(times[j], 90), float64(q(times[j], 50))/float64(q(times[ref], 50)))
	}
	fmt.Printf("%-44s %10s %10s %10s\n", "handoff (child exit -> next child start)", "p50", "p95", "max")
	for j, tl := range handTools {
		fmt.Printf("%-44s %10s %10s %10s\n", tl.name, q(hand[j], 50), q(hand[j], 95), q(hand[j], 100))
	}
	fmt.Printf("(%d interleaved runs each, %s)\n", runs, time.Now().UTC().Format(time.RFC3339))
}
