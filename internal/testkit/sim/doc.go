// Package sim is a deterministic simulation of the slot protocol: the real
// holder (gate/holder, what slotctl run runs), gate, renew and store code
// (the bbolt backend on a real file) driven by a
// seeded scheduler under a simulated clock, checked after every step against
// an independent model of what must be true (docs/leases.md, "Simulation invariants"). Only
// tests import it.
//
// # Steps
//
// The simulation is single-threaded. Each step picks one actor and performs
// one action, at most a few real store calls at one instant of the simulated
// clock, so a seed replays exactly: go test ./internal/testkit/sim -run TestSim -seed N.
// Time moves only in "tick" steps, and never past a moment at which a
// responsive actor must act (a renewal or poll due, a local deadline, a
// child's exit, a kill escalation, a reaper's turn): timers fire on time
// unless a fault says otherwise.
//
// # Actors
//
//   - Holders run the real protocol, gate/holder's Run (the one slotctl run
//     calls), each in a goroutine that runs only while the scheduler waits
//     for it: Run blocks only in its Waiter, which here parks and returns the
//     event the scheduler delivers (a timer due, the lease lost, the child's
//     exit, a ring of its bell, SIGTERM, SIGCONT after a pause). So Run
//     mints nothing on its own: it joins (gate.Join: bell, then enqueue;
//     cancel when the outcome is unknown), renews from the first write,
//     waits (gate's Entry steps), checks the local deadline, starts the
//     simulated child, records its group (SetChild), stops it on loss, on
//     SIGTERM or at its kill escalation, drains and releases, as it does in
//     slotctl. What is simulated is the renewer beside it: renewals are sent
//     by the scheduler (so that they can be delayed, lost or fail), decided
//     with renew.Lease, the Keeper's own arithmetic, and retried after
//     renew.RetryDelay. The supervisor-side mutations
//     (mutation.WaiterNotRenewed, mutation.ReleaseBeforeExit,
//     mutation.HoldAndWait, mutation.LateLossGrace) switch gate/holder's
//     code through its Config.Mutations.
//   - A holder's job names 1-3 of the run's 1-4 limits (sizes 1-3), in a
//     random order, and takes 1 or 2 slots of each: one ticket
//     (EnqueueRequest Limits and Weight), never heavier than a limit at its
//     enqueue nor than its configured size (operators may shrink it later).
//   - Processes (ptable.go): each supervisor is a process of a modelled
//     host, with a pid, a start time, a uid and an environment. Most run
//     on the store's host, some of those in a pid namespace or a time
//     namespace of their own; others on a clone of it (the same host name,
//     another boot id) or another host, pids meeting across hosts. Its
//     ticket's Holder is what it reads of itself through the real
//     internal/proc (boot id, pid namespace, pid, start time on the host's
//     clock), and so is the group its job's command leads (SetChild).
//   - A job is a tree: a guard under the supervisor, the command under the
//     guard (leading a group of its own, or in the supervisor's group on a
//     terminal), carrying SLOTCTL_TICKET and SLOTCTL_SUPERVISOR, and 0-3
//     processes under it that may move to a session of their own (setsid),
//     ignore SIGTERM, clear their environment (env -i) or outlive the
//     command; now and then a daemon handed to a service manager, outside
//     the tree but carrying the job's variables. A signal goes to the whole
//     tree, as the guard sends it. The command runs from its start until
//     its holder observes that it exited or killed it; the holder then
//     drains what it left, as gate/holder does, and releases once nothing
//     of the job is left. When a supervisor dies, the kernel closes its
//     end of the guard's socket and the guard kills the tree
//     (mutation.PdeathsigOnly: only the command dies, by its parent-death
//     signal). Now and then, on the bbolt store with the judge on, the
//     guard is killed with it (docs/crashes.md): the command dies by its
//     parent-death signal, what it started runs on, orphaned, until a
//     reap kills it on its owner's evidence, and the store keeps the
//     ticket while it provably runs (Judges.Keep, the real
//     proc.Judge.JobRunning). The guard keeps the lease its supervisor
//     tells it of each renewal (Child.Lease): a pause stops the supervisor
//     alone (kill -STOP; its guard then stops the job at the lease's end,
//     SIGTERM at the local deadline and SIGKILL half the margin later) or
//     together with its guard (a frozen machine or cgroup), the case the
//     design cannot cover (S24).
//   - Reapers scan (a dry-run Reap) and reap a while later; they are cron
//     jobs, so a crashed reaper only loses what it had read. The store's
//     death judge is the real proc.Judge, reading the process table as a
//     root process of the store's host, with the owners' evidence (a run
//     keeps its supervisor's marker from its job's start to its release)
//     as its Authority. Now and then a reaper is handed a record of a
//     finished run, as a member of the store could write it back.
//   - Operators release tickets (a stale read, then Release; --force only
//     rarely for a live holder), resize limits and pause them (0 slots).
//   - Newer runs first (docs/leases.md §2.1 item 10): a job draws a key
//     ("", "main" or "dev", so that runs of one key meet) and, sometimes,
//     --supersede or --replace, and --max-waiting 0-2 (EnqueueRequest Key,
//     Supersede, Replace, MaxWaiting). The store rings the bell of a
//     superseded waiter and of a holder asked to stop: the scheduler
//     delivers the ring to Run, which keeps its bell open while the job
//     runs; the Keeper's OnRenew reaches Run too, as it does in slotctl,
//     so a renewal's answer that carries the stop request nudges it.
//   - A job's weight changes while it runs (docs/leases.md §2.1 item 12, a
//     jobserver's extra slots, fault "job-resize"): at random steps a running
//     holder resizes its ticket toward 1 to one above its largest limit's
//     size, between renewals, reaps, releases, shrinks of its limits and
//     late duplicates of its own earlier resizes. These draws come from a
//     stream of their own, so that switching them off leaves a seed's other
//     draws as they were.
//   - Scheduling policies (sched.go, fault "policies"): in a share of the
//     runs the operator sets each limit's policy before the first job
//     (every limit by priority with one short aging, every one fair, or
//     each its own, FIFO included; some with a rate of 1-3 admissions per
//     2-8 s) and changes one part of one now and then (SetPolicy); jobs
//     send --priority (mostly near the top, so that aging reorders them)
//     and --share (a few keys). The other runs stay FIFO-only, draw for
//     draw as before: these draws come from a stream of their own too.
//
// # Faults
//
// crash (an actor stops for good, between steps or right after a store
// call whose answer it never sees; or a running job's guard is SIGKILLed
// alone: the command dies by its parent-death signal, and its supervisor,
// the subreaper, kills what carries the job's marks, as internal/guard
// does), pause (a supervisor is stopped for up to 3 TTLs, alone or with
// its guard, then resumes and checks its lease first, as on SIGCONT), renewal
// delays and failures (before or after the store ran them, and outages),
// restart (every store handle is dropped and opened again; the bbolt store
// opens its file for every operation anyway), wall-clock steps of up to ±2 h,
// reboot (every process of every host dies, new boot ids), store-lost (the
// store's file deleted under running holders: every ticket gone as if
// force-released, the new file refusing no id, its fences from 1, its
// limits, counters and log empty; each job still stops by its lease's end,
// S2), the store's file replaced by an older copy (restore: copied under
// the store's lock, renamed over it later; the model takes back what the
// copy lacks, as for a deleted file, and fences may be issued again) or
// cut short (truncate: every call answers ErrCorrupt until an operator
// deletes the file, then store-lost), both in restore.go, a failing disk
// (disk-full, diskfault.go: a real ENOSPC on a tmpfs of the run's own in
// TestSimDiskFull, a real EIO from fsync on a loop device that fails its
// writes in TestSimDiskEIO; root only), late duplicates of earlier
// enqueue, renew and release requests (a retried request), lost enqueue
// answers, SIGTERM to a supervisor, and lost rings of a supersede or a
// stop request (a holder that is not told by its bell learns it at its
// next poll or renewal). Clocks (clocks.go): the store's host's boot clock
// judges every lease; a supervisor keeps its deadlines on its own host's
// (the same on the store's host; on the others an offset of up to a month
// and a rate within ±500 ppm, clock-drift), and a host other than the
// store's may be suspended for up to 3 TTLs (suspend): its processes stop,
// its boot clock counts on, its timers fire late by the suspend, and a
// supervisor whose job runs notices the end of its lease at its Keeper's
// watchdog tick within a second of the resume. These draws come from a
// stream of their own. A stalled process (a reaper or a slotctl in its
// write, an operator's ls in its read) holds the bbolt store's file lock,
// really taken, for up to 2 TTLs (store-lock, storelock.go; a stream of its
// own too): a call that needs the lock
// fails as the store's call fails
// once its lock timeout is over, nothing run; a call of Run's blocks Run
// for that timeout in simulated time, as it blocks slotctl, the others
// fail at once. A late renewal may arrive from a
// holder that reapers have since proven dead: it is lost (see
// TestRenewOfDeadWaiter, the bug the simulation found there).
//
// # Model and invariants
//
// The model is its own record of the live tickets (limits, weight, fence,
// state, slot indexes in each limit, deadline on the store's clock), which
// job owns each, the removed and refused ids, the limits, and each holder's
// child, built only from the calls' answers and the
// actors' observations, never from the store's internals. After every step
// that called the store, a Snapshot is compared with it. The rules checked
// (names as in docs/leases.md, "Simulation invariants"):
//
//	S1  slots held (weights counted) ≤ slots outside a shrink; a grant only
//	    while its limits stay within their size; slot indexes unique in a
//	    limit and below its size
//	S2  every running child is leased, or its holder lost the ticket at most
//	    margin + kill grace ago (past its local deadline or the store's
//	    expiry, whichever is first), or its holder is or just was paused;
//	    with S9, this holds for what the command left while its holder
//	    drains it, as much as for the command
//	S3  a limit's held slots and waiting count are its tickets'; a ticket
//	    is listed once under each of its limits
//	S4  a ticket is removed only by its holder, an operator, or a sweep that
//	    finds it expired or its holder dead
//	S5  every ticket leaves the live set exactly once
//	S6  a ticket renewed on time is never reaped, nor listed by a scan
//	S7  no removed id comes back; an expired ticket is not renewed
//	S8  fences strictly increase and never change
//	S9  a holder's local deadline + margin ≤ the store's deadline (read on
//	    the store's clock, + what its host's clock, if slower, drifts over
//	    a TTL within ±500 ppm); a child is
//	    stopped within the kill grace of its local deadline, a lost lease or
//	    a SIGTERM, and a child whose lease was lost is gone by the lease's
//	    expiry (local deadline + margin), whatever the kill grace
//	S10 a holder releases only after its child is gone
//	S12 the store answers (no corrupt or failed calls)
//	S13 the store judges on one clock (remaining lease = deadline − now)
//	S14 a retried enqueue returns the same ticket; only removed ids are
//	    refused, and weights only above a limit's size
//	S15 admission is atomic: every answer and listing shows a ticket held
//	    in all of its limits, with weight indexes in each, or in none
//	S16 a supersede removes, in its enqueue's step, exactly the older
//	    waiting tickets of its key sharing a limit with it, with a
//	    superseded event in each of their limits naming it; Get and Renew
//	    of one name its successor; its job never runs; its holder ends
//	    superseded, at once when its bell rings (unless a signal, its
//	    --wait or its own local deadline ended the wait first)
//	S17 a held ticket is never removed by a supersede
//	S18 a replace asks exactly the held tickets of its key sharing a limit
//	    to stop, with a replaced event in each of their limits; every
//	    answer and listing shows the request; a holder that heard it
//	    (a read on its bell or on a nudge left from a renewal, a
//	    renewal's answer) has sent its child SIGTERM before
//	    the clock moves on, and ends replaced (or read it in the answer
//	    that admitted it: Run starts the job and stops it when told again)
//	S19 a replacing ticket is admitted only once every ticket it replaces
//	    is gone; its child never runs beside a replaced job's (outside a
//	    stopped supervisor or an operator's forced release)
//	S20 --max-waiting N refuses exactly when the ticket would wait behind
//	    N waiting tickets of one of its limits after the supersede (the
//	    count allows for what the enqueue's settle may sweep and admit),
//	    and a refusal writes nothing
//	S21 a resize answers its holder's held ticket, same id and fence: a
//	    shrink to exactly the weight asked, keeping its lowest indexes; a
//	    growth to between the old weight and the one asked, keeping its
//	    indexes and taking free ones below the size, and none at all while
//	    a ticket waits in one of its limits; a waiting ticket is refused as
//	    invalid, a gone or expired one as lost
//	S22 a limit's counters never go back, and at quiescence they are the
//	    tally of its log (each event counted once, in its own step)
//	S24 a supervisor that resumes past its lease's local deadline has its
//	    child gone within min(kill grace, margin/2) of the resume, so a
//	    paused supervisor's child runs beside the slot's next holder for
//	    at most its pause beyond its ticket's end + min(kill grace,
//	    margin/2) (below)
//	S29 a running guard stops its job by itself at the lease's end (the
//	    supervisor stopped alone, or slow): nothing of the job runs past
//	    the local deadline + margin/2, and the guard stops nothing before
//	    the local deadline
//	S25 the judge proves no holder dead while its supervisor or a process
//	    of its job that carries its ticket runs (what the model knows of
//	    the processes, not what the judge read)
//	S26 nothing of a job runs past its run's end, nor more than the
//	    guard's bound past its supervisor's death; when the guard was
//	    killed too, nothing of it that carries its ticket runs once the
//	    ticket is gone (but after an operator's forced release). Out of
//	    every reaper's reach, as documented: a process that cleared its
//	    environment, and the members of a recorded group that holds one
//	S27 a reaper kills only processes of a job whose supervisor is gone
//	    and whose owner keeps the evidence of it (admitted, not released)
//	S28 on the bbolt store with the judge on, a waiting ticket whose
//	    supervisor runs where the judge can read it (the store's host and
//	    pid namespace) is neither swept past its deadline nor refused a
//	    late renewal (Judges.Alive, the real proc.Judge.SupervisorAlive;
//	    docs/leases.md rule 17), and Alive vouches only for a running one
//	S30 a job whose supervisor runs is gone by its ticket's end on the
//	    store's clock (its deadline there, or its removal), whatever its
//	    host's clock reads: the whole stop fits inside the lease across
//	    clocks (outside S24, S31 and an operator's forced release)
//	S31 a supervisor whose host resumes from a suspend past its lease has
//	    its job gone within the watchdog (1 s) + min(kill grace, margin/2)
//	    of the resume
//	S40 (etcd) an enqueue whose caller died in it, after its first write,
//	    took effect whole or not at all: when the store has no ticket of
//	    its id, no older run of its key was superseded for it
//	S45 a write that fails on the disk fails whole: the store's error
//	    (unavailable, never corrupt), and the file holds key for key what
//	    it held before the call (and, the device mended, what reached the
//	    disk is what it held before the device failed); nothing ran, so
//	    the model learns nothing (a join that fails so starts no child, S2)
//	S46 a renewal that says held of a ticket the store has waiting (a
//	    restored copy) is lost and removes the ticket. With the tickets
//	    the copy lacks removed from the model (their renewal accepted is
//	    S7), a job admitted since the copy stops within the kill grace of
//	    its next renewal's answer (S9), and by its lease's end whatever
//	    happens to that renewal (S2, as after a forced release)
//	L1  a reap leaves no expired ticket of its limits; none outlives three
//	    reaper periods (but a ticket whose orphaned job runs, which the
//	    store keeps until a reap stops the job)
//	L3  no ticket waits that is the oldest waiter of each of its limits
//	    while each has room for its weight: the step that made the room
//	    admitted it (every write that frees room settles the limits its
//	    tickets connect); a ticket that waits for the live tickets it
//	    replaces is not such a head, and blocks its limits
//	L4  FIFO across limits: nobody is admitted while an older ticket
//	    waits in one of its limits
//	L9  no job holds a ticket while it waits for another
//	L10 no cycle of jobs each waiting for a slot the next one holds
//	L2  at quiescence every holder has finished and no ticket is left
//
// and, for the scheduling policies (sched.go, where the conditions under
// which an order rule judges are worked out):
//
//	S23 a rated limit admits at most N tickets in any window (t-Per, t] of
//	    the store's clock
//	L11 no ticket is admitted to a priority limit while a waiter that its
//	    order puts ahead (effective priority at the step's clock, ties to
//	    the older ticket) still waits there
//	L12 nor while a waiter created more than (100 - its priority + 1) ×
//	    aging before it still waits there
//	L13 no ticket is admitted to a fair limit while a waiter that
//	    store.Policy.Arrange puts ahead still waits there
//
// L3 judges only tickets whose limits are all FIFO without a rate (time
// alone reorders or opens the others), and L4 only FIFO limits.
//
// Slot indexes are unique. The one overlap the design cannot prevent is
// bounded (S24), and the bound asserted at every step. A supervisor stopped
// (SIGSTOP) alone leaves its guard to stop the job at the lease's end
// (docs/leases.md rule 8), and the simulation asserts that nothing of the
// job runs past the lease's local deadline + margin/2 then (S29; mutation
// guard-untold: the guard never told its lease). Stopped together with its
// guard, as half the pauses are, it cannot stop its child, so the child runs
// on while its ticket expires in the store, is reaped and its slot given to
// a newly admitted job. Its ticket's end E is at the earliest the store's
// expiry, its local deadline + margin (S9), or an operator's forced
// release. On SIGCONT the supervisor checks its lease before anything
// else, finds it lost and stops the child: SIGTERM at once, SIGKILL within
// the kill grace cut to half the margin (gate/holder's killBy, as for a loss
// noticed in time). A supervisor that resumes at r past its local deadline
// thus has its child gone by r + min(kill grace, margin/2), and its child
// runs beside the slot's next holder for at most
// (r - E) + min(kill grace, margin/2): the pause beyond the ticket's end,
// plus a twentieth of the TTL with the runs' kill grace (TTL/5) and margin
// (TTL/10). Pauses last up to 3 TTLs. The longest such overlap and how many
// children ran on past their ticket are in the Stats.

