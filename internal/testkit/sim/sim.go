package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// A Fault is one kind of trouble (or optional behaviour) the scheduler may
// inject. Every kind can be switched off, which is how a failing run is
// reduced to fewer kinds.
type Fault string

// The faults, and the optional actors the scheduler may drop.
const (
	Crash      Fault = "crash"       // an actor stops for good
	Pause      Fault = "pause"       // a supervisor is stopped, then resumes
	RenewDelay Fault = "renew-delay" // a renewal's request or answer is late
	RenewFail  Fault = "renew-fail"  // a renewal fails, before or after the store ran it; outages
	Restart    Fault = "restart"     // every store handle is dropped and opened again
	WallJump   Fault = "wall-jump"   // the wall clock steps forward or back
	Retry      Fault = "retry"       // a late duplicate of an earlier request
	LostReply  Fault = "lost-reply"  // an enqueue fails with an unknown outcome
	Reboot     Fault = "reboot"      // every process dies; new boot id
	Signal     Fault = "signal"      // SIGTERM to a supervisor
	OpRelease  Fault = "op-release"  // an operator releases a ticket by hand
	OpResize   Fault = "op-resize"   // an operator resizes or pauses a limit
	Judge      Fault = "judge"       // reapers may prove a holder dead (else only the TTL frees)
	LostRing   Fault = "lost-ring"   // a bell's ring is lost: its holder learns at its next poll or renewal
	JobResize  Fault = "job-resize"  // a job grows and shrinks its ticket while it runs (a jobserver's slots)
	Policies   Fault = "policies"    // limits order by priority or fairly and rate admissions; an operator changes them (sched.go)
	StoreLost  Fault = "store-lost"  // the store's file is deleted under running holders (an operator starting afresh)
	ClockDrift Fault = "clock-drift" // other hosts' boot clocks have their own offset and rate (clocks.go)
	Suspend    Fault = "suspend"     // a host sleeps: its processes stop, its timers fire late (clocks.go)
	StoreLock  Fault = "store-lock"  // a stalled process holds the store's file lock (storelock.go)
	DiskFull   Fault = "disk-full"   // the store's file system is full for a while (diskfault.go; runs with a Config.Disk)
	Restore    Fault = "restore"     // the store's file is replaced by an older copy (restore.go)
	Truncate   Fault = "truncate"    // the store's file is cut short, then deleted (restore.go)

	EtcdLostAnswer  Fault = "etcd-lost-answer"   // etcd: a write commits, its answer is lost (etcdfault.go)
	PgLostAnswer    Fault = "pg-lost-answer"     // PostgreSQL: a COMMIT runs, its answer is lost (pgfault.go)
	EtcdRevoke      Fault = "etcd-revoke"        // etcd: a held ticket's lease is revoked behind its holder's back (etcdfault.go)
	EtcdCrashInCall Fault = "etcd-crash-in-call" // etcd: a holder dies in its enqueue, after its first write (etcdfault.go)
)

// AllFaults lists every Fault.
func AllFaults() []Fault {
	return []Fault{Crash, Pause, RenewDelay, RenewFail, Restart, WallJump, Retry, LostReply, Reboot, Signal, OpRelease, OpResize, Judge, LostRing, JobResize, Policies, StoreLost, ClockDrift, Suspend, StoreLock, DiskFull, Restore, Truncate, EtcdLostAnswer, EtcdRevoke, EtcdCrashInCall, PgLostAnswer}
}

// A FaultSet is the kinds switched on; nil means all but the opt-in ones.
type FaultSet map[Fault]bool

// optIn are the faults that only a FaultSet naming them switches on.
var optIn []Fault

// Has reports whether f is on.
func (s FaultSet) Has(f Fault) bool { return s == nil && !slices.Contains(optIn, f) || s[f] }

// String lists the kinds on, comma-separated.
func (s FaultSet) String() string {
	var out []string
	for _, f := range AllFaults() {
		if s.Has(f) {
			out = append(out, string(f))
		}
	}
	return strings.Join(out, ",")
}

