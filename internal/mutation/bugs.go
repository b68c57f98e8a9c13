// Package mutation names the known lease bugs (docs/leases.md, "Bug classes";
// ids as there) that a test can switch back on in the real code, so that the
// simulation in internal/testkit/sim can prove it catches each of them.
//
// Test-only, and only with the build tag slotctl_mutations: without it (go
// build, go install, the released binaries) a Set has no state and Has is a
// constant false, so the compiler drops every guarded bug and the linker
// everything they call; the binary carries no code and no symbol of this
// package (cmd/internal/cli's TestNoMutationSymbols checks it). The
// mutation tests run with the tag:
//
//	go test -tags slotctl_mutations ./internal/testkit/sim/...
//
// The package is internal, so no other module can use it.
package mutation

// The store-side bugs live at their real location in store/policy: in the
// rules (policy.Options.Mutations) or in the planners every backend calls,
// policy.PlanSettle and policy.PlanResize (SettleInput.Mutations,
// ResizeInput.Mutations); only wall-clock is in store/boltstore's clock.
// The supervisor-side ones are in gate/holder (Config.Mutations), the
// protocol that slotctl run and the simulation both run; the death judge's
// in internal/proc (Judge.Mutations), but for pdeathsig-only, in the
// simulation's model of the guard.
const (
	// BlindReap: a reaper frees a slot for every ticket its earlier scan
	// listed, whether or not this reap deleted it, so two reapers free one
	// expired ticket twice (A2, duplicate reapers).
	BlindReap Bug = "blind-reap"
	// ReleaseCounter: a release that finds no ticket still frees a slot,
	// like a decrement of a counter beside the tickets (A4, A6).
	ReleaseCounter Bug = "release-counter"
	// ReleaseNoCompare: a release that finds its ticket gone removes
	// whoever holds its slot now: delete by slot, not compare-and-delete of
	// the caller's own ticket (A10, A3).
	ReleaseNoCompare Bug = "release-no-compare"
	// RenewExpired: a renewal of an expired ticket that no sweep removed yet
	// is accepted: expiry is not monotone (A7).
	RenewExpired Bug = "renew-expired"
	// StaleVerdict: a sweep judges expiry on the deadlines its store handle
	// read in an earlier scan, not on the record in the reaping transaction,
	// so a renewal that landed in between is not seen (A1, A8).
	StaleVerdict Bug = "stale-verdict"
	// NoTombstone: a removed ticket id is not remembered, so a retried or
	// late create brings it back (C5, S7).
	NoTombstone Bug = "no-tombstone"
	// WallClock: deadlines are written and judged on the wall clock, not on
	// the boot-time clock (D2).
	WallClock Bug = "wall-clock"
	// WeightIgnored: the planner (policy.PlanSettle) counts every ticket as
	// one slot, held or asking, so heavy tickets over-admit (H2).
	WeightIgnored Bug = "weight-ignored"
	// BargePastHead: the planner does not block the limits of a waiter that
	// is not admitted for want of room, so a lighter or younger ticket is
	// admitted past the older head it shares a limit with (H3).
	BargePastHead Bug = "barge-past-head"
	// ReplaceBeside: the planner (policy.PlanSettle) admits a replacing
	// ticket while the holder it replaces still holds its slot, so the new
	// job runs beside the one it replaces (R1).
	ReplaceBeside Bug = "replace-beside"
	// ResizePastWaiter: the resize planner (policy.PlanResize) grows a held
	// ticket while tickets wait in its limits, so the growth overtakes the
	// queue and the waiters' head starves (H4).
	ResizePastWaiter Bug = "resize-past-waiter"
	// ResizeOverSize: the resize planner grows a held ticket by what it
	// asks for, whether or not its limits have the room, so more slots are
	// held than the limit has (H5).
	ResizeOverSize Bug = "resize-over-size"
	// ResizeNoSettle: a shrink (policy.Store.Resize) frees the
	// ticket's slots but settles nothing, so the waiters it made room for
	// wait for some later write (L3).
	ResizeNoSettle Bug = "resize-no-settle"
	// SupersedeHeld: a superseding enqueue (policy.Store.Enqueue) removes
	// older tickets of its key whether they wait or hold, so a running job
	// loses its slot (R2).
	SupersedeHeld Bug = "supersede-held"
	// OrderFirstLimit: the planner (policy.PlanSettle) orders each waiter
	// by its first limit's policy only, so a waiter of several limits is
	// admitted past waiters that a later one of its limits puts ahead of
	// it (P1).
	OrderFirstLimit Bug = "order-first-limit"
	// RateStale: a settle (policy.Store) counts a rate against the starts
	// its store handle read in an earlier step, not the limit's record in
	// the admitting step, so two hosts spend one token (P2).
	RateStale Bug = "rate-stale"
	// AgingOff: the planner orders a priority limit by priority alone, so
	// a low priority waits as long as higher ones keep coming (P3).
	AgingOff Bug = "aging-off"
	// LostRecounted: the etcd store (store/etcdstore, releaseAbsent) logs
	// a holder's "lost" again on a repeated release (a retried or late
	// request): the event's key is overwritten, one in the log, but its
	// limits count it twice (S22). An etcd-only bug: the other stores log
	// each release as an event of its own.
	LostRecounted Bug = "lost-recounted"
	// SupersedeFirst: a superseding enqueue (store/policy, Store.Enqueue)
	// removes the older waiting tickets of its key in a step before, and
	// apart from, the one that writes its ticket, so a caller that dies
	// (or gives up) between the two leaves neither: runs superseded for a
	// ticket that was never written (S40). Caught on etcd, whose enqueue
	// the simulation can kill between two steps; the right rule removes
	// them in the ticket's own step, or marks the ticket first when they
	// do not fit in one (Rec.Superseding).
	SupersedeFirst Bug = "supersede-first"

	// WaiterNotRenewed: the supervisor renews only once admitted, and counts
	// its lease from the admission it observed (C4).
	WaiterNotRenewed Bug = "waiter-not-renewed"
	// ReleaseBeforeExit: on a terminating signal the supervisor releases the
	// ticket first and stops the child after (C7).
	ReleaseBeforeExit Bug = "release-before-exit"
	// HoldAndWait: the supervisor takes a ticket of several limits one
	// limit at a time, as tickets of one limit each, holding the earlier
	// ones while it waits for the next: two jobs that name the same limits
	// in other orders deadlock (H1).
	HoldAndWait Bug = "hold-and-wait"
	// LateLossGrace: a lease loss noticed past the local deadline (by a
	// supervisor resumed from a stop) gives the job its whole kill grace
	// before SIGKILL, not half the margin, so a job whose slot may be
	// another's already runs on beside it for the grace (D4, S24).
	LateLossGrace Bug = "late-loss-grace"
	// DrainBlind: once the job's command has exited, the supervisor drains
	// what it left without watching the lease, so a leftover that ignores
	// SIGTERM gets the whole kill grace, past the lease's end, and runs
	// beside the slot's next holder (rules 8 and 12).
	DrainBlind Bug = "drain-blind"
	// GuardUntold: the supervisor never tells the job's guard its lease,
	// so a supervisor stopped alone (kill -STOP) leaves its job running
	// past the lease's end, beside the slot's next holder (rule 8).
	GuardUntold Bug = "guard-untold"
	// HoldNotAdopted: a supervisor admitted without a lease of its own
	// running (a quiet waiter, or one whose own deadline passed) counts
	// its lease from the ticket as it joined, not from the hold the store
	// answered: the time left it read at its enqueue, taken as read at its
	// latest read, so its local deadline passes the store's (rule 17, S9).
	HoldNotAdopted Bug = "hold-not-adopted"
	// LateRenewalDeath: a host-local store takes a waiter's late renewal
	// for its death: the renewal is refused, and a settle sweeps an
	// expired waiter whose supervisor provably runs, so a loaded machine
	// costs a waiter its place and its run (rule 17).
	LateRenewalDeath Bug = "late-renewal-death"
	// HeldNoMore: a renewal that says held of a ticket the store has
	// waiting is accepted, as any renewal of a waiter is; only a store
	// file replaced by an older copy (a restored backup) makes one, and the
	// job admitted since the copy runs on a ticket that holds no slot,
	// beside whoever the store admits to it.
	HeldNoMore Bug = "held-no-more"
	// CommitIgnored: the bbolt store takes a write whose commit failed on
	// the disk (ENOSPC, a failed fsync) for done, and answers as if it
	// had: the caller believes what the store does not hold (fsyncgate).
	// Switched in store/boltstore's update; only a disk that fails finds
	// it (the simulation's TestSimDiskMutation, root only).
	CommitIgnored Bug = "commit-ignored"
	// MonotonicDeadline: the supervisor keeps its lease's deadlines on
	// CLOCK_MONOTONIC (Go's time.Now and time.Since), which stops while the
	// host is suspended, not on CLOCK_BOOTTIME: after a resume its lease
	// seems to have the time left that the store's clock already spent, and
	// its job runs on unleased (D4, rule 6). Switched where the holder's
	// clock is chosen: gate/holder's default, and the simulation's model of
	// the host's clocks, which stands in for it there (Config.Now).
	MonotonicDeadline Bug = "monotonic-deadline"

	// HostNameIdentity: the death judge (internal/proc) takes a ticket
	// whose host name is this host's for one of this boot, so a holder on a
	// clone or a container host of the same name is judged by pids that
	// are not its own, and reaped alive (docs/leases.md rule 17).
	HostNameIdentity Bug = "host-name-identity"
	// TimensIgnored: start times are read without taking the reader's time
	// namespace's offset off, so a supervisor in one records a start time
	// the host's reapers never see, and is judged gone (its pid reused)
	// while it runs (rule 17).
	TimensIgnored Bug = "timens-ignored"
	// ReplayedKill: the judge kills an orphaned job on the word of the
	// ticket in the store (the supervisor its record names), not the
	// owner's evidence, so a record written back after the job's release
	// kills what still carries its ticket (rule 17).
	ReplayedKill Bug = "replayed-kill"
	// PdeathsigOnly: the job is contained by the parent-death signal alone,
	// without the guard, so a SIGKILLed supervisor's command dies but the
	// processes it started run on (rule 16). A bug of the simulation's
	// model of the guard (internal/testkit/sim), which runs no guard
	// process.
	PdeathsigOnly Bug = "pdeathsig-only"
	// ForegroundUndrained: a job run in a terminal's foreground, in its
	// supervisor's process group, is drained by its command alone (a
	// group its supervisor is in cannot be waited on as the job's), so
	// what it left in the background runs on after the release (rule 8).
	// A bug of the simulation's model of the guard, like pdeathsig-only.
	ForegroundUndrained Bug = "foreground-undrained"
	// OrphansLeft: a supervisor whose guard was killed alone reports its
	// job gone without killing what the guard left (internal/guard's
	// killOrphans), so the job's processes run on after the release. A
	// bug of the simulation's model of the guard, like pdeathsig-only.
	OrphansLeft Bug = "orphans-left"
)

// All lists every Bug, store-side first, then the holder's and the judge's.
func All() []Bug {
	return []Bug{BlindReap, ReleaseCounter, ReleaseNoCompare, RenewExpired, StaleVerdict, NoTombstone, WallClock,
		WeightIgnored, BargePastHead, ReplaceBeside, SupersedeHeld, OrderFirstLimit, RateStale, AgingOff, ResizePastWaiter, ResizeOverSize, ResizeNoSettle, LateRenewalDeath, HeldNoMore, CommitIgnored, LostRecounted, SupersedeFirst,
		WaiterNotRenewed, ReleaseBeforeExit, HoldAndWait, LateLossGrace, DrainBlind, GuardUntold, MonotonicDeadline, HoldNotAdopted,
		HostNameIdentity, TimensIgnored, ReplayedKill, PdeathsigOnly, ForegroundUndrained, OrphansLeft}
}