// # Mutations
//
// Each bug class of docs/leases.md that the design prevents can be switched
// back on (internal/mutation; store-side ones at their real location in
// store/policy, the rules and the planners policy.PlanSettle and
// policy.PlanResize, but for wall-clock in store/boltstore's clock;
// holder-side ones in gate/holder). TestMutationsCaught asserts that the
// simulation finds each within a bounded budget of seeds and steps:
// replace-beside (R1, the planner) as S19, supersede-held (R2, the rules'
// enqueue) as S17, and with S17 ignored as the child it leaves running
// unleased (S2); resize-past-waiter (H4, policy.PlanResize) as S21,
// resize-over-size (H5) as S1, resize-no-settle (a shrink that admits
// nobody) as L3; late-loss-grace (D4: a loss noticed on resuming keeps the
// whole kill grace, gate/holder's killBy) as S24, which alone sees it (the
// child is gone within the grace, which every other rule allows), once
// guard-untold takes away the guard's timer, which would SIGKILL the job
// as its supervisor resumes; monotonic-deadline (a supervisor's deadlines
// on CLOCK_MONOTONIC, which stops in suspend) only across a suspend, as
// S9 (and with S9 ignored, as S30: its job runs past its ticket's end);
// order-first-limit (P1) as L11, rate-stale (P2: two
// handles, each settling on its own earlier read of a rated limit's
// starts) as S23, aging-off (P3) as L11 (or L12); the death judge's
// (internal/proc, reading the process table): host-name-identity (a
// holder on a clone of the store's host judged by pids not its own) and
// timens-ignored (a supervisor in a time namespace judged gone) as S25,
// replayed-kill (a record written back after a job's release authorising
// the kill of what still carries its ticket) as S27; pdeathsig-only (the
// model's guard taken away: a SIGKILLed supervisor's command dies, what it
// started runs on) as S26; drain-blind (gate/holder: once the command
// exits, the drain of what it left stops watching the lease) as S9, once
// guard-untold takes away the guard's timer, which covers it;
// late-renewal-death (store/policy: a waiter's late renewal refused, an
// expired waiter whose supervisor provably runs swept) as S28;
// foreground-undrained (the model's guard: a terminal's job, in its
// supervisor's group, drained by its command alone) as S26; guard-untold
// (gate/holder never tells the guard its lease) as S29; orphans-left (the
// model's guard: a supervisor whose guard was killed alone leaves what the
// guard left running) as S26; hold-not-adopted (gate/holder: a supervisor
// admitted without a running lease counts it from the ticket as it
// joined, not from the hold the store answered) as S9; held-no-more
// (store/policy: a renewal as held of a ticket the store has waiting
// accepted) as S46, in runs whose store's file is restored from an older
// copy, the only way to make one; commit-ignored (store/boltstore: a commit
// that failed on the disk taken for done) only on a disk that fails, in
// TestSimDiskMutation (root), as S1 at its recorded seed and step.
// The bugs of the
// policies are searched in runs with policies, the others in FIFO-only
// runs, where they were always found. The switches exist only in a build
// with the tag slotctl_mutations, so those tests (and TestReduce, which
// needs a failing run) run only with it:
//
//	go test -tags slotctl_mutations ./internal/testkit/sim -run 'TestMutations|TestReduce'
//
// Without the tag the bugs are compiled out: go test ./... runs the rest.
//
// # Other stores
//
// The harness runs over store.Store and a Backend (handles plus the clock
// that judges the leases). A store whose clock cannot be driven, such as
// etcd, gives a randomized run that is no longer replayable; its Backend
// says which faults it supports.
//
// etcd (Etcd, etcd.go; TestSimEtcd, or -store etcd): the server expires a
// lease by its own clock, so the simulation's clock follows real time, one
// embedded server serving every run under a prefix of its own. Modelling
// the server's lessor behind clientv3 with a driven clock would replay,
// but the store also plans rate windows and aging by the real clock and
// reads leases it did not grant from the server: much of the server to
// rewrite, and no longer the real one. A tick sleeps until real time has
// caught up with the simulation's clock, which moves by exactly the tick,
// so timers still fire when the scheduler says; real time runs ahead by
// what the steps since the last tick took (the lag, Stats.MaxLag). The
// slack is the longest lag of the run plus 100 ms for the server's side
// (its revoker acts within 10 ms of a lease's end). What changes on etcd:
//
//   - the faults wall-jump, reboot and restart are skipped: the server's
//     clock cannot step; a reboot of its host is out of reach; a process
//     keeps its etcd handle, and with it the send times of its own
//     renewals, for its life (a new handle reads a lease it did not renew
//     from the server, in whole seconds plus half of one, which a waiter
//     would take for its own). Nor is a guard killed with its supervisor,
//     nor a waiter kept past its lease (Judges.Keep and S28 are the
//     host-local store's); reapers judge holders with the real proc.Judge
//     (etcdstore.Options.Dead). Of the store-side mutations only the etcd
//     store's own are switched in it: lost-recounted (a repeated "lost"
//     release counted again), which TestEtcdMutationCaught finds as S22
//     within a budget of runs, and supersede-first (a superseding
//     enqueue's removals committed in a transaction before its ticket's),
//     which TestEtcdSupersedeFirstCaught finds as S40, or as S20 when its
//     queue then refuses the ticket, after a control batch without it;
//   - faults of its own (etcdfault.go), injected in each handle's real
//     client (a gRPC interceptor among etcdstore.Options.DialOptions):
//     etcd-lost-answer, a write (a transaction, put, delete, lease grant
//     or revoke) that commits while its caller gets codes.Unavailable, as
//     from a member gone after it applied the entry; the handle's next
//     writes keep their answers, so the store's own retry reaches the
//     server and must find what the lost one did, neither writing it twice
//     nor giving it up. A call that fails on one is an unknown outcome as
//     slotctl's callers see it: an enqueue's is read back (the ticket, as
//     its answer, or nothing written); a renewal, a record of the child's
//     group and the release of a ticket already gone are the caller's to
//     retry, and the model learns what they did from the snapshot; an
//     operator runs a limit's set again and a jobserver asks for the same
//     weight; a reap lists only what its own retry removed, so a reap that
//     lost an answer is not held to L1. Any other call that fails so is
//     the store's failure (S12). etcd-crash-in-call, a holder that dies in
//     its enqueue right after its first writing transaction commits
//     (S40). etcd-revoke, a held ticket's lease revoked by a client of its
//     own although its holder renewed it on time: a member with stale
//     leadership, which on one member (no election, so no hold kept for it:
//     store/etcdstore/quarantine.go) is a real loss. The model takes it as
//     an operator's forced release (S2: the job may run to its lease's
//     end as its holder counts it + the kill grace; the holder learns at
//     its next renewal), and a reaper settles right after (L3 judges the
//     step that made room, which a revoke, no write of the store's, cannot
//     be). Lost watch events are not among them: a holder's bell here is
//     the simulation's (lost-ring), not etcdstore's watch; the store's
//     tests drop its watch events (TestLostWatchEventsLearnedByPollAndRenewal);
//   - an admission keeps the lease's deadline: only a keep-alive renews an
//     etcd lease (on the host-local stores the admission gives a whole
//     lease, docs/leases.md rule 17);
//   - S13: the store's reading of a lease's time left is within 500 ms
//     (the server answers whole seconds, rounded down, and the store adds
//     half of one) + the slack of the model's, and 0 once the lease has
//     ended while its record waits for a settle; a ticket the model swept
//     when a call found its lease gone may be listed so until a settle
//     (S7: such a call does not settle on etcd), and a release may remove
//     that record once, as it removes any ticket past its deadline (S4);
//   - a lease within the slack of its end may be judged either way: the
//     server read its clock when the renewal arrived, up to the lag after
//     the simulation's send time, and reads it now up to the lag ahead
//     (S6, S7, S21, L1, and what a sweep may remove); and L1 holds a reap
//     only to what the server ended: a ticket whose key is still there
//     after the reap (its lease not revoked yet, which on a loaded machine
//     may be some 100 ms past the slack), or was there at the revision
//     read just before the reap (revoked while it ran), was rightly left;
//   - S8: a ticket's creation time is within the slack after the model's;
//     S23: a rate's window is shorter by the slack; L11: a priority
//     limit's order passes if it held at some instant of the slack after
//     the step's (the store reads its wall clock as it plans, and aging
//     moves the order), and L11-L13 take a waiter for first in a priority
//     limit only if it is first at every such instant.
//
// Every other rule is checked as on bbolt. The holders' own rules (S2,
// S9, S10, S24) need no slack: the holders count on the simulation's
// clock, which is behind the server's, so their local deadlines come
// first.
//
// PostgreSQL (NewPostgres, -store postgres): a real server, a database per
// run, the store's clock the simulation's (pgstore.Options.Now), so a run
// replays. Each run reaches its database through a proxy (pgtest.Proxy),
// and the fault pg-lost-answer (pgfault.go) has it lose the answer of the
// next COMMIT after the server ran it, now and then in the random phase:
// the store runs the step again and must find what the lost one did. Its
// answers reach the callers, so every rule is checked as on bbolt.
package sim