// ParseFaults reads a comma-separated list of fault kinds; "all" or "" is all.
func ParseFaults(list string) (FaultSet, error) {
	if list == "" || list == "all" {
		return nil, nil
	}
	s := FaultSet{}
	if list == "none" {
		return s, nil
	}
	for _, name := range strings.Split(list, ",") {
		f := Fault(strings.TrimSpace(name))
		if !slices.Contains(AllFaults(), f) {
			return nil, fmt.Errorf("fault %q: want some of %v, all or none", f, AllFaults())
		}
		s[f] = true
	}
	return s, nil
}

// Config is one run.
type Config struct {
	Seed  uint64
	Steps int // steps of the random phase; a quiescent phase follows
	// Faults switched on; nil means all but the opt-in ones.
	Faults FaultSet
	// Mutations switched on: the store's (passed to the backend) and the
	// holder's. nil in a correct run.
	Mutations mutation.Set
	// Dir holds the store file.
	Dir string
	// Backend makes the store; nil means NewBolt.
	Backend NewBackend
	// Trace records one line per step in Result.Trace.
	Trace bool
	// Ignore lists rules whose violations are counted, not reported, and
	// the run goes on: to show which other rules catch a bug.
	Ignore []string
	// Disk is the file system under Dir, when the test can fill it
	// (fault disk-full, diskfault.go).
	Disk Disk
}

// A Violation is the first rule a run broke.
type Violation struct {
	Step int
	Rule string // S1..S14, L1..L4
	Msg  string
}

func (v *Violation) Error() string { return fmt.Sprintf("step %d: %s: %s", v.Step, v.Rule, v.Msg) }

// Stats sum up a run.
type Stats struct {
	Steps, StoreCalls                 int
	Holders, Admitted, Finished, Lost int
	// Admissions of tickets of several limits, and of weight above 1.
	AdmittedMulti, AdmittedHeavy int
	Crashes, Pauses, Reaped      int
	Faults                       int
	Ignored                      int // violations of Config.Ignore rules
	// Newer runs first: tickets superseded, held tickets asked to stop,
	// runs that ended replaced, holders that heard their stop request by
	// their bell or a renewal, refusals of --max-waiting.
	Superseded, StopRequests, Replaced     int
	HeardByBell, HeardByRenewal, QueueFull int
	// Resizes: calls of Resize by running jobs (docs/leases.md §2.1 item 12);
	// those that grew the ticket, that shrank it, that asked for more and got
	// nothing, and the waiters admitted in the step of a shrink.
	Resizes, Grown, Shrunk, GrowthRefused, ShrinkAdmits int
	// Scheduling policies (sched.go): runs whose limits have them, the
	// operator's changes of a policy, admissions to a limit ordered by
	// priority or fairly and to a rated one, and the admissions the order
	// rules (L11-L13) judged past a waiter that the limit's order puts ahead
	// (none may be: each is a violation or excused by a disagreement).
	PolicyRuns, PolicyChanges, OrderedAdmits, RatedAdmits, OrderJudged, OrderExcused int
	// PauseOverlap is the longest time a child ran on after its ticket's
	// end while its supervisor was stopped (or resumed past its lease and
	// was stopping it), when its slot could be another's: what fencing is
	// for; PauseOverlaps counts those children. Each is within its bound
	// (S24).
	PauseOverlap  time.Duration
	PauseOverlaps int
	// PausesAlone counts the pauses of a supervisor alone, its guard
	// running (S24: the guard stops the job at the lease's end).
	PausesAlone int
	// StoresLost counts the deletions of the store's file (store-lost).
	StoresLost int
	// Suspends of a host (clocks.go), and the supervisors that resumed
	// from one past their lease with their job running (S31).
	Suspends, WokePast int
	// Stalls of a process holding the store's lock (storelock.go), and
	// the calls it refused.
	LockHolds, LockRefused int
	// LostAnswers: answers of the store's writes lost after they
	// committed (etcd: etcdfault.go; PostgreSQL: pgfault.go).
	LostAnswers int
	// Revokes: leases of held tickets revoked behind their holders' backs
	// (etcdfault.go); RevokeOverlap: the longest a job ran on after its
	// lease was revoked (in the random phase; its supervisor not stopped),
	// within S2's bound.
	Revokes       int
	RevokeOverlap time.Duration
	// DiedInCall: holders that died in their enqueue (etcdfault.go);
	// DiedSuperseding: of those, superseding ones that had older waiting
	// runs of their key to remove.
	DiedInCall, DiedSuperseding int
	// RecordsReleased: on etcd, releases that removed the record a call
	// had found without its lease (recordLeft).
	RecordsReleased int
	// RevokedLate: on etcd, reaps that left a ticket past its end by the
	// simulation's clock whose lease the server had not revoked yet.
	RevokedLate int
	Procs       ProcStats
	// MaxLag: on a store with a clock of its own (etcd), the longest time
	// real time ran ahead of the simulation's (Etcd.Lag).
	MaxLag time.Duration

	// File faults (diskfault.go, restore.go): the disk filled, the calls
	// it failed; copies of the store's file taken and restored over it;
	// cuts of the file, and the calls refused as corrupt meanwhile;
	// renewals as held of a ticket waiting again, lost (S46).
	DiskFulls, DiskRefused, Copies, Restores, Truncates, CorruptRefused, HeldNoMore int
}

