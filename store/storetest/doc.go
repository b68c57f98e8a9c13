// Package storetest is the conformance suite of the [store.Store] contract.
//
// Every backend runs the same cases, unchanged, from its own test file:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			TTL: 10 * time.Second,
//			New: func(t *testing.T) storetest.Backend { return newBackend(t, nil) },
//			NewWithJudge: newBackend, // func(t *testing.T, j store.Judge) storetest.Backend
//		})
//	}
//
// where newBackend opens boltstore.New(path, boltstore.Options{Clock: clock,
// Dead: j}) on a fake clock and returns storetest.Backend{Store: st, Advance:
// clock.Advance, Reopen: ..., Skewed: ...}, Skewed opening the same path
// with a clock that reads the fake clock plus an offset.
//
// Time only moves through [Backend.Advance]: a fake clock for the embedded
// bbolt store, a real sleep for a store whose clock is a server's (etcd). The
// suite never reads the wall clock to judge a lease, and all leases use
// [Harness.TTL].
//
// Each case is one subtest, named after the rule it checks (docs/leases.md
// §4.1, §4.2 and its rules), and each fails on a store that breaks that rule: FIFO
// promotion, held <= slots, unique slot indexes, one slot freed per removal,
// compare-and-delete release, monotone expiry, tombstones for removed ids,
// sweeps on Enqueue, renewal of waiters, resize and pause, limit removal,
// snapshots, watches, input validation, durability across a reopen, and
// concurrent use.
//
// The reaper's cases follow docs/leases.md's scenarios: a renewal that lands
// between a reaper's scan and its reap wins (A1, RenewAfterScanWins; it
// needs [Backend.Skewed], a second handle whose clock reads ahead); two
// reapers free a slot once (A2, TwoReapersFreeOnce); a release racing a reap
// removes once in every order (A3, ReleaseRacingReap); a release after a reap
// frees nothing (A4, ReleaseAfterReap); a late renewal re-creates nothing
// (A7, LateRenewAfterRelease, LateRenewAfterReap). Then what Reap means
// (ReapNamedLimitsOnly, ReapDryRunMatchesReap, ReapFreesAndPromotes), proof
// of death (DeadHolderReapedAtOnce, DeadHolderSweptOnAdmission,
// LiveHolderKeptUntilTTL; they need [Harness.NewWithJudge]), SetChild, the
// event log (Events), Cancel (CancelWaiting; CancelPromoted: a ticket
// promoted before its holder saw it is removed as cancelled and frees its
// slot once; CancelBeforeCreate) and Close (every operation after it fails
// with ErrClosed, never a panic; the store must let its Backend.Store be
// closed twice, as the case and the backend's cleanup may both do). Races go through the Store interface only: two
// goroutines started together at a few offsets, and a dry run standing for
// a reaper's scan.
//
// Tickets of several limits and weights (docs/leases.md §2.1 item 9, rule
// 13; multi.go): admission to all of a ticket's limits in one step or to
// none, never held in one and waiting in another (AtomicAdmissionAcrossLimits);
// weights counted in slots, the lowest free indexes (WeightsCountedInSlots);
// one queue order across limits (FIFOAcrossLimits) that no lighter ticket
// barges past (HeavyHeadNotOvertaken); a release, reap, double release or
// forced limit removal that frees a ticket's slots in all of its limits at
// once and promotes in each, through the closure of the limits it reaches
// (MultiReleasePromotesEveryLimit, ReapMultiLimit, DoubleReleaseMultiFreesOnce,
// RemoveLimitForceMulti, DeadMultiHolderFreesAll); resize and pause with
// weights; what Enqueue refuses (EnqueueRefusalsMulti: *store.WeightError,
// SlotsConflict in any limit, MaxLimits); one event per limit
// (EventsMultiLimit); a reopen (ReopenMultiLimit); many clients at once
// (ConcurrentMultiLimit); and a store written by the previous release
// (LegacyFormatRead, on [Harness.NewLegacy], which every backend must
// provide: without it the case fails). A ticket of one limit and weight one
// may come in the old form (Limits, Weight, Indexes unset) or spelled out;
// the suite reads every ticket through Names, Weighs and In.
//
// Newer runs first (docs/leases.md §2.1 item 10; newer.go): a supersede
// removes, in the enqueue's own step, only older waiting tickets of the same
// key sharing a limit, never a held one, and a superseded ticket is not found
// with a *store.SupersededError naming its successor's ticket, host, pid and
// URL (SupersedeOlderWaiting); other keys, the empty key, unrelated limits
// and a retried enqueue are left alone, and a ticket sharing any one of
// several limits is superseded (SupersedeScope); a replace asks the held
// tickets of its key to stop (Stop through Get, Renew and Snapshot, their
// bell rung, "replaced" events) and is admitted only once they are gone,
// even with free slots, blocking its limits meanwhile; a second replace
// overwrites Stop and supersedes the first (ReplaceStopsHolder,
// ReplaceFIFOPlace, ReplaceMultiLimit); MaxWaiting counts after the
// supersede, never refuses a ticket admitted at once, and a refusal writes
// nothing (MaxWaiting); keys are compared as bytes (KeysComparedExactly) and
// checked like any input, and so are URLs (KeyAndURLInvalid); a stop
// request, a ticket's Replaces and a superseded tombstone survive a reopen
// (StopSurvivesReopen); runs of one key enqueued at once with --supersede
// --max-waiting 1 leave exactly the newest waiting, none refused
// (ConcurrentSupersede).
//
// A held ticket's weight changes (docs/leases.md §2.1 item 12; resize.go): a
// shrink frees the highest indexes and admits, in the same step, the
// waiters it makes room for, across the closure of its limits
// (ResizeShrinkPromotes); a growth takes nothing while a ticket waits in
// one of its limits, even with slots free, until that waiter is admitted or
// its lease runs out (ResizeGrowBlockedByWaiter), takes the lowest free
// indexes, fewer than asked when fewer are free in all of its limits
// (ResizeGrowPartial), and never takes a limit past its size, shrunk or
// paused (ResizeCappedBySize); a waiting ticket is ErrInvalid, a gone,
// expired or other-fence one ErrLost, changing nothing (ResizeRefused);
// a release, a reap of an expired resized ticket free all of its slots at
// once (ResizeRemovalFreesAll); Renew, Get, Snapshot and a reopen keep the
// new weight (ResizeKept); each change logs a "resized" event per limit
// with the new weight (ResizeEvents); many holders resizing at once never
// share a slot nor overfill the limit (ConcurrentResize).
//
// Scheduling policies (docs/scheduling.md; schedule.go): SetPolicy's
// refusals and what a change keeps (PolicyRefusals, PolicySet); waiters of
// a priority limit admitted, numbered and listed by priority, ties in
// ticket order (PriorityOrder), a low priority overtaking once aged
// (PriorityAging); shares taking turns by the slots they hold, weights
// counted (FairShare); a rate's window, counted per admission whatever the
// weight, shown as Starts and Opens, slid by a waiter's renewal (Rate) and
// charged so that two handles never spend one token (RateConcurrent); and
// limits of different orders that never let a waiter pass one ahead of it
// where they agree and never deadlock (OrderAcrossLimits).
//
// The suite's own tests (mem_test.go) run it against an in-memory reference
// store, which must pass, and against that store with one planted bug at a
// time (a counter beside the tickets, no tombstones, renewal of expired
// leases, a check-then-act race, a reaper that trusts its scan, a release
// that frees a slot it read before a reaper removed it, a ticket that takes
// one limit at a time, a weight ignored in the count, a light ticket barging
// past a heavy head, a release that frees only a ticket's first limit, a
// supersede of held tickets or other keys, a replace admitted beside the
// ticket it replaces, a max-waiting counted before the supersede, a refusal
// that writes, a stop request lost on reopen, a resize that grows past a
// waiter or a limit's size or shrinks without promoting, a policy ignored,
// a rate charged outside the admitting step, aging off, ...),
// each of which must fail its case. Its admission is written by hand, not
// with policy.PlanSettle, so that the planner is checked against an
// independent reference.
//
// The tickets the suite writes name a holder on another host
// ("storetest.invalid") with no boot id, so no backend can prove them dead:
// they leave only by release or by expiry, except in the cases of death,
// where the suite's own judge (installed through [Harness.NewWithJudge])
// declares chosen tickets dead with [DeadEvidence].
package storetest
