//go:build slotctl_mutations

package sim_test

import (
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/internal/testkit/sim"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// Budget for finding each mutation.
const (
	mutSeeds = 200
	mutSteps = 500
)

// mutFaults is the faults a bug is searched with: all for the bugs of
// scheduling policies, which need runs with policies; all but sim.Policies
// and sim.StoreLost for the others, so that they are found in the
// FIFO-only runs they always were, at the same seeds and steps (switching
// those off leaves every other draw of a seed as it was). Runs with
// policies find most of them too, at other seeds.
//
// The hosts' clocks (sim.ClockDrift, sim.Suspend) are searched only for
// the bug that needs them, and stalls with the store's lock held
// (sim.StoreLock) for none, nor the store's file restored or cut
// (sim.Restore, sim.Truncate): the others are found as they were, with
// one clock, a free lock and the file left alone, at the same seeds and
// steps. held-no-more needs a restored copy to happen at all.
func mutFaults(bug mutation.Bug) sim.FaultSet {
	switch bug {
	case mutation.OrderFirstLimit, mutation.RateStale, mutation.AgingOff:
		return nil
	}
	fs := sim.FaultSet{}
	for _, f := range sim.AllFaults() {
		if f != sim.Policies && f != sim.StoreLost && f != sim.StoreLock && (f != sim.Restore || bug == mutation.HeldNoMore) && f != sim.Truncate && (bug == mutation.MonotonicDeadline || f != sim.ClockDrift && f != sim.Suspend) {
			fs[f] = true
		}
	}
	return fs
}

// masked are the bugs that another defence covers, with the bugs that take
// that defence away, and the rule that catches those alone (ignored, so
// that what is caught is the bug itself). The guard stops a job at the
// lease's end by itself: it covers a drain that no longer watches the
// lease, and a supervisor resumed late that gives the job its whole kill
// grace, unless it was never told the lease (guard-untold, S29).
var masked = map[mutation.Bug]struct {
	with   []mutation.Bug
	ignore []string
}{
	mutation.DrainBlind:    {[]mutation.Bug{mutation.GuardUntold}, []string{"S29"}},
	mutation.LateLossGrace: {[]mutation.Bug{mutation.GuardUntold}, []string{"S29"}},
}

// mutations is bug switched on, with what would mask it switched off.
func mutations(bug mutation.Bug) mutation.Set {
	return mutation.Of(append([]mutation.Bug{bug}, masked[bug].with...)...)
}

// TestMutationsCaught switches each known bug back on and asserts that the
// simulation finds it within mutSeeds seeds of mutSteps steps, and that the
// failing run replays to the same violation.
func TestMutationsCaught(t *testing.T) {
	backend := simStore(t)
	for _, bug := range mutation.All() {
		t.Run(string(bug), func(t *testing.T) {
			if bug == mutation.WallClock && backend != nil {
				t.Skip("a bug of the embedded store's own clock")
			}
			if bug == mutation.LateRenewalDeath && backend != nil {
				// Only a host-local store proves a waiter's supervisor
				// alive and keeps its expired ticket: elsewhere a late
				// waiter is swept, and the bug changes nothing S28 sees.
				t.Skip("a bug of the embedded store's patience with live waiters")
			}
			if bug == mutation.HeldNoMore && backend != nil {
				// Only a restored copy of the store's file makes a held
				// ticket wait again, and only the embedded store has a
				// file the simulation restores.
				t.Skip("made only by a restored copy of the embedded store's file")
			}
			if bug == mutation.LostRecounted {
				t.Skip("a bug of the etcd store: TestEtcdMutationCaught")
			}
			if bug == mutation.SupersedeFirst {
				t.Skip("a bug of the etcd store: TestEtcdSupersedeFirstCaught")
			}
			if bug == mutation.CommitIgnored {
				t.Skip("needs a disk that fails: TestSimDiskMutation (root)")
			}
			if storeKind() == "etcd" && bug.InStore() {
				t.Skip("not switched in the etcd store")
			}
			t.Parallel()
			d := &dirs{root: t.TempDir()}
			steps := 0
			for seed := uint64(1); seed <= mutSeeds; seed++ {
				c := sim.Config{Seed: seed, Steps: mutSteps, Faults: mutFaults(bug), Mutations: mutations(bug), Ignore: masked[bug].ignore, Dir: d.next(), Backend: backend}
				r := sim.Run(c)
				steps += r.Stats.Steps
				v := r.Violation
				if v == nil {
					continue
				}
				t.Logf("%s caught at seed %d, step %d (%d steps searched): %v", bug, seed, v.Step, steps, v)
				// A violation in the random phase replays with the budget
				// cut to its step; one found in the quiescent phase after it
				// replays with the same budget.
				c.Steps, c.Dir = min(v.Step, c.Steps), d.next()
				again := sim.Run(c)
				if again.Violation == nil || *again.Violation != *v {
					t.Errorf("replay with -steps %d found %v, not the same violation", c.Steps, again.Violation)
				}
				return
			}
			t.Errorf("%s: not caught in %d seeds × %d steps (%d steps)", bug, mutSeeds, mutSteps, steps)
		})
	}
}

// TestReduce checks the failure report: the reduced run breaks the same
// rule, in no more steps, and its command replays it.
func TestReduce(t *testing.T) {
	d := &dirs{root: t.TempDir()}
	var r sim.Result
	for seed := uint64(1); seed <= mutSeeds && r.Violation == nil; seed++ {
		r = sim.Run(sim.Config{Seed: seed, Steps: mutSteps, Mutations: mutation.Of(mutation.ReleaseNoCompare), Dir: d.next()})
	}
	if r.Violation == nil {
		t.Fatal("release-no-compare not caught")
	}
	red := sim.Reduce(r, d.next)
	if red.Violation == nil || red.Violation.Rule != r.Violation.Rule {
		t.Fatalf("reduced run: %v, want a %s violation", red.Violation, r.Violation.Rule)
	}
	if red.Config.Steps > r.Violation.Step || len(red.Trace) != red.Violation.Step {
		t.Errorf("reduced to %d steps (trace %d lines), more than the original violation's step %d", red.Config.Steps, len(red.Trace), r.Violation.Step)
	}
	c := red.Config
	c.Dir, c.Trace = d.next(), false
	if again := sim.Run(c); again.Violation == nil || *again.Violation != *red.Violation {
		t.Errorf("the replay command's config found %v, not %v", again.Violation, red.Violation)
	}
	t.Logf("\n%s", sim.Report(r, red, 30))
}

// TestMutationConsequences: the supervisor-side bugs are caught by a rule
// about the holder itself (S9: its deadline; S10: release after exit). With
// that rule ignored, the simulation still finds what the bug does: a child
// running past its ticket's end on the store's clock (S30), and with that
// ignored too, once its ticket is gone, without a lease (S2). Hold-and-wait is caught as a job holding
// while it waits (L9); with that ignored, as the deadlock it makes: a cycle
// of waiting jobs (L10); with that ignored too, as jobs that never finish
// once the faults stop (L2).
func TestMutationConsequences(t *testing.T) {
	for _, c := range []struct {
		bug    mutation.Bug
		ignore []string
		want   string
	}{
		{mutation.WaiterNotRenewed, []string{"S9"}, "S30"},
		{mutation.WaiterNotRenewed, []string{"S9", "S30"}, "S2"},
		{mutation.ReleaseBeforeExit, []string{"S10"}, "S2"},
		{mutation.HoldAndWait, []string{"L9"}, "L10"},
		{mutation.HoldAndWait, []string{"L9", "L10"}, "L2"},
		{mutation.SupersedeHeld, []string{"S17"}, "S2"},
	} {
		t.Run(string(c.bug)+"-"+c.want, func(t *testing.T) {
			t.Parallel()
			d := &dirs{root: t.TempDir()}
			steps := 0
			for seed := uint64(1); seed <= mutSeeds; seed++ {
				r := sim.Run(sim.Config{Seed: seed, Steps: mutSteps, Faults: mutFaults(c.bug), Mutations: mutation.Of(c.bug), Ignore: c.ignore, Dir: d.next()})
				steps += r.Stats.Steps
				if v := r.Violation; v != nil {
					t.Logf("with %v ignored: caught at seed %d, step %d (%d steps searched): %v", c.ignore, seed, v.Step, steps, v)
					if v.Rule != c.want {
						t.Errorf("caught by %s, want %s", v.Rule, c.want)
					}
					return
				}
			}
			t.Errorf("with %v ignored: not caught in %d seeds × %d steps", c.ignore, mutSeeds, mutSteps)
		})
	}
}

// TestPausedOverlapBound: a supervisor that resumes past its lease gives
// its job the whole kill grace (late-loss-grace), so the job runs on beside
// the slot's next holder longer than the bound of S24. Only S24 sees it: the
// child is still gone within the grace of the resume, which every other
// rule allows, so with S24 ignored the same seed runs clean (and so do all
// mutSeeds seeds). Seed and step as TestMutationsCaught finds them.
func TestPausedOverlapBound(t *testing.T) {
	const seed, step = 10, 420
	d := &dirs{root: t.TempDir()}
	m := masked[mutation.LateLossGrace]
	c := sim.Config{Seed: seed, Steps: step, Faults: mutFaults(mutation.LateLossGrace), Mutations: mutations(mutation.LateLossGrace), Ignore: m.ignore, Dir: d.next()}
	r := sim.Run(c)
	if v := r.Violation; v == nil || v.Rule != "S24" || v.Step != step {
		t.Fatalf("late-loss-grace at seed %d: %v, want S24 at step %d", seed, v, step)
	}
	c.Steps, c.Ignore, c.Dir = mutSteps, append([]string{"S24"}, m.ignore...), d.next()
	r = sim.Run(c)
	if r.Violation != nil || r.Stats.Ignored == 0 {
		t.Fatalf("with S24 ignored: %v, %d ignored; want no other rule broken and S24's breaches counted", r.Violation, r.Stats.Ignored)
	}
}

// TestRecordedMutations: the bugs of the death judge (internal/proc, read
// through the simulation's process table), of the guard's absence, of the
// drain and of a local store's patience with late waiters, each at the
// seed and step where TestMutationsCaught finds it, by the rule that
// catches it, and the same seed clean without it: a holder on a clone of
// the store's host proven dead by pids that are not its own (S25), a
// supervisor in a time namespace judged gone (S25), a replayed record's
// job killed after its release (S27), a SIGKILLed supervisor's
// descendants running on (S26), a drain that no longer watches the lease
// letting what the command left run past the lease (S9), a waiter whose
// supervisor provably runs swept for a late renewal (S28), a terminal's
// job drained by its command alone (S26) — each a defect once found from
// outside, with real processes —, and a guard never told its lease, so
// that the job of a supervisor stopped alone runs past the lease (S29),
// and a lost guard's orphans left running (S26), and a renewal as held
// of a ticket that a restored copy of the store's file has waiting again
// accepted (S46). A masked bug runs with
// what masks it switched on too (masked).
func TestRecordedMutations(t *testing.T) {
	for _, c := range []struct {
		bug        mutation.Bug
		seed, step int
		rule       string
	}{
		{mutation.HostNameIdentity, 1, 82, "S25"},
		{mutation.TimensIgnored, 1, 273, "S25"},
		{mutation.ReplayedKill, 58, 435, "S27"},
		{mutation.PdeathsigOnly, 1, 141, "S26"},
		{mutation.DrainBlind, 13, 108, "S9"},
		{mutation.LateRenewalDeath, 1, 446, "S28"},
		{mutation.ForegroundUndrained, 1, 616, "S26"},
		{mutation.GuardUntold, 1, 490, "S29"},
		{mutation.OrphansLeft, 5, 405, "S26"},
		{mutation.HoldNotAdopted, 1, 458, "S9"},
		{mutation.HeldNoMore, 1, 244, "S46"},
	} {
		t.Run(string(c.bug), func(t *testing.T) {
			t.Parallel()
			d := &dirs{root: t.TempDir()}
			// A violation past mutSteps is in the quiescent phase that
			// follows the random one: it replays with the budget.
			steps := min(c.step, mutSteps)
			r := sim.Run(sim.Config{Seed: uint64(c.seed), Steps: steps, Faults: mutFaults(c.bug), Mutations: mutations(c.bug), Ignore: masked[c.bug].ignore, Dir: d.next()})
			if v := r.Violation; v == nil || v.Rule != c.rule || v.Step != c.step {
				t.Fatalf("%s at seed %d: %v, want %s at step %d", c.bug, c.seed, v, c.rule, c.step)
			}
			r = sim.Run(sim.Config{Seed: uint64(c.seed), Steps: steps, Faults: mutFaults(c.bug), Mutations: mutation.Of(masked[c.bug].with...), Ignore: masked[c.bug].ignore, Dir: d.next()})
			if r.Violation != nil {
				t.Fatalf("without %s, seed %d: %v", c.bug, c.seed, r.Violation)
			}
		})
	}
}

// TestSuspendClock: a supervisor that keeps its deadlines on
// CLOCK_MONOTONIC (monotonic-deadline) is caught only across a suspend of
// its host, at the seed and step where TestMutationsCaught finds it: it
// counts on a lease that the store's clock already spent (S9). Without
// suspends the same seed runs clean, as any one-clock run does (both
// clocks read alike). With S9 ignored, what the bug does is caught: the
// job runs on past its ticket's end on the store's clock (S30) or past the
// bound after the resume (S31).
func TestSuspendClock(t *testing.T) {
	const seed, step = 2, 218
	bug := mutation.MonotonicDeadline
	d := &dirs{root: t.TempDir()}
	c := sim.Config{Seed: seed, Steps: step, Faults: mutFaults(bug), Mutations: mutation.Of(bug), Dir: d.next()}
	if v := sim.Run(c).Violation; v == nil || v.Rule != "S9" || v.Step != step {
		t.Fatalf("%s at seed %d: %v, want S9 at step %d", bug, seed, v, step)
	}
	c.Steps, c.Dir = mutSteps, d.next()
	delete(c.Faults, sim.Suspend)
	if v := sim.Run(c).Violation; v != nil {
		t.Fatalf("%s at seed %d without suspends: %v", bug, seed, v)
	}
	steps := 0
	for seed := uint64(1); seed <= mutSeeds; seed++ {
		r := sim.Run(sim.Config{Seed: seed, Steps: mutSteps, Faults: mutFaults(bug), Mutations: mutation.Of(bug), Ignore: []string{"S9"}, Dir: d.next()})
		steps += r.Stats.Steps
		if v := r.Violation; v != nil {
			t.Logf("with S9 ignored: caught at seed %d, step %d (%d steps searched): %v", seed, v.Step, steps, v)
			if v.Rule != "S30" && v.Rule != "S31" {
				t.Errorf("caught by %s, want S30 or S31", v.Rule)
			}
			return
		}
	}
	t.Errorf("with S9 ignored: not caught in %d seeds × %d steps", mutSeeds, mutSteps)
}

// TestEtcdMutationCaught: the etcd store's own bug, lost-recounted (a
// repeated "lost" release counted again), is caught as counts that are not
// the log's tally (S22, at quiescence). Runs on etcd do not replay: the
// budget is a number of runs, side by side, from seeds of the clock. It
// needs a lease lost, its holder's release sent twice, and the run ending
// clean: at 100 steps a run found it about once in 30 runs (and once not
// in 96), so this is a long test, of longer runs; at 400 steps the first
// batch found it.
func TestEtcdMutationCaught(t *testing.T) {
	longtest.Skip(t, "lost-recounted on etcd, up to 96 runs of 400 steps")
	// The faults that lose leases (pauses, renewals late or failing) and
	// send a release again (late duplicates), and nothing else.
	lostFaults := sim.FaultSet{sim.Pause: true, sim.RenewDelay: true, sim.RenewFail: true, sim.Retry: true}
	const runs, batch = 96, 16
	srv := etcdtest.Start(t, etcdtest.Options{})
	seed := uint64(time.Now().UnixNano())
	for n := 0; n < runs; n += batch {
		for _, r := range etcdRuns(t, srv, batch, sim.Config{Seed: seed + uint64(n), Steps: 400, Faults: lostFaults, Mutations: mutation.Of(mutation.LostRecounted)}) {
			if v := r.Violation; v != nil {
				t.Logf("caught in the runs %d-%d (seed %d, step %d): %v", n+1, n+batch, r.Config.Seed, v.Step, v)
				if v.Rule != "S22" {
					t.Errorf("caught by %s, want S22", v.Rule)
				}
				return
			}
		}
	}
	t.Errorf("lost-recounted: not caught in %d runs on etcd", runs)
}

// TestEtcdSupersedeFirstCaught: the etcd store's supersede-first (a
// superseding enqueue that removes the older waiting runs of its key in a
// transaction before its ticket's) is caught when a holder dies between
// the two (etcd-crash-in-call) as runs superseded for a ticket that was
// never written (S40), or, with --max-waiting, as removals that a refused
// enqueue wrote (S20: its queue refuses the ticket once its removals
// committed, with no crash at all). Runs on etcd do not replay: the budget is a number
// of runs, side by side, from seeds of the clock. The first batch of 12
// runs of 150 steps found it in each of the tries so far. A batch
// without the bug comes first: its holders die in superseding enqueues
// that had older runs to remove, and nothing is found (the removals and
// the ticket are one transaction).
func TestEtcdSupersedeFirstCaught(t *testing.T) {
	faults := sim.FaultSet{sim.EtcdCrashInCall: true}
	const runs, batch = 48, 12
	srv := etcdtest.Start(t, etcdtest.Options{})
	seed := uint64(time.Now().UnixNano())
	died := 0
	for n := 0; n < 3*batch && died == 0; n += batch {
		for _, r := range etcdRuns(t, srv, batch, sim.Config{Seed: seed, Steps: 150, Faults: faults}) {
			if v := r.Violation; v != nil {
				t.Fatalf("without the bug, seed %d: %v", r.Config.Seed, v)
			}
			died += r.Stats.DiedSuperseding
		}
		seed += batch
	}
	t.Logf("without the bug: %d holders died in a superseding enqueue with older runs to remove, nothing found", died)
	if died == 0 {
		t.Errorf("without the bug: no holder died in a superseding enqueue with older runs to remove in %d runs: the control tests nothing", 3*batch)
	}
	for n := 0; n < runs; n += batch {
		for _, r := range etcdRuns(t, srv, batch, sim.Config{Seed: seed + uint64(n), Steps: 150, Faults: faults, Mutations: mutation.Of(mutation.SupersedeFirst)}) {
			if v := r.Violation; v != nil {
				t.Logf("caught in the runs %d-%d (seed %d, step %d): %v", n+1, n+batch, r.Config.Seed, v.Step, v)
				// S40, or S20 when the enqueue had --max-waiting: its
				// removals commit, then the queue refuses its ticket.
				if v.Rule != "S40" && v.Rule != "S20" {
					t.Errorf("caught by %s, want S40 or S20", v.Rule)
				}
				return
			}
		}
	}
	t.Errorf("supersede-first: not caught in %d runs on etcd", runs)
}