// ProcStats sum up the process table (ptable.go): where supervisors ran,
// what their jobs were made of, and what the real death judge did there.
type ProcStats struct {
	// Supervisors on a clone of the store's host (its host name) or
	// another host; on the store's host in a pid namespace of their own,
	// in a time namespace; terminals' jobs.
	Clone, OtherHost, PidNS, TimeNS, Foreground int
	// Processes started under jobs (the command's included), of those that
	// moved to a session of their own, ignored SIGTERM, cleared their
	// environment or outlived their command; daemons handed off.
	JobProcs, Setsid, IgnoreTerm, ClearEnv, Outlive, Daemons int
	// Supervisors whose guard was killed with them, or alone (the
	// supervisor killing what carries the job's marks); tickets the judge
	// proved dead in a reap (replayed records included); processes it
	// killed (what an orphaned job left, on its owner's evidence);
	// replayed records it judged.
	GuardKilled, GuardKilledAlone, ProvenDead, JudgeKills, Replays int
}

// Add adds q's counts to p's.
func (p *ProcStats) Add(q ProcStats) {
	p.Clone += q.Clone
	p.OtherHost += q.OtherHost
	p.PidNS += q.PidNS
	p.TimeNS += q.TimeNS
	p.Foreground += q.Foreground
	p.JobProcs += q.JobProcs
	p.Setsid += q.Setsid
	p.IgnoreTerm += q.IgnoreTerm
	p.ClearEnv += q.ClearEnv
	p.Outlive += q.Outlive
	p.Daemons += q.Daemons
	p.GuardKilled += q.GuardKilled
	p.GuardKilledAlone += q.GuardKilledAlone
	p.ProvenDead += q.ProvenDead
	p.JudgeKills += q.JudgeKills
	p.Replays += q.Replays
}

// Result is what a run found.
type Result struct {
	Config    Config
	Violation *Violation
	Stats     Stats
	Trace     []string
}

// Timing of the simulated protocol.
const (
	reapEvery   = 4 * time.Second
	reapGapMax  = 6 * time.Second // between a reaper's scan and its reap
	pollEvery   = 2 * time.Second // gate.DefaultPoll
	maxTick     = 3 * time.Second
	retryWithin = time.Hour // a late request is at most this late (tombstones live a day)
	// reclaimBound: an expired ticket is gone within this (L1).
	reclaimBound = reapEvery*6/5 + reapGapMax + time.Millisecond
)

var ttls = []time.Duration{5 * time.Second, 8 * time.Second, 12 * time.Second}

type limitCfg struct {
	name  string
	slots int
	pol   store.Policy // set at the start (sched.go); the operator may change it
}

