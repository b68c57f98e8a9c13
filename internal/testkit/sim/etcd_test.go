package sim_test

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/internal/testkit/sim"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// TestSimEtcd runs the simulation over the etcd store, on one embedded
// server (a key prefix per run). Its clock is real time (sim.Etcd), so a
// run is randomized, not replayable, and lasts as long as the time it
// simulates: the runs go side by side, each mostly asleep. The first
// failure of each rule prints its run's trace, not a reduction (a rerun is
// another run).
//
// Soak: SLOTCTL_LONG=1 (or SLOTCTL_SIM_ETCD_SEEDS and SLOTCTL_SIM_STEPS).
func TestSimEtcd(t *testing.T) {
	seeds := envInt(t, "SLOTCTL_SIM_ETCD_SEEDS", longtest.Pick(12, 96))
	steps := *flagSteps
	if steps == 0 {
		steps = envInt(t, "SLOTCTL_SIM_STEPS", longtest.Pick(100, 400))
	}
	faults, err := sim.ParseFaults(*flagFaults)
	if err != nil {
		t.Fatal(err)
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	// Seeds from the clock: a run on etcd never replays, so each test run
	// explores others.
	seed0 := uint64(time.Now().UnixNano())
	if v := os.Getenv("SLOTCTL_SIM_SEED0"); v != "" {
		seed0 = uint64(envInt(t, "SLOTCTL_SIM_SEED0", 1))
	}
	start := time.Now()
	results := etcdRuns(t, srv, seeds, sim.Config{Seed: seed0, Steps: steps, Faults: faults})
	var total sim.Stats
	// Runs whose lag passed the shortest margin (TTL/10 of 5 s): their
	// rules of the store's clock were judged with a slack wider than it.
	const shortestMargin = 500 * time.Millisecond
	failed, loose := 0, 0
	traced := map[string]bool{} // the rules whose first failure's trace was printed
	for _, r := range results {
		s := r.Stats
		total.Steps += s.Steps
		total.StoreCalls += s.StoreCalls
		total.Holders += s.Holders
		total.Admitted += s.Admitted
		total.Lost += s.Lost
		total.Crashes += s.Crashes
		total.Pauses += s.Pauses
		total.Reaped += s.Reaped
		total.Faults += s.Faults
		total.Superseded += s.Superseded
		total.Replaced += s.Replaced
		total.Resizes += s.Resizes
		total.PolicyRuns += s.PolicyRuns
		total.PauseOverlaps += s.PauseOverlaps
		total.LostAnswers += s.LostAnswers
		total.Revokes += s.Revokes
		total.RevokeOverlap = max(total.RevokeOverlap, s.RevokeOverlap)
		total.DiedInCall += s.DiedInCall
		total.DiedSuperseding += s.DiedSuperseding
		total.RecordsReleased += s.RecordsReleased
		total.RevokedLate += s.RevokedLate
		total.MaxLag = max(total.MaxLag, s.MaxLag)
		if s.MaxLag > shortestMargin {
			loose++
		}
		if r.Violation == nil {
			continue
		}
		failed++
		if rule := r.Violation.Rule; !traced[rule] {
			traced[rule] = true
			tr := r.Trace
			if len(tr) > 400 {
				tr = tr[len(tr)-400:]
			}
			t.Errorf("seed %d (etcd, not replayable): %v\n%s", r.Config.Seed, r.Violation, strings.Join(tr, "\n"))
		} else {
			t.Errorf("seed %d (etcd, not replayable): %v", r.Config.Seed, r.Violation)
		}
	}
	t.Logf("%d runs from seed %d × %d steps on etcd in %v: %d steps, %d store calls; %d holders, %d admitted, %d leases lost, "+
		"%d crashes, %d pauses, %d faults, %d reaped, %d superseded, %d replaced, %d resizes, %d runs with policies, %d children ran on past their ticket (S24), %d answers lost after their write committed, %d leases revoked behind their holders' backs (their jobs ran on for up to %v), %d holders died in their enqueue (%d superseding older runs), %d records released after a call found their lease ended, %d reaps before the server revoked a lease past its end; "+
		"real time ran ahead of the simulation's by up to %v (past the shortest margin, %v, in %d runs); %d failed",
		seeds, seed0, steps, time.Since(start).Round(time.Millisecond), total.Steps, total.StoreCalls, total.Holders, total.Admitted, total.Lost,
		total.Crashes, total.Pauses, total.Faults, total.Reaped, total.Superseded, total.Replaced, total.Resizes, total.PolicyRuns, total.PauseOverlaps, total.LostAnswers, total.Revokes, total.RevokeOverlap.Round(time.Millisecond), total.DiedInCall, total.DiedSuperseding, total.RecordsReleased, total.RevokedLate, total.MaxLag.Round(time.Millisecond), shortestMargin, loose, failed)
}

// etcdRuns runs n runs of c on srv, from seed c.Seed on, several at once.
func etcdRuns(t *testing.T, srv *etcdtest.Server, n int, c sim.Config) []sim.Result {
	d := &dirs{root: t.TempDir()}
	side := longtest.Pick(12, 16) // runs at once: each sleeps through most of its time
	results := make([]sim.Result, n)
	sem := make(chan struct{}, side)
	var wg sync.WaitGroup
	for k := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c := c
			c.Seed, c.Dir, c.Backend, c.Trace = c.Seed+uint64(k), d.next(), sim.NewEtcd(srv.Endpoint), true
			results[k] = sim.Run(c)
		})
	}
	wg.Wait()
	return results
}