type sim struct {
	cfg Config
	rng *rand.Rand
	// resizeRng draws the resizes (resize.go): a stream of their own, so
	// that switching them on leaves the other draws of a seed where they were.
	resizeRng *rand.Rand
	// policyRng draws the scheduling policies, the jobs' priorities and
	// shares and the policy changes (sched.go): a stream of their own, so
	// that the runs that stay FIFO-only keep every draw of their seed.
	policyRng *rand.Rand
	// guardRng draws whether a pause stops the guard with its supervisor:
	// a stream of its own, so that the other draws of a seed stay.
	guardRng *rand.Rand
	// lostRng draws when the store's file is deleted: a stream of its own.
	lostRng *rand.Rand
	// clockRng draws the hosts' clocks and their suspends (clocks.go): a
	// stream of their own too.
	clockRng  *rand.Rand
	lockRng   *rand.Rand    // the stalls with the store's lock held (storelock.go): a stream of their own
	pgRng     *rand.Rand    // the lost answers of PostgreSQL commits (pgfault.go): a stream of their own
	lockFree  time.Duration // when the last stall with the store's lock held ends (L1 counts from it)
	sched     bool          // this run's limits have policies
	wallBacks int           // how many times the wall clock stepped back
	be        Backend
	ctx       context.Context
	step      int
	quiet     bool // the quiescent phase: no faults, no arrivals
	start     time.Duration

	limits  []limitCfg
	holders []*holder
	pt      *ptable
	records []store.Ticket // tickets of finished runs, as their holders last read them: what a member may write back
	reapers []*reaper
	ops     *operator
	netConn *conn // late duplicates travel on their own handle
	checker store.Store
	conns   []*conn

	maxHolders int
	judgeOn    bool
	// aliveOn: the store keeps an expired waiter whose supervisor the
	// judge proves alive (Judges.Alive; S28).
	aliveOn  bool
	rebootAt time.Duration // the boot clock at the last reboot

	// this step
	log    []*op
	judged map[string]bool

	history []request // recent requests, for late duplicates

	m     *model
	viol  *Violation
	stats Stats
	trace []string
	desc  string // what this step did, when tracing

	disk diskState    // the disk filled (diskfault.go): a stream of its own
	rs   restoreState // the file copied and restored, or cut (restore.go): a stream of its own
}

const never = time.Duration(math.MaxInt64)

// Run runs one simulation.
func Run(cfg Config) (res Result) {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5107c71)), resizeRng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x12e512e)),
		policyRng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5c4ed)), guardRng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x6a2d)), lostRng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x10575)),
		lockRng: newLockRng(cfg.Seed), pgRng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9c1057)), ctx: context.Background(),
		judged: map[string]bool{}}
	res.Config = cfg
	defer func() {
		if e, ok := s.be.(*Etcd); ok {
			s.stats.MaxLag = e.MaxLag()
			defer e.Close()
		}
		res.Violation, res.Stats, res.Trace = s.viol, s.stats, s.trace
		for _, h := range s.holders {
			h.crashed = true // whatever a parked run does as it ends reaches no store
			h.kill()         // end the goroutines of the runs still parked
		}
		for _, c := range s.conns {
			c.Close()
		}
		if s.checker != nil {
			s.checker.Close()
		}
	}()
	nb := cfg.Backend
	if nb == nil {
		nb = NewBolt
	}
	be, err := nb(cfg.Dir, Judges{Dead: s.judge, Keep: s.keep, Alive: s.alive}, mutation.InStore(cfg.Mutations))
	if err != nil {
		s.fail("setup", "backend: %v", err)
		return res
	}
	s.be = be
	s.setup()
	s.etcdFaults(true)
	if s.viol != nil {
		return res
	}
	for s.step = 1; s.step <= cfg.Steps && s.viol == nil; s.step++ {
		s.doStep()
	}
	if s.viol == nil {
		s.quiesce()
	}
	if s.viol == nil {
		s.m.countsAgree()
	}
	s.stats.Steps = s.step - 1
	if s.viol != nil {
		s.stats.Steps = s.viol.Step
	}
	return res
}

func (s *sim) setup() {
	r := s.rng
	s.m = newModel(s)
	s.pt = newPtable(s)
	s.newClocks()
	n := 1 + r.IntN(2)
	if multi {
		n = 1 + r.IntN(4)
	}
	for i := range n {
		s.limits = append(s.limits, limitCfg{name: fmt.Sprintf("L%d", i), slots: 1 + r.IntN(3)})
	}
	s.maxHolders = 2 + r.IntN(7)
	s.judgeOn = s.cfg.Faults.Has(Judge) && r.IntN(2) == 0
	if k, ok := s.be.(interface{ KeepsLiveWaiters() bool }); ok {
		s.aliveOn = s.judgeOn && k.KeepsLiveWaiters()
	}
	var err error
	if s.checker, err = s.be.Open(); err != nil {
		s.fail("setup", "open: %v", err)
		return
	}
	s.netConn = s.newConn("net", nil)
	for i := range 2 {
		rp := &reaper{s: s, n: i}
		rp.c = s.newConn(fmt.Sprintf("reaper%d", i), nil)
		rp.next = s.now().Mono + s.jitter(reapEvery)
		s.reapers = append(s.reapers, rp)
	}
	s.ops = &operator{s: s}
	s.ops.c = s.newConn("operator", nil)
	s.start = s.now().Mono
	s.setPolicies()
}

func (s *sim) now() Instant { return s.be.Now() }

// jitter spreads d over d·(1 ± 0.2), as the Keeper does.
func (s *sim) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 + 0.2*(2*s.rng.Float64()-1)))
}

// between is a uniform duration in [a, b].
func (s *sim) between(a, b time.Duration) time.Duration {
	if b <= a {
		return a
	}
	return a + time.Duration(s.rng.Int64N(int64(b-a)+1))
}

func (s *sim) chance(p float64) bool { return s.rng.Float64() < p }

func (s *sim) tracef(format string, args ...any) {
	if s.cfg.Trace {
		if s.desc != "" {
			s.desc += "; "
		}
		s.desc += fmt.Sprintf(format, args...)
	}
}

func (s *sim) fail(rule, format string, args ...any) {
	if slices.Contains(s.cfg.Ignore, rule) {
		s.stats.Ignored++
		return
	}
	if s.viol == nil {
		s.viol = &Violation{Step: s.step, Rule: rule, Msg: fmt.Sprintf(format, args...)}
	}
}

// doStep runs one step and checks the model after it.
func (s *sim) doStep() {
	s.log = s.log[:0]
	clear(s.judged)
	if s.step > 1 {
		s.desc = "" // the first step's line also tells the policies set up (setPolicies)
	}
	before := s.now()
	s.pt.tidy()
	s.pick()
	if s.viol == nil {
		s.checkAside()
	}
	s.stats.StoreCalls += len(s.log)
	if s.cfg.Trace {
		now := s.now()
		t := fmt.Sprintf("%s+%.3fs", now.Boot, (now.Mono - s.start).Seconds())
		if now.Boot != before.Boot {
			t = fmt.Sprintf("%s+%.3fs", now.Boot, now.Mono.Seconds())
		}
		line := fmt.Sprintf("%5d %-16s %s", s.step, t, s.desc)
		if s.viol != nil {
			line += "\n      !! " + s.viol.Error()
		}
		s.trace = append(s.trace, line)
	}
}

// An actor is anything that must act at a time: a holder, a reaper, a
// renewal in flight, an operator's pending release.
type actor interface {
	wake() time.Duration // when it must act next; never if it need not
	act()
}

func (s *sim) actors() []actor {
	var out []actor
	for _, h := range s.holders {
		if h.live() {
			out = append(out, h)
		}
		if c := h.inflight; c != nil && !c.delivered {
			out = append(out, c)
		}
	}
	for _, r := range s.reapers {
		out = append(out, r)
	}
	if s.ops.pending != nil {
		out = append(out, s.ops)
	}
	for _, mc := range s.pt.machines {
		if mc.clk.asleepUntil != 0 {
			out = append(out, resumeActor{s, mc})
		}
	}
	if a, ok := s.lockHeld(); ok {
		out = append(out, a)
	}
	return append(out, s.fileActors()...)
}

// pick chooses this step's action: sometimes a fault, an operator or a new
// holder; else one actor that is due, at random; else time moves on to the
// next moment someone must act.
func (s *sim) pick() {
	if !s.quiet && s.cfg.Faults.Has(StoreLost) && s.lostRng.IntN(1500) == 0 && s.storeLost() {
		return
	}
	if !s.quiet && s.fileFault() {
		return
	}
	if !s.quiet && s.cfg.Faults.Has(JobResize) && s.resizeRng.Float64() < 0.04 && s.resizeOne() {
		return
	}
	if !s.quiet && s.sched && s.policyRng.Float64() < policyChange && s.changePolicy() {
		return
	}
	if !s.quiet && s.cfg.Faults.Has(Suspend) && s.clockRng.Float64() < 0.004 && s.suspendOne() {
		return
	}
	if !s.quiet && s.cfg.Faults.Has(StoreLock) && s.lockRng.Float64() < 0.003 && s.lockOne() {
		return
	}
	if s.revokeOne() {
		return
	}
	s.loseCommit()
	if !s.quiet {
		r := s.rng.Float64()
		switch {
		case r < 0.05:
			if s.inject() {
				s.stats.Faults++
				return
			}
		case r < 0.08:
			if s.ops.act1() {
				return
			}
		case r < 0.16:
			if s.arrive() {
				return
			}
		}
	}
	if s.quiet && s.ops.restore() {
		return
	}
	now := s.now().Mono
	var due []actor
	next := never
	for _, a := range s.actors() {
		w := a.wake()
		if w <= now {
			due = append(due, a)
		}
		next = min(next, w)
	}
	if len(due) > 0 {
		due[s.rng.IntN(len(due))].act()
		return
	}
	// Time moves to the next moment someone must act, or part of the way,
	// or by a hair: so that actions land on, just before and just after
	// each other's deadlines.
	until := min(maxTick, next-now) // next > now: nothing is due
	var dt time.Duration
	switch r := s.rng.IntN(4); {
	case r < 2:
		dt = until
	case r < 3:
		dt = min(until, s.between(time.Microsecond, until))
	default:
		dt = min(until, s.between(time.Microsecond, 200*time.Millisecond))
	}
	s.be.Advance(dt)
	s.tracef("tick %v", dt)
}

// arrive starts a new holder, if there is room for one.
func (s *sim) arrive() bool {
	active := 0
	for _, h := range s.holders {
		if h.live() {
			active++
		}
	}
	if active >= s.maxHolders {
		return false
	}
	h := newHolder(s, len(s.holders))
	s.holders = append(s.holders, h)
	s.stats.Holders++
	wait := "without bound"
	if h.waitFor >= 0 {
		wait = h.waitFor.Round(time.Millisecond).String()
	}
	var newer string
	switch {
	case h.replace:
		newer = " --replace"
	case h.supersede:
		newer = " --supersede"
	}
	if h.maxWaiting != nil {
		newer += fmt.Sprintf(" --max-waiting %d", *h.maxWaiting)
	}
	if s.sched {
		newer += fmt.Sprintf(" --priority %d --share %q", h.priority, h.share)
	}
	s.tracef("%s arrives (limits %v, weight %d, ttl %v, wait %s, job %v, key %q%s)", h.name, h.limits, h.weight, h.ttl, wait, h.runFor.Round(time.Millisecond), h.key, newer)
	return true
}

// inject applies one fault of a kind switched on.
func (s *sim) inject() bool {
	type choice struct {
		f Fault
		w float64
	}
	var cs []choice
	for _, c := range []choice{{Crash, 2}, {Pause, 2}, {RenewFail, 1}, {Restart, 1}, {WallJump, 1},
		{Retry, 3}, {Reboot, 0.2}, {Signal, 1.5}} {
		if s.cfg.Faults.Has(c.f) {
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		return false
	}
	total := 0.0
	for _, c := range cs {
		total += c.w
	}
	r := s.rng.Float64() * total
	f := cs[len(cs)-1].f
	for _, c := range cs {
		if r < c.w {
			f = c.f
			break
		}
		r -= c.w
	}
	switch f {
	case Crash:
		return s.crashOne()
	case Pause:
		h := s.anyHolder(func(h *holder) bool { return !h.paused && h.phase >= hWait })
		if h == nil {
			return false
		}
		h.pause(s.between(h.ttl/5, 3*h.ttl))
		return true
	case RenewFail:
		h := s.anyHolder(func(h *holder) bool { return h.phase >= hWait && h.outageUntil < s.now().Mono })
		if h == nil {
			return false
		}
		h.outageUntil = s.now().Mono + s.between(h.ttl/10, 3*h.ttl/2)
		s.tracef("%s: store unreachable for its renewals until +%v", h.name, h.outageUntil-s.now().Mono)
		return true
	case Restart:
		if !s.restarts() {
			return false
		}
		s.restart()
		return true
	case WallJump:
		d := s.between(time.Minute, 2*time.Hour)
		if s.chance(0.5) {
			d = -d
		}
		if !s.be.StepWall(d) {
			return false
		}
		if d < 0 {
			s.wallBacks++
			s.m.wallBack()
		}
		s.tracef("wall clock stepped %+v", d)
		return true
	case Retry:
		return s.retry()
	case Reboot:
		return s.reboot()
	case Signal:
		h := s.anyHolder(func(h *holder) bool { return h.phase >= hWait && h.phase <= hRun && !h.sigterm })
		if h == nil {
			return false
		}
		h.sigterm = true
		s.tracef("SIGTERM to %s", h.name)
		return true
	}
	return false
}

// ring rings h's bell, as the store does when it admits, supersedes or
// asks to stop h's ticket, unless the ring is lost (lost-ring: its holder
// is told at its next poll or renewal instead).
func (s *sim) ring(h *holder) {
	if !s.quiet && s.cfg.Faults.Has(LostRing) && s.chance(0.3) {
		s.tracef("the ring of %s's bell is lost", h.name)
		return
	}
	h.rung = true
}

// size is a limit's configured size.
func (s *sim) size(name string) int {
	for _, l := range s.limits {
		if l.name == name {
			return l.slots
		}
	}
	return 1
}

// multi: holders draw several limits and weights (else one limit, weight 1).
var multi = true

// anyHolder picks a live holder that ok accepts, at random.
func (s *sim) anyHolder(ok func(*holder) bool) *holder { return s.anyHolderFrom(s.rng, ok) }

// anyHolderFrom is anyHolder drawing from r.
func (s *sim) anyHolderFrom(r *rand.Rand, ok func(*holder) bool) *holder {
	var hs []*holder
	for _, h := range s.holders {
		if h.live() && ok(h) {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return nil
	}
	return hs[r.IntN(len(hs))]
}

func (s *sim) crashOne() bool {
	if s.guardRng.IntN(5) == 0 && s.killGuardAlone() {
		return true
	}
	if s.chance(0.15) {
		r := s.reapers[s.rng.IntN(len(s.reapers))]
		r.crash()
		return true
	}
	h := s.anyHolder(func(h *holder) bool { return true })
	if h == nil {
		return false
	}
	if s.chance(0.5) {
		h.crashAfterCall = true // dies right after its next store call, answer unseen
		s.tracef("%s will crash after its next store call", h.name)
		return true
	}
	h.crash()
	return true
}

// restart drops every store handle and opens new ones.
func (s *sim) restart() {
	for _, c := range s.conns {
		st, err := s.be.Open()
		if err != nil {
			s.fail("setup", "reopen: %v", err)
			return
		}
		c.st.Close()
		c.st = st
	}
	s.checker.Close()
	var err error
	if s.checker, err = s.be.Open(); err != nil {
		s.fail("setup", "reopen: %v", err)
	}
	s.tracef("store handles reopened")
}

// storeLost deletes the store's file under running holders, as an
// operator starting afresh would: everything in it is gone at once, as
// if force-released, and the new file remembers nothing (no tombstones,
// fences from 1, no limits, counters or events). Every job must still stop
// by its lease's end (S2, as after a forced release), and each waiter
// learns that its ticket is gone.
func (s *sim) storeLost() bool {
	l, ok := s.be.(interface{ Lose() error })
	if !ok || s.diskBroken() {
		return false
	}
	if err := l.Lose(); err != nil {
		s.fail("setup", "delete the store's file: %v", err)
		return true
	}
	s.stats.StoresLost++
	s.m.storeLost()
	s.fileReplaced()
	s.tracef("the store's file is deleted: a new one starts empty")
	return true
}

func (s *sim) reboot() bool {
	if !s.be.Reboot() {
		return false
	}
	for _, h := range s.holders {
		if h.live() {
			h.crash()
		}
		if h.inflight != nil && !h.inflight.delivered {
			h.inflight = nil // the request died with its process
		}
	}
	s.pt.reboot()
	s.rebootClocks()
	s.letLockGo() // its process died too
	s.rebootAt = s.now().Mono
	s.history = nil
	for _, r := range s.reapers {
		r.crash()
		r.next = s.rebootAt + s.jitter(reapEvery)
	}
	s.ops.pending = nil
	s.restart()
	s.tracef("host rebooted: %s", s.now().Boot)
	return true
}

// A request is an earlier call that the network may deliver again.
type request struct {
	at     time.Duration
	boot   string
	kind   string // enqueue, renew, release, resize
	req    store.EnqueueRequest
	t      store.Ticket
	ttl    time.Duration
	weight int // a resize's
	why    store.Reason
	owner  *holder
	who    string
}

func (s *sim) remember(r request) {
	now := s.now()
	r.at, r.boot = now.Mono, now.Boot
	s.history = append(s.history, r)
	if len(s.history) > 256 {
		s.history = slices.Delete(s.history, 0, len(s.history)-192)
	}
}

// retry delivers a late duplicate of a recent request; nobody reads the answer.
func (s *sim) retry() bool {
	now := s.now()
	var recent []request
	for _, r := range s.history {
		if r.boot == now.Boot && now.Mono-r.at <= retryWithin {
			recent = append(recent, r)
		}
	}
	if len(recent) == 0 {
		return false
	}
	r := recent[s.rng.IntN(len(recent))]
	c := s.netConn
	c.who, c.owner = "late "+r.who, r.owner
	defer func() { c.who, c.owner = "net", nil }()
	switch r.kind {
	case "enqueue":
		t, err := c.Enqueue(s.ctx, r.req)
		s.tracef("late duplicate of %s's enqueue %s: %s", r.who, short(r.req.ID), result(t, err))
	case "renew":
		t, err := c.Renew(s.ctx, r.t, r.ttl)
		s.tracef("late duplicate of %s's renewal of %s: %s", r.who, short(r.t.ID), result(t, err))
	case "release":
		var removed bool
		var err error
		if r.why == store.Cancelled {
			removed, err = c.Cancel(s.ctx, r.t)
		} else {
			removed, err = c.Release(s.ctx, r.t, r.why)
		}
		s.tracef("late duplicate of %s's release of %s: removed=%v err=%v", r.who, short(r.t.ID), removed, err)
	case "resize":
		t, err := c.Resize(s.ctx, r.t, r.weight)
		s.tracef("late duplicate of %s's resize of %s to %d: %s", r.who, short(r.t.ID), r.weight, resized(t, err))
	}
	return true
}

// quiesce stops the faults and arrivals, lets the operator restore the
// limits and everyone finish, and checks that they did (L2).
func (s *sim) quiesce() {
	s.quiet = true
	s.etcdFaults(false)
	s.letLockGo()
	s.fileQuiet()
	for _, h := range s.holders {
		h.outageUntil = 0
	}
	qStart := s.now().Mono
	limit := qStart + 40*ttls[len(ttls)-1]
	for ; ; s.step++ {
		if s.done() {
			return
		}
		if s.now().Mono > limit || s.step > s.cfg.Steps+100000 {
			s.step-- // found after the last step
			s.failLiveness(s.now().Mono - qStart)
			return
		}
		s.doStep()
		if s.viol != nil {
			return
		}
	}
}

// done: every holder finished or crashed, nothing in flight, no ticket left.
func (s *sim) done() bool {
	for _, h := range s.holders {
		if h.live() || h.inflight != nil && !h.inflight.delivered {
			return false
		}
	}
	return len(s.m.live) == 0
}

func (s *sim) failLiveness(after time.Duration) {
	var left []string
	for _, h := range s.holders {
		if h.live() {
			left = append(left, fmt.Sprintf("%s in %s", h.name, h.phase))
		}
	}
	for _, t := range s.m.sorted() {
		left = append(left, fmt.Sprintf("ticket %s of %s (%s)", short(t.id), ownerName(t.owner), t.state))
	}
	s.fail("L2", "not quiescent %v after the faults stopped: %s", after, strings.Join(left, ", "))
}

// short is an id's first 6 characters, and a suffix "-N" (the tickets of
// one limit each that mutation.HoldAndWait takes).
func short(id string) string {
	if i := strings.LastIndexByte(id, '-'); i > 6 {
		return id[:6] + id[i:]
	}
	if len(id) > 6 {
		return id[:6]
	}
	return id
}

func result(t store.Ticket, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	if t.State == store.Held {
		return fmt.Sprintf("held slot %d fence %d", t.Slot, t.Fence)
	}
	return fmt.Sprintf("waiting #%d fence %d", t.Position, t.Fence)
}

func ownerName(h *holder) string {
	if h == nil {
		return "?"
	}
	return h.name
}
