package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
)

// Backend is one fresh, empty store plus control of its clock.
type Backend struct {
	Store store.Store
	// Advance moves the store's clock forward by d: a fake clock for bbolt, a real sleep for etcd.
	Advance func(d time.Duration)
	// Reopen, if not nil, returns a new handle on the same data (a restart of
	// the process); the old handle is not used again.
	Reopen func() store.Store
	// Skewed, if not nil, returns another handle on the same data, used beside
	// Store, whose clock reads d ahead of Store's: a second reaper (another
	// process) whose reading of the store's clock is ahead. Skewed(0) is a
	// second handle with the same clock. Nil skips RenewAfterScanWins and
	// runs the other multi-reaper cases on Store alone.
	Skewed func(d time.Duration) store.Store
}

// Harness makes the stores the suite runs against.
type Harness struct {
	// New returns a new empty store on each call; cleanup goes through t.Cleanup.
	New func(t *testing.T) Backend
	// NewWithJudge, if not nil, is New for a store that proves holders dead
	// with j (bbolt: Options.Dead), so that the suite can declare tickets dead
	// (see [DeadEvidence]). Nil skips the cases of death.
	NewWithJudge func(t *testing.T, j store.Judge) Backend
	// TTL is the lease TTL of every ticket the suite writes (bbolt: 10s on a
	// fake clock; etcd: 2s real).
	TTL time.Duration
	// NewLegacy returns a Backend like New whose store already holds, written
	// in the previous release's format (record version 1: one limit, weight
	// 1), the legacy fixture: limit [LegacyLimit] of 2 slots and the tickets
	// [LegacyIDs] enqueued in that order, the first two held (slot indexes 0
	// and 1), the third waiting, each with TTL and its lease running from the
	// backend's now, holder [LegacyHolder].
	NewLegacy func(t *testing.T) Backend
	// ManyEvents: the backend logs more than store.MaxEvents events within
	// a few seconds, so that CountsSurvivePruning runs (counts.go).
	ManyEvents bool
}

// The legacy fixture (Harness.NewLegacy).
const LegacyLimit = "legacy"

// LegacyIDs are the fixture's ticket ids in fence order.
var LegacyIDs = []string{"legacy-a", "legacy-b", "legacy-c"}

// LegacyHolder is the holder of every fixture ticket.
var LegacyHolder = store.Holder{Host: "legacy-host", Pid: 4242, Label: "legacy"}

// DeadEvidence is the evidence the suite's judge gives for the tickets it
// declares dead; every other ticket it leaves to the TTL.
const DeadEvidence = "storetest: holder declared dead by the test judge"

// Run runs every case of the contract as a subtest of t, each on a new store.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("storetest: Harness.New is nil")
	}
	if h.TTL <= 0 {
		t.Fatalf("storetest: Harness.TTL is %v, want > 0", h.TTL)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.judge && h.NewWithJudge == nil {
				t.Skip("backend has no judge hook (Harness.NewWithJudge)")
			}
			c.run(newSuite(t, h, c.judge))
		})
	}
}

var cases = []struct {
	name  string
	run   func(*suite)
	judge bool // runs on Harness.NewWithJudge with the suite's judge
}{
	{"LimitCreatedOnceWithFirstSize", testLimitCreatedOnce, false},
	{"SlotsConflict", testSlotsConflict, false},
	{"FIFOPromotion", testFIFO, false},
	{"HeldAtMostSlots", testHeldAtMostSlots, false},
	{"SlotIndexesUniqueLowestFirst", testSlotIndexes, false},
	{"DoubleReleaseFreesOneSlot", testDoubleRelease, false},
	{"ReleaseMissingIsNoop", testReleaseMissing, false},
	{"ReleaseWrongFenceRemovesNothing", testReleaseWrongFence, false},
	{"CancelWaiting", testCancelWaiting, false},
	{"CancelPromoted", testCancelPromoted, false},
	{"CancelBeforeCreate", testCancelBeforeCreate, false},
	{"Close", testClose, false},
	{"RenewExpiredIsLost", testRenewExpired, false},
	{"RenewBeforeExpiryExtends", testRenewExtends, false},
	{"RenewReleasedIsLost", testRenewReleased, false},
	{"RenewHeldButWaitingIsLost", testRenewHeldButWaiting, false},
	{"RemovedIDCannotReturn", testRemovedIDRefused, false},
	{"EnqueueIdempotent", testEnqueueIdempotent, false},
	{"FencesIncrease", testFencesIncrease, false},
	{"ExpiredHolderSweptByEnqueue", testExpiredHolderSwept, false},
	{"WaitersAreLeased", testWaitersLeased, false},
	{"Resize", testResize, false},
	{"Pause", testPause, false},
	{"RemoveLimit", testRemoveLimit, false},
	{"Snapshot", testSnapshot, false},
	{"Heads", testHeads, false},
	{"GetTicket", testGet, false},
	{"WatchRings", testWatch, false},
	{"InvalidInput", testInvalid, false},
	{"Reopen", testReopen, false},
	{"Concurrent", testConcurrent, false},
	{"RenewAfterScanWins", testRenewAfterScan, false},
	{"TwoReapersFreeOnce", testTwoReapers, false},
	{"ReleaseRacingReap", testReleaseRacingReap, false},
	{"ReleaseAfterReap", testReleaseAfterReap, false},
	{"LateRenewAfterRelease", testLateRenewAfterRelease, false},
	{"LateRenewAfterReap", testLateRenewAfterReap, false},
	{"ReapNamedLimitsOnly", testReapNamedLimits, false},
	{"ReapDryRunMatchesReap", testReapDryRun, false},
	{"ReapFreesAndPromotes", testReapFrees, false},
	{"DeadHolderReapedAtOnce", testDeadHolderReaped, true},
	{"DeadHolderSweptOnAdmission", testDeadHolderSwept, true},
	{"LiveHolderKeptUntilTTL", testLiveHolderKept, true},
	{"SetChild", testSetChild, false},
	{"Events", testEvents, false},
	// Several limits and weights (docs/leases.md §2.1 item 9): multi.go.
	{"AtomicAdmissionAcrossLimits", testAtomicAdmission, false},
	{"WeightsCountedInSlots", testWeights, false},
	{"FIFOAcrossLimits", testFIFOAcrossLimits, false},
	{"HeavyHeadNotOvertaken", testHeavyHead, false},
	{"MultiReleasePromotesEveryLimit", testMultiRelease, false},
	{"ResizeAndPauseWithWeights", testResizeWeights, false},
	{"ReapMultiLimit", testReapMulti, false},
	{"DoubleReleaseMultiFreesOnce", testDoubleReleaseMulti, false},
	{"EnqueueRefusalsMulti", testEnqueueRefusals, false},
	{"SizesOfCreatedLimits", testSizes, false},
	{"EventsMultiLimit", testEventsMulti, false},
	{"RemoveLimitForceMulti", testRemoveLimitMulti, false},
	{"DeadMultiHolderFreesAll", testDeadMulti, true},
	{"LegacyFormatRead", testLegacy, false},
	{"ConcurrentMultiLimit", testConcurrentMulti, false},
	{"ReopenMultiLimit", testReopenMulti, false},
	// Newer runs first (docs/leases.md §2.1 item 10): newer.go.
	{"SupersedeOlderWaiting", testSupersedeWaiting, false},
	{"SupersedeScope", testSupersedeScope, false},
	{"ReplaceStopsHolder", testReplace, false},
	{"ReplaceFIFOPlace", testReplaceFIFO, false},
	{"MaxWaiting", testMaxWaiting, false},
	{"KeysComparedExactly", testKeysExact, false},
	{"KeyAndURLInvalid", testKeyURLInvalid, false},
	{"StopSurvivesReopen", testStopSurvivesReopen, false},
	{"ReplaceMultiLimit", testReplaceMulti, false},
	{"ConcurrentSupersede", testConcurrentSupersede, false},
	// A held ticket's weight changes (docs/leases.md §2.1 item 12): resize.go.
	{"ResizeShrinkPromotes", testResizeShrinkPromotes, false},
	{"ResizeGrowBlockedByWaiter", testResizeGrowBlockedByWaiter, false},
	{"ResizeGrowPartial", testResizeGrowPartial, false},
	{"ResizeCappedBySize", testResizeCappedBySize, false},
	{"ResizeRefused", testResizeRefused, false},
	{"ResizeRemovalFreesAll", testResizeRemovalFreesAll, false},
	{"ResizeKept", testResizeKept, false},
	{"ResizeEvents", testResizeEvents, false},
	{"ConcurrentResize", testConcurrentResize, false},
	// Counters (docs/leases.md §2.8) and store.Busy: counts.go.
	{"CountsEachKindOnce", testCountsEachKind, false},
	{"CountsEveryLimit", testCountsEveryLimit, false},
	{"CountsSurviveRestart", testCountsSurviveRestart, false},
	{"CountsSurvivePruning", testCountsSurvivePruning, false},
	{"CountsConcurrent", testCountsConcurrent, false},
	{"CountsLegacyFromZero", testCountsLegacy, false},
	{"BusyIsCancelUnderItsName", testBusy, false},
	// Scheduling policies (docs/scheduling.md): schedule.go.
	{"PolicyRefusals", testPolicyRefusals, false},
	{"PolicySet", testPolicySet, false},
	{"PriorityOrder", testPriorityOrder, false},
	{"PriorityAging", testPriorityAging, false},
	{"FairShare", testFairShare, false},
	{"Rate", testRate, false},
	{"RateConcurrent", testRateConcurrent, false},
	{"OrderAcrossLimits", testOrderAcrossLimits, false},
}

// suite is one case's store and helpers. Its helpers stop the case on the
// first broken expectation, naming the ticket by its letter and id.
type suite struct {
	*testing.T
	h      Harness
	b      Backend
	st     store.Store
	ctx    context.Context
	prefix string
	n      int
	names  map[string]string // id -> letter, for messages

	deadMu sync.Mutex
	dead   map[string]bool // ids the suite's judge declares dead
	acted  []string        // ids the judge was asked to act on (act set)
}

func newSuite(t *testing.T, h Harness, judge bool) *suite {
	t.Helper()
	s := &suite{T: t, h: h, names: map[string]string{}, dead: map[string]bool{}}
	var b Backend
	if judge {
		b = h.NewWithJudge(t, s.judge)
	} else {
		b = h.New(t)
	}
	if b.Store == nil {
		t.Fatal("storetest: Harness.New returned a Backend without a Store")
	}
	if b.Advance == nil {
		t.Fatal("storetest: Harness.New returned a Backend without Advance")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	var p [3]byte
	if _, err := rand.Read(p[:]); err != nil {
		t.Fatal(err)
	}
	s.b, s.st, s.ctx, s.prefix = b, b.Store, ctx, hex.EncodeToString(p[:])
	return s
}

// judge is the proof of death the suite installs through NewWithJudge.
func (s *suite) judge(tk store.Ticket, act bool) (string, bool) {
	s.deadMu.Lock()
	defer s.deadMu.Unlock()
	if act {
		s.acted = append(s.acted, tk.ID)
	}
	if s.dead[tk.ID] {
		return DeadEvidence, true
	}
	return "", false
}

// judgeActed returns the ids the judge was asked to act on since the last call.
func (s *suite) judgeActed() []string {
	s.deadMu.Lock()
	defer s.deadMu.Unlock()
	a := s.acted
	s.acted = nil
	return a
}

// kill makes the suite's judge declare tk's holder dead from now on.
func (s *suite) kill(tk store.Ticket) {
	s.deadMu.Lock()
	defer s.deadMu.Unlock()
	s.dead[tk.ID] = true
}

// id mints a new ticket id (lower-case hex, unique across runs) for the ticket called name.
func (s *suite) id(name string) string {
	id := fmt.Sprintf("%s%04x", s.prefix, s.n)
	s.n++
	s.names[id] = name
	return id
}

// who names a ticket id in messages.
func (s *suite) who(id string) string {
	if n, ok := s.names[id]; ok {
		return fmt.Sprintf("%s (%s)", n, id)
	}
	return fmt.Sprintf("%q", id)
}

// holder is a holder on another host, whose death no backend can prove.
func holder(name string) store.Holder {
	return store.Holder{
		Host:  "storetest.invalid",
		User:  "storetest",
		Pid:   4242,
		Argv:  []string{"storetest", name},
		Label: "storetest " + name,
	}
}

// pastTTL is an advance that expires every lease not renewed since.
func (s *suite) pastTTL() time.Duration { return s.h.TTL + s.h.TTL/2 }

// part is 0.6·TTL: two of them expire a lease, one does not.
func (s *suite) part() time.Duration { return s.h.TTL * 6 / 10 }

func (s *suite) advance(d time.Duration) { s.b.Advance(d) }

func (s *suite) req(name, limit string, slots int) store.EnqueueRequest {
	return store.EnqueueRequest{ID: s.id(name), Limit: limit, Slots: slots, TTL: s.h.TTL, Holder: holder(name)}
}

// enq enqueues a new ticket called name.
func (s *suite) enq(name, limit string, slots int) store.Ticket {
	s.Helper()
	return s.enqReq(s.req(name, limit, slots))
}

func (s *suite) enqReq(r store.EnqueueRequest) store.Ticket {
	s.Helper()
	tk, err := s.st.Enqueue(s.ctx, r)
	if err != nil {
		s.Fatalf("Enqueue %s into %q (weight %d, slots %d): %v", s.who(r.ID), r.Names(), r.Weight, r.Slots, err)
	}
	if tk.ID != r.ID || tk.Limit != r.Names()[0] {
		s.Fatalf("Enqueue %s into %q returned ticket %q in limit %q, want the view under its first limit %q", s.who(r.ID), r.Names(), tk.ID, tk.Limit, r.Names()[0])
	}
	if !slices.Equal(tk.Names(), r.Names()) || tk.Weighs() != r.Weighs() {
		s.Fatalf("Enqueue %s into %q weight %d returned a ticket of limits %q weight %d", s.who(r.ID), r.Names(), r.Weighs(), tk.Names(), tk.Weighs())
	}
	s.checkShape("Enqueue", tk)
	return tk
}

// checkShape checks the fields of a ticket that must agree with its state.
// A ticket of one limit and weight one may come in the old form (Limits
// empty, Weight 0, Indexes nil) or spelled out (Limits [Limit], Weight 1,
// Indexes {Limit: [Slot]}): it is read through Names, Weighs and In. A held
// ticket holds Weighs distinct indexes, ascending, in each of its limits
// (docs/leases.md §2.1 item 9), and Slot is the lowest of them in Limit.
func (s *suite) checkShape(op string, tk store.Ticket) {
	s.Helper()
	names := tk.Names()
	if !slices.Contains(names, tk.Limit) {
		s.Fatalf("%s %s: listed under limit %q, which is not one of its limits %q", op, s.who(tk.ID), tk.Limit, names)
	}
	if err := store.CheckLimits(names); err != nil {
		s.Fatalf("%s %s: limits %q: %v", op, s.who(tk.ID), names, err)
	}
	if tk.Weight < 0 {
		s.Fatalf("%s %s: weight %d", op, s.who(tk.ID), tk.Weight)
	}
	switch tk.State {
	case store.Held:
		if tk.Slot < 0 || tk.Position != 0 {
			s.Fatalf("%s %s: held with slot %d, position %d; want slot >= 0, position 0", op, s.who(tk.ID), tk.Slot, tk.Position)
		}
		for _, name := range names {
			ix := tk.In(name)
			if len(ix) != tk.Weighs() {
				s.Fatalf("%s %s: held, weight %d, holds indexes %v in %q (Indexes %v, Slot %d); want %d indexes in each of its limits %q",
					op, s.who(tk.ID), tk.Weighs(), ix, name, tk.Indexes, tk.Slot, tk.Weighs(), names)
			}
			for i, x := range ix {
				if x < 0 || i > 0 && x <= ix[i-1] {
					s.Fatalf("%s %s: holds indexes %v in %q; want distinct indexes >= 0, ascending", op, s.who(tk.ID), ix, name)
				}
			}
		}
		if ix := tk.In(tk.Limit); ix[0] != tk.Slot {
			s.Fatalf("%s %s: slot %d under %q, but its lowest index there is %d (indexes %v)", op, s.who(tk.ID), tk.Slot, tk.Limit, ix[0], ix)
		}
		for name := range tk.Indexes {
			if !slices.Contains(names, name) {
				s.Fatalf("%s %s: indexes %v name limit %q, not one of its limits %q", op, s.who(tk.ID), tk.Indexes, name, names)
			}
		}
	case store.Waiting:
		if tk.Slot != -1 || tk.Position < 1 {
			s.Fatalf("%s %s: waiting with slot %d, position %d; want slot -1, position >= 1", op, s.who(tk.ID), tk.Slot, tk.Position)
		}
		if len(tk.Indexes) != 0 {
			s.Fatalf("%s %s: waiting but holds indexes %v", op, s.who(tk.ID), tk.Indexes)
		}
	default:
		s.Fatalf("%s %s: state %q, want %q or %q", op, s.who(tk.ID), tk.State, store.Held, store.Waiting)
	}
}

// get reads tk back; it must be there with tk's limit and fence.
func (s *suite) get(tk store.Ticket) store.Ticket {
	s.Helper()
	got, err := s.st.Get(s.ctx, tk.ID)
	if err != nil {
		s.Fatalf("Get %s: %v", s.who(tk.ID), err)
	}
	if got.ID != tk.ID || got.Limit != tk.Limit || got.Fence != tk.Fence {
		s.Fatalf("Get %s: got id %q limit %q fence %d, want limit %q fence %d", s.who(tk.ID), got.ID, got.Limit, got.Fence, tk.Limit, tk.Fence)
	}
	s.checkShape("Get", got)
	return got
}

// wantHeld checks that tk is live and held, in slot (any slot when slot < 0).
func (s *suite) wantHeld(tk store.Ticket, slot int) store.Ticket {
	s.Helper()
	got := s.get(tk)
	if got.State != store.Held {
		s.Fatalf("%s is %s at position %d, want held", s.who(tk.ID), got.State, got.Position)
	}
	if slot >= 0 && got.Slot != slot {
		s.Fatalf("%s holds slot %d, want slot %d", s.who(tk.ID), got.Slot, slot)
	}
	if got.Expired() {
		s.Fatalf("%s is held but expired (remaining %v)", s.who(tk.ID), got.Remaining)
	}
	return got
}

// wantWaiting checks that tk is live and waiting at position pos.
func (s *suite) wantWaiting(tk store.Ticket, pos int) store.Ticket {
	s.Helper()
	got := s.get(tk)
	if got.State != store.Waiting {
		s.Fatalf("%s is held in slot %d, want waiting at position %d", s.who(tk.ID), got.Slot, pos)
	}
	if got.Position != pos {
		s.Fatalf("%s waits at position %d, want %d", s.who(tk.ID), got.Position, pos)
	}
	if got.Expired() {
		s.Fatalf("%s is waiting but expired (remaining %v)", s.who(tk.ID), got.Remaining)
	}
	return got
}

// wantGone checks that no live ticket has tk's id.
func (s *suite) wantGone(tk store.Ticket) {
	s.Helper()
	got, err := s.st.Get(s.ctx, tk.ID)
	if err == nil {
		s.Fatalf("Get %s: found it (%s, slot %d, position %d, fence %d, remaining %v), want ErrNotFound",
			s.who(tk.ID), got.State, got.Slot, got.Position, got.Fence, got.Remaining)
	}
	if !errors.Is(err, store.ErrNotFound) {
		s.Fatalf("Get %s: %v, want an error wrapping ErrNotFound", s.who(tk.ID), err)
	}
}

// wantNotLive checks that tk is gone, or still stored but judged expired.
func (s *suite) wantNotLive(tk store.Ticket) {
	s.Helper()
	got, err := s.st.Get(s.ctx, tk.ID)
	switch {
	case err == nil && !got.Expired():
		s.Fatalf("Get %s: live again (%s, remaining %v) after its lease expired", s.who(tk.ID), got.State, got.Remaining)
	case err != nil && !errors.Is(err, store.ErrNotFound):
		s.Fatalf("Get %s: %v, want an expired ticket or ErrNotFound", s.who(tk.ID), err)
	}
}

func (s *suite) release(tk store.Ticket, want bool) {
	s.Helper()
	s.releaseWhy(tk, store.Released, want)
}

func (s *suite) releaseWhy(tk store.Ticket, why store.Reason, want bool) {
	s.Helper()
	ok, err := s.st.Release(s.ctx, tk, why)
	if err != nil {
		s.Fatalf("Release %s (fence %d, %s): %v", s.who(tk.ID), tk.Fence, why, err)
	}
	if ok != want {
		s.Fatalf("Release %s (fence %d, %s) = %v, want %v", s.who(tk.ID), tk.Fence, why, ok, want)
	}
}

func (s *suite) cancel(tk store.Ticket, want bool) {
	s.Helper()
	ok, err := s.st.Cancel(s.ctx, tk)
	if err != nil {
		s.Fatalf("Cancel %s (fence %d): %v", s.who(tk.ID), tk.Fence, err)
	}
	if ok != want {
		s.Fatalf("Cancel %s (fence %d) = %v, want %v", s.who(tk.ID), tk.Fence, ok, want)
	}
}

func (s *suite) renew(tk store.Ticket) store.Ticket {
	s.Helper()
	got, err := s.st.Renew(s.ctx, tk, s.h.TTL)
	if err != nil {
		s.Fatalf("Renew %s: %v", s.who(tk.ID), err)
	}
	if got.ID != tk.ID || got.Fence != tk.Fence {
		s.Fatalf("Renew %s: returned id %q fence %d, want fence %d", s.who(tk.ID), got.ID, got.Fence, tk.Fence)
	}
	s.checkShape("Renew", got)
	if got.Remaining <= s.h.TTL/2 {
		s.Fatalf("Renew %s: remaining %v right after renewing for %v", s.who(tk.ID), got.Remaining, s.h.TTL)
	}
	return got
}

func (s *suite) wantLost(tk store.Ticket) {
	s.Helper()
	got, err := s.st.Renew(s.ctx, tk, s.h.TTL)
	if err == nil {
		s.Fatalf("Renew %s (fence %d): renewed (%s, remaining %v), want ErrLost", s.who(tk.ID), tk.Fence, got.State, got.Remaining)
	}
	if !errors.Is(err, store.ErrLost) {
		s.Fatalf("Renew %s (fence %d): %v, want an error wrapping ErrLost", s.who(tk.ID), tk.Fence, err)
	}
}

func (s *suite) setLimit(name string, slots int) store.Limit {
	s.Helper()
	l, err := s.st.SetLimit(s.ctx, name, slots)
	if err != nil {
		s.Fatalf("SetLimit(%q, %d): %v", name, slots, err)
	}
	if l.Name != name || l.Slots != slots {
		s.Fatalf("SetLimit(%q, %d) returned limit %q with %d slots", name, slots, l.Name, l.Slots)
	}
	return l
}

func (s *suite) removeLimit(name string, force bool, want error) {
	s.Helper()
	err := s.st.RemoveLimit(s.ctx, name, force)
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		s.Fatalf("RemoveLimit(%q, force=%v): %v, want %v", name, force, err, want)
	}
}

// snap reads a snapshot and checks what every snapshot must satisfy: ticket
// order, counts that match the tickets, unique slot indexes among holders,
// and waiter positions 1..n in fence order.
func (s *suite) snap(limits ...string) store.Snapshot {
	s.Helper()
	sn, err := s.st.Snapshot(s.ctx, limits...)
	if err != nil {
		s.Fatalf("Snapshot(%q): %v", limits, err)
	}
	if sn.Now.IsZero() {
		s.Errorf("Snapshot(%q): Now is zero", limits)
	}
	byName := map[string]store.Limit{}
	for _, l := range sn.Limits {
		if _, dup := byName[l.Name]; dup {
			s.Fatalf("Snapshot(%q): limit %q listed twice", limits, l.Name)
		}
		byName[l.Name] = l
	}
	type count struct{ held, waiting int }
	counts := map[string]*count{}
	slotsUsed := map[string]map[int]string{}
	listed := map[string][]store.Ticket{} // id -> its views, one per limit listed
	for i, tk := range sn.Tickets {
		if _, ok := byName[tk.Limit]; !ok {
			s.Fatalf("Snapshot(%q): ticket %s is in limit %q, which the snapshot does not list", limits, s.who(tk.ID), tk.Limit)
		}
		s.checkShape("Snapshot", tk)
		if i > 0 {
			p := sn.Tickets[i-1]
			if !ticketLess(p, tk) {
				s.Fatalf("Snapshot(%q): ticket %s (%s %s fence %d) listed before %s (%s %s fence %d); want by limit, held first, then by fence",
					limits, s.who(p.ID), p.Limit, p.State, p.Fence, s.who(tk.ID), tk.Limit, tk.State, tk.Fence)
			}
		}
		c := counts[tk.Limit]
		if c == nil {
			c = &count{}
			counts[tk.Limit] = c
			slotsUsed[tk.Limit] = map[int]string{}
		}
		listed[tk.ID] = append(listed[tk.ID], tk)
		if tk.State == store.Held {
			c.held += tk.Weighs() // Limit.Held counts slots
			for _, ix := range tk.In(tk.Limit) {
				if other, dup := slotsUsed[tk.Limit][ix]; dup {
					s.Fatalf("Snapshot(%q): %s and %s both hold slot %d of %q", limits, s.who(other), s.who(tk.ID), ix, tk.Limit)
				}
				slotsUsed[tk.Limit][ix] = tk.ID
			}
		} else {
			c.waiting++
			if tk.Position != c.waiting {
				s.Fatalf("Snapshot(%q): %s is waiter %d of %q in fence order but reports position %d", limits, s.who(tk.ID), c.waiting, tk.Limit, tk.Position)
			}
		}
	}
	for _, l := range sn.Limits {
		c := counts[l.Name]
		if c == nil {
			c = &count{}
		}
		if l.Held != c.held || l.Waiting != c.waiting {
			s.Fatalf("Snapshot(%q): limit %q reports %d held, %d waiting; its tickets hold %d slots, %d wait", limits, l.Name, l.Held, l.Waiting, c.held, c.waiting)
		}
	}
	// A ticket of several limits is listed under each of them the snapshot
	// lists, in one state everywhere: admission is all or none (docs/leases.md
	// §2.1 item 9), never held in one limit and waiting in another.
	for id, views := range listed {
		first := views[0]
		seen := map[string]bool{}
		for _, v := range views {
			if seen[v.Limit] {
				s.Fatalf("Snapshot(%q): %s listed twice under %q", limits, s.who(id), v.Limit)
			}
			seen[v.Limit] = true
			if v.State != first.State || v.Fence != first.Fence || v.Weighs() != first.Weighs() || !slices.Equal(v.Names(), first.Names()) {
				s.Fatalf("Snapshot(%q): %s is %s (fence %d, limits %q, weight %d) under %q but %s (fence %d, limits %q, weight %d) under %q: a ticket is admitted to all of its limits or to none",
					limits, s.who(id), first.State, first.Fence, first.Names(), first.Weighs(), first.Limit, v.State, v.Fence, v.Names(), v.Weighs(), v.Limit)
			}
		}
		for _, name := range first.Names() {
			if _, ok := byName[name]; ok && !seen[name] {
				s.Fatalf("Snapshot(%q): %s (limits %q) is listed under %q but not under its limit %q", limits, s.who(id), first.Names(), first.Limit, name)
			}
		}
		if first.State == store.Held {
			for _, v := range views {
				for _, name := range first.Names() {
					if !slices.Equal(v.In(name), first.In(name)) {
						s.Fatalf("Snapshot(%q): %s holds %v in %q as listed under %q, %v as listed under %q", limits, s.who(id), first.In(name), name, first.Limit, v.In(name), v.Limit)
					}
				}
			}
		}
	}
	return sn
}

func ticketLess(a, b store.Ticket) bool {
	if a.Limit != b.Limit {
		return a.Limit < b.Limit
	}
	if a.State != b.State {
		return a.State == store.Held
	}
	return a.Fence < b.Fence
}

func findLimit(sn store.Snapshot, name string) (store.Limit, bool) {
	for _, l := range sn.Limits {
		if l.Name == name {
			return l, true
		}
	}
	return store.Limit{}, false
}

// checkLimit checks a limit's size and counts through a snapshot of it.
func (s *suite) checkLimit(name string, slots, held, waiting int) {
	s.Helper()
	sn := s.snap(name)
	l, ok := findLimit(sn, name)
	if !ok {
		s.Fatalf("Snapshot(%q): limit missing", name)
	}
	if l.Slots != slots || l.Held != held || l.Waiting != waiting {
		s.Fatalf("limit %q: %d slots, %d held, %d waiting; want %d slots, %d held, %d waiting", name, l.Slots, l.Held, l.Waiting, slots, held, waiting)
	}
}

func (s *suite) wantNoLimit(name string) {
	s.Helper()
	if l, ok := findLimit(s.snap(), name); ok {
		s.Fatalf("limit %q exists (%d slots, %d held, %d waiting), want none", name, l.Slots, l.Held, l.Waiting)
	}
}

// slotsOf returns the slot indexes the given tickets hold, in order.
func (s *suite) slotsOf(tks ...store.Ticket) []int {
	s.Helper()
	var out []int
	for _, tk := range tks {
		out = append(out, s.wantHeld(tk, -1).Slot)
	}
	sort.Ints(out)
	return out
}

func (s *suite) wantSlots(want []int, tks ...store.Ticket) {
	s.Helper()
	if got := s.slotsOf(tks...); !slices.Equal(got, want) {
		s.Fatalf("holders hold slots %v, want %v", got, want)
	}
}

// --- cases ---

// The first Enqueue creates the limit with its Slots; later ones do not resize it.
func testLimitCreatedOnce(s *suite) {
	s.wantNoLimit("build")
	a := s.enq("A", "build", 2)
	s.wantHeld(a, 0)
	s.checkLimit("build", 2, 1, 0)
	b := s.enq("B", "build", 5)
	s.wantHeld(b, 1)
	s.checkLimit("build", 2, 2, 0)
	c := s.enq("C", "build", 7)
	if c.State != store.Waiting {
		s.Fatalf("C (slots 7) was admitted as a third holder of a 2-slot limit: the limit took a later request's size")
	}
	s.checkLimit("build", 2, 2, 1)
}

// CheckSlots refuses another size; without it the request is admitted as usual.
func testSlotsConflict(s *suite) {
	s.enq("A", "build", 2)
	r := s.req("B", "build", 3)
	r.CheckSlots = true
	tk, err := s.st.Enqueue(s.ctx, r)
	var sc *store.SlotsConflictError
	if !errors.As(err, &sc) {
		s.Fatalf("Enqueue B with CheckSlots, 3 slots into a 2-slot limit: ticket %+v, err %v; want *store.SlotsConflictError", tk, err)
	}
	if sc.Limit != "build" || sc.Have != 2 || sc.Want != 3 {
		s.Errorf("SlotsConflictError = %+v, want Limit build, Have 2, Want 3", *sc)
	}
	s.wantGone(store.Ticket{ID: r.ID})
	s.checkLimit("build", 2, 1, 0)

	same := s.req("C", "build", 2)
	same.CheckSlots = true
	c := s.enqReq(same)
	s.wantHeld(c, 1)

	d := s.enq("D", "build", 3) // no CheckSlots: another size is fine
	s.wantWaiting(d, 1)
	s.checkLimit("build", 2, 2, 1)

	// The refused request created nothing, so its id is still free.
	r.Slots = 2
	b := s.enqReq(r)
	s.wantWaiting(b, 2)
}

// Waiters are admitted in the order they were enqueued.
func testFIFO(s *suite) {
	a := s.enq("A", "q", 1)
	b := s.enq("B", "q", 1)
	c := s.enq("C", "q", 1)
	s.wantHeld(a, 0)
	s.wantWaiting(b, 1)
	s.wantWaiting(c, 2)
	s.release(a, true)
	s.wantGone(a)
	s.wantHeld(b, 0)
	s.wantWaiting(c, 1)
	s.release(b, true)
	s.wantHeld(c, 0)
	s.checkLimit("q", 1, 1, 0)
}

func testHeldAtMostSlots(s *suite) {
	var tks []store.Ticket
	for i := range 5 {
		tks = append(tks, s.enq(string(rune('A'+i)), "q", 2))
	}
	s.wantSlots([]int{0, 1}, tks[0], tks[1])
	for i, tk := range tks[2:] {
		s.wantWaiting(tk, i+1)
	}
	s.checkLimit("q", 2, 2, 3)
}

// Slot indexes are unique among holders and a freed index is reused lowest first.
func testSlotIndexes(s *suite) {
	a := s.enq("A", "q", 3)
	b := s.enq("B", "q", 3)
	c := s.enq("C", "q", 3)
	s.wantHeld(a, 0)
	s.wantHeld(b, 1)
	s.wantHeld(c, 2)
	s.release(a, true) // frees 0
	s.release(c, true) // frees 2, last
	d := s.enq("D", "q", 3)
	s.wantHeld(d, 0)
	e := s.enq("E", "q", 3)
	s.wantHeld(e, 2)
	s.wantSlots([]int{0, 1, 2}, b, d, e)
	f := s.enq("F", "q", 3)
	s.wantWaiting(f, 1)
	s.release(b, true) // frees 1: F is promoted into it
	s.wantHeld(f, 1)
	s.wantSlots([]int{0, 1, 2}, d, e, f)
	s.checkLimit("q", 3, 3, 0)
}

// Two releases of one ticket free one slot.
func testDoubleRelease(s *suite) {
	a := s.enq("A", "q", 1)
	b := s.enq("B", "q", 1)
	c := s.enq("C", "q", 1)
	s.release(a, true)
	s.release(a, false)
	s.releaseWhy(a, store.Reaped, false)
	s.wantHeld(b, 0)
	s.wantWaiting(c, 1)
	s.checkLimit("q", 1, 1, 1)
}

// Releasing a ticket that is not there changes nothing.
func testReleaseMissing(s *suite) {
	ghost := store.Ticket{ID: s.id("ghost"), Limit: "nolimit", State: store.Held, Fence: 1, Slot: 0}
	s.release(ghost, false)
	s.wantNoLimit("nolimit")

	a := s.enq("A", "q", 1)
	b := s.enq("B", "q", 1)
	other := store.Ticket{ID: s.id("other"), Limit: "q", State: store.Held, Fence: a.Fence, Slot: 0}
	s.release(other, false)
	s.wantHeld(a, 0)
	s.wantWaiting(b, 1)
	s.checkLimit("q", 1, 1, 1)
}

// Release and Renew compare the fence: a stale copy of a ticket touches nothing.
func testReleaseWrongFence(s *suite) {
	a := s.enq("A", "q", 1)
	b := s.enq("B", "q", 1)
	for _, f := range []uint64{a.Fence + 1000, b.Fence, a.Fence ^ 1<<40} {
		stale := a
		stale.Fence = f
		s.release(stale, false)
		s.wantHeld(a, 0)
		s.wantWaiting(b, 1)
		s.wantLost(stale)
	}
	s.checkLimit("q", 1, 1, 1)
	s.renew(a)
	s.release(a, true)
	s.wantHeld(b, 0)
}

// Expiry is monotone: an expired ticket is not renewed and does not come back.
func testRenewExpired(s *suite) {
	a := s.enq("A", "q", 1)
	s.advance(s.pastTTL())
	s.wantLost(a)
	s.wantNotLive(a)
	s.wantLost(a)
	b := s.enq("B", "q", 1) // sweeps A
	if b.State != store.Held {
		s.Fatalf("B is waiting at position %d behind A, whose lease expired: the Enqueue did not sweep it", b.Position)
	}
	s.wantGone(a)
	s.wantLost(a)
	s.release(a, false)
	s.checkLimit("q", 1, 1, 0)
}

// A renewal moves the lease to now+TTL, for holders and waiters alike.
func testRenewExtends(s *suite) {
	a := s.enq("A", "q", 1)
	s.advance(s.part())
	a = s.renew(a)
	if a.State != store.Held {
		s.Fatalf("Renew A: state %s, want held", a.State)
	}
	s.advance(s.part()) // 1.2 TTL after Enqueue, 0.6 after the renewal
	s.wantHeld(a, 0)
	b := s.enq("B", "q", 1)
	if b.State != store.Waiting {
		s.Fatalf("B was admitted while A holds the only slot on a renewed lease: A's renewal did not extend its lease")
	}
	s.wantHeld(a, 0)
	s.advance(s.part()) // 1.2 TTL after A's renewal
	s.wantLost(a)
	c := s.enq("C", "q", 1) // sweeps A; B was enqueued 0.6 TTL ago
	s.wantHeld(b, 0)
	s.wantWaiting(c, 1)
}

func testRenewReleased(s *suite) {
	a := s.enq("A", "q", 1)
	s.release(a, true)
	s.wantLost(a)
	s.wantGone(a)
	s.wantLost(store.Ticket{ID: s.id("ghost"), Limit: "q", Fence: a.Fence, State: store.Held})
	s.wantNoLimitTicket("q")
}

// A renewal that says its ticket is held, of a ticket the store has
// waiting, is lost, and the ticket goes: nothing but a store restored from
// an older copy moves a held ticket back into the queue, and that store no
// longer counts the slot its job uses (admitted with nobody behind it, the
// ticket would count it twice).
func testRenewHeldButWaiting(s *suite) {
	x := s.enq("X", "q", 1)
	w := s.enq("W", "q", 1)
	if w.State != store.Waiting {
		s.Fatalf("W: %s beside X in a limit of one slot, want waiting", w.State)
	}
	w.State = store.Held
	s.wantLost(w)
	s.wantGone(w)
	s.renew(x)
	s.checkLimit("q", 1, 1, 0)
}

// wantNoLimitTicket checks that limit has no tickets.
func (s *suite) wantNoLimitTicket(limit string) {
	s.Helper()
	for _, tk := range s.snap().Tickets {
		if tk.Limit == limit {
			s.Fatalf("limit %q still has ticket %s (%s)", limit, s.who(tk.ID), tk.State)
		}
	}
}

// A removed id is tombstoned: a retried create never brings it back.
func testRemovedIDRefused(s *suite) {
	again := func(tk store.Ticket, limit, how string) {
		s.Helper()
		r := store.EnqueueRequest{ID: tk.ID, Limit: limit, Slots: 1, TTL: s.h.TTL, Holder: holder(s.names[tk.ID])}
		got, err := s.st.Enqueue(s.ctx, r)
		if !errors.Is(err, store.ErrRemoved) {
			s.Fatalf("Enqueue %s into %q after it was %s: ticket (%s, fence %d), err %v; want ErrRemoved", s.who(tk.ID), limit, how, got.State, got.Fence, err)
		}
		s.wantGone(tk)
	}

	a := s.enq("A", "q", 1)
	s.release(a, true)
	again(a, "q", "released")
	again(a, "other", "released")

	b := s.enq("B", "q", 1)
	c := s.enq("C", "q", 1)
	s.cancel(c, true)
	again(c, "q", "cancelled")
	s.wantHeld(b, 0)

	d := s.enq("D", "r", 1)
	s.advance(s.pastTTL())
	e := s.enq("E", "r", 1) // sweeps D
	s.wantHeld(e, 0)
	again(d, "r", "swept as expired")

	// Expired, not yet swept: the retry may sweep it or return it expired,
	// never a live ticket.
	f := s.enq("F", "s", 1)
	s.advance(s.pastTTL())
	got, err := s.st.Enqueue(s.ctx, store.EnqueueRequest{ID: f.ID, Limit: "s", Slots: 1, TTL: s.h.TTL, Holder: holder("F")})
	switch {
	case errors.Is(err, store.ErrRemoved):
	case err != nil:
		s.Fatalf("Enqueue F again after its lease expired: %v, want ErrRemoved or the expired ticket", err)
	case got.Fence != f.Fence || !got.Expired():
		s.Fatalf("Enqueue F again after its lease expired: a live ticket (%s, fence %d, remaining %v) came back", got.State, got.Fence, got.Remaining)
	}
	s.wantLost(f)
	s.wantNotLive(f)
}

// Enqueueing a live id again returns the same ticket and adds none.
func testEnqueueIdempotent(s *suite) {
	ra := s.req("A", "q", 1)
	a := s.enqReq(ra)
	rb := s.req("B", "q", 1)
	b := s.enqReq(rb)
	for range 2 {
		a2 := s.enqReq(ra)
		if a2.Fence != a.Fence || a2.State != store.Held || a2.Slot != a.Slot {
			s.Fatalf("Enqueue A again: (%s, slot %d, fence %d), want the same ticket (%s, slot %d, fence %d)", a2.State, a2.Slot, a2.Fence, a.State, a.Slot, a.Fence)
		}
		b2 := s.enqReq(rb)
		if b2.Fence != b.Fence || b2.State != store.Waiting || b2.Position != 1 {
			s.Fatalf("Enqueue B again: (%s, position %d, fence %d), want the same ticket (waiting, position 1, fence %d)", b2.State, b2.Position, b2.Fence, b.Fence)
		}
	}
	c := s.enq("C", "q", 1)
	s.wantWaiting(b, 1) // the retry did not send B to the back
	s.wantWaiting(c, 2)
	sn := s.snap()
	if len(sn.Tickets) != 3 {
		s.Fatalf("Snapshot: %d tickets, want 3 (A, B, C once each)", len(sn.Tickets))
	}
	s.checkLimit("q", 1, 1, 2)
	s.release(a, true)
	s.wantHeld(b, 0)
}

// Fences strictly increase with every new ticket, whatever limit and whatever was released.
func testFencesIncrease(s *suite) {
	var last store.Ticket
	step := func(tk store.Ticket) {
		s.Helper()
		if last.ID != "" && tk.Fence <= last.Fence {
			s.Fatalf("%s got fence %d, not above %s's fence %d", s.who(tk.ID), tk.Fence, s.who(last.ID), last.Fence)
		}
		last = tk
	}
	a := s.enq("A", "a", 1)
	step(a)
	b := s.enq("B", "b", 2)
	step(b)
	c := s.enq("C", "a", 1)
	step(c)
	s.release(a, true) // C promoted: it keeps its fence
	s.wantHeld(c, 0)
	step(s.enq("D", "b", 2))
	s.release(c, true)
	s.release(b, true)
	step(s.enq("E", "a", 1))
	s.setLimit("c", 1)
	step(s.enq("F", "c", 1))
	s.removeLimit("c", true, nil)
	step(s.enq("G", "c", 1))
	s.advance(s.pastTTL())
	step(s.enq("H", "a", 1)) // after a sweep of E
	fences := map[uint64]string{}
	for _, tk := range s.snap().Tickets {
		if other, dup := fences[tk.Fence]; dup {
			s.Fatalf("%s and %s share fence %d", s.who(other), s.who(tk.ID), tk.Fence)
		}
		fences[tk.Fence] = tk.ID
	}
}

// Every Enqueue sweeps its limit: expired holders go, their slots go to the next waiters.
func testExpiredHolderSwept(s *suite) {
	a := s.enq("A", "q", 2)
	b := s.enq("B", "q", 2)
	s.advance(s.part())
	c := s.enq("C", "q", 2)
	d := s.enq("D", "q", 2)
	e := s.enq("E", "q", 2)
	s.advance(s.part()) // A, B expired; C, D, E at 0.6 TTL
	if l, _ := findLimit(s.snap("q"), "q"); l.Held > 2 {
		s.Fatalf("limit q: %d held, more than its 2 slots", l.Held)
	}
	f := s.enq("F", "q", 2)
	if f.State != store.Waiting || f.Position != 2 {
		s.Fatalf("F: %s at position %d, want waiting at position 2 (behind E)", f.State, f.Position)
	}
	s.wantGone(a)
	s.wantGone(b)
	s.wantLost(a)
	s.release(b, false)
	s.wantSlots([]int{0, 1}, c, d)
	s.wantWaiting(e, 1)
	s.wantWaiting(f, 2)
	s.checkLimit("q", 2, 2, 2)
}

// A waiter holds a lease like a holder: unrenewed it expires and is swept; renewed it keeps its place.
func testWaitersLeased(s *suite) {
	a := s.enq("A", "q", 1)
	b := s.enq("B", "q", 1)
	c := s.enq("C", "q", 1)
	s.advance(s.part())
	a = s.renew(a)
	c = s.renew(c)
	if c.State != store.Waiting {
		s.Fatalf("Renew C: %s, want waiting", c.State)
	}
	s.advance(s.part()) // B expired; A, C renewed 0.6 TTL ago
	d := s.enq("D", "q", 1)
	s.wantGone(b)
	s.wantLost(b)
	s.wantHeld(a, 0)
	s.wantWaiting(c, 1)
	s.wantWaiting(d, 2)
	s.release(a, true)
	s.wantHeld(c, 0)
	s.wantWaiting(d, 1)
}

// Growing a limit admits waiters; shrinking evicts nobody and admits nobody until held < slots.
func testResize(s *suite) {
	a := s.enq("A", "q", 1)
	var w []store.Ticket
	for _, n := range []string{"B", "C", "D", "E"} {
		w = append(w, s.enq(n, "q", 1))
	}
	b, c, d, e := w[0], w[1], w[2], w[3]
	s.setLimit("q", 3)
	s.wantSlots([]int{0, 1, 2}, a, b, c)
	s.wantWaiting(d, 1)
	s.wantWaiting(e, 2)
	s.checkLimit("q", 3, 3, 2)

	s.setLimit("q", 1)
	s.wantSlots([]int{0, 1, 2}, a, b, c)
	s.checkLimit("q", 1, 3, 2)
	s.release(a, true)
	s.wantWaiting(d, 1)
	s.checkLimit("q", 1, 2, 2)
	f := s.enq("F", "q", 1)
	s.wantWaiting(f, 3)
	s.release(b, true)
	s.wantWaiting(d, 1)
	s.checkLimit("q", 1, 1, 3)
	s.release(c, true)
	s.wantHeld(d, 0)
	s.wantWaiting(e, 1)
	s.checkLimit("q", 1, 1, 2)

	s.setLimit("new", 2)
	s.checkLimit("new", 2, 0, 0)
}

// 0 slots pauses admission; giving slots back admits the first waiters.
func testPause(s *suite) {
	a := s.enq("A", "p", 0)
	b := s.enq("B", "p", 0)
	s.wantWaiting(a, 1)
	s.wantWaiting(b, 2)
	s.checkLimit("p", 0, 0, 2)
	s.setLimit("p", 1)
	s.wantHeld(a, 0)
	s.wantWaiting(b, 1)
	s.setLimit("p", 0)
	s.wantHeld(a, 0) // pausing evicts nobody
	s.release(a, true)
	s.wantWaiting(b, 1)
	c := s.enq("C", "p", 0)
	s.wantWaiting(c, 2)
	s.checkLimit("p", 0, 0, 2)
	s.setLimit("p", 1)
	s.wantHeld(b, 0)
	s.wantWaiting(c, 1)
}

func testRemoveLimit(s *suite) {
	a := s.enq("A", "r", 1)
	b := s.enq("B", "r", 1)
	s.removeLimit("r", false, store.ErrLimitInUse)
	s.wantHeld(a, 0)
	s.wantWaiting(b, 1)
	s.checkLimit("r", 1, 1, 1)
	s.removeLimit("r", true, nil)
	s.wantGone(a)
	s.wantGone(b)
	s.wantLost(a)
	s.release(b, false)
	s.wantNoLimit("r")
	s.removeLimit("r", false, store.ErrLimitNotFound)
	s.removeLimit("r", true, store.ErrLimitNotFound)
	s.removeLimit("missing", false, store.ErrLimitNotFound)

	s.setLimit("empty", 2)
	s.removeLimit("empty", false, nil)
	s.wantNoLimit("empty")

	// Force-released ids are removed ids.
	_, err := s.st.Enqueue(s.ctx, store.EnqueueRequest{ID: a.ID, Limit: "r", Slots: 1, TTL: s.h.TTL, Holder: holder("A")})
	if !errors.Is(err, store.ErrRemoved) {
		s.Errorf("Enqueue A again after RemoveLimit(force) removed it: err %v, want ErrRemoved", err)
	}
	c := s.enq("C", "x", 2)
	s.wantHeld(c, 0)
	s.checkLimit("x", 2, 1, 0)
}

func testSnapshot(s *suite) {
	// Enqueued across limits, so that fence order is not the snapshot's order.
	s.enq("B1", "b", 1)
	a1 := s.enq("A1", "a", 2)
	a2 := s.enq("A2", "a", 2)
	s.enq("B2", "b", 1)
	a3 := s.enq("A3", "a", 2)
	s.setLimit("c", 1)

	ids := func(sn store.Snapshot) []string {
		var out []string
		for _, tk := range sn.Tickets {
			out = append(out, s.names[tk.ID])
		}
		return out
	}
	limitsOf := func(sn store.Snapshot) []string {
		var out []string
		for _, l := range sn.Limits {
			out = append(out, fmt.Sprintf("%s %d/%d+%d", l.Name, l.Held, l.Slots, l.Waiting))
		}
		sort.Strings(out)
		return out
	}

	sn := s.snap("a", "c")
	if got, want := limitsOf(sn), []string{"a 2/2+1", "c 0/1+0"}; !slices.Equal(got, want) {
		s.Fatalf(`Snapshot("a", "c") limits (held/slots+waiting) %q, want %q`, got, want)
	}
	if got, want := ids(sn), []string{"A1", "A2", "A3"}; !slices.Equal(got, want) {
		s.Fatalf(`Snapshot("a", "c") tickets %q, want %q`, got, want)
	}

	sn = s.snap("b")
	if got, want := ids(sn), []string{"B1", "B2"}; !slices.Equal(got, want) {
		s.Fatalf(`Snapshot("b") tickets %q, want %q`, got, want)
	}

	sn = s.snap()
	if got, want := limitsOf(sn), []string{"a 2/2+1", "b 1/1+1", "c 0/1+0"}; !slices.Equal(got, want) {
		s.Fatalf("Snapshot() limits (held/slots+waiting) %q, want %q", got, want)
	}
	if got, want := ids(sn), []string{"A1", "A2", "A3", "B1", "B2"}; !slices.Equal(got, want) {
		s.Fatalf("Snapshot() tickets %q, want %q", got, want)
	}
	for _, tk := range sn.Tickets {
		if tk.Expired() {
			s.Errorf("Snapshot: %s expired (remaining %v) right after Enqueue", s.who(tk.ID), tk.Remaining)
		}
	}

	// After a promotion the held ticket is listed first.
	s.release(a1, true)
	sn = s.snap("a")
	if got, want := ids(sn), []string{"A2", "A3"}; !slices.Equal(got, want) {
		s.Fatalf(`Snapshot("a") after releasing A1: tickets %q, want %q`, got, want)
	}
	s.wantSlots([]int{0, 1}, a2, a3)
}

// Get returns the whole ticket.
func testGet(s *suite) {
	ra := s.req("A", "g", 2)
	a := s.enqReq(ra)
	got := s.wantHeld(a, 0)
	if got.Position != 0 || got.TTL != s.h.TTL {
		s.Errorf("Get A: position %d, TTL %v; want 0, %v", got.Position, got.TTL, s.h.TTL)
	}
	if got.Remaining <= 0 || got.Remaining > s.h.TTL+time.Second {
		s.Errorf("Get A: remaining %v, want in (0, %v]", got.Remaining, s.h.TTL)
	}
	if !reflect.DeepEqual(got.Holder, ra.Holder) {
		s.Errorf("Get A: holder %+v, want %+v", got.Holder, ra.Holder)
	}
	if got.Created.IsZero() || got.Admitted.IsZero() {
		s.Errorf("Get A (held): created %v, admitted %v; want both set", got.Created, got.Admitted)
	}
	b := s.enq("B", "g", 2)
	s.wantHeld(b, 1)
	c := s.enq("C", "g", 2)
	w := s.wantWaiting(c, 1)
	if w.Slot != -1 || w.Created.IsZero() {
		s.Errorf("Get C (waiting): slot %d, created %v; want slot -1, created set", w.Slot, w.Created)
	}
	if _, err := s.st.Get(s.ctx, s.id("ghost")); !errors.Is(err, store.ErrNotFound) {
		s.Errorf("Get of an id never enqueued: %v, want ErrNotFound", err)
	}
}

// drain empties a bell of rings already delivered.
func drain(b store.Bell) {
	for {
		select {
		case <-b.C():
		default:
			return
		}
	}
}

// A Bell obtained before Enqueue rings when the ticket is promoted or removed.
func testWatch(s *suite) {
	const ringWait = 5 * time.Second
	watch := func(id string) store.Bell {
		s.Helper()
		bell, err := s.st.Watch(s.ctx, id)
		if err != nil {
			s.Fatalf("Watch %s: %v", s.who(id), err)
		}
		s.Cleanup(func() { _ = bell.Close() })
		return bell
	}
	ring := func(bell store.Bell, what string) {
		s.Helper()
		select {
		case <-bell.C():
		case <-time.After(ringWait):
			s.Fatalf("the bell did not ring within %v after %s", ringWait, what)
		}
	}
	settle := func(bell store.Bell) {
		time.Sleep(50 * time.Millisecond) // let the rings of the Enqueue arrive, then forget them
		drain(bell)
	}

	a := s.enq("A", "w", 1)
	rb := s.req("B", "w", 1)
	bellB := watch(rb.ID)
	b := s.enqReq(rb)
	s.wantWaiting(b, 1)
	settle(bellB)
	s.release(a, true)
	ring(bellB, "B was promoted by A's release")
	s.wantHeld(b, 0)

	rc := s.req("C", "w", 1)
	bellC := watch(rc.ID)
	c := s.enqReq(rc)
	s.wantWaiting(c, 1)
	settle(bellC)
	s.releaseWhy(c, store.ForceReleased, true)
	ring(bellC, "C was force-released")
	s.wantGone(c)

	if err := bellB.Close(); err != nil {
		s.Errorf("Bell.Close: %v", err)
	}
}

// Malformed requests wrap ErrInvalid and change nothing.
func testInvalid(s *suite) {
	wantInvalid := func(what string, err error) {
		s.Helper()
		if !errors.Is(err, store.ErrInvalid) {
			s.Errorf("%s: %v, want an error wrapping ErrInvalid", what, err)
		}
	}
	badNames := []string{"", "-x", ".x", "_x", ":x", "a b", "a/b", "x\n", "ä", strings.Repeat("n", 129)}
	for _, name := range badNames {
		_, err := s.st.Enqueue(s.ctx, s.req("bad", name, 1))
		wantInvalid(fmt.Sprintf("Enqueue into limit %q", name), err)
		_, err = s.st.SetLimit(s.ctx, name, 1)
		wantInvalid(fmt.Sprintf("SetLimit(%q, 1)", name), err)
	}
	for _, n := range []int{-1, store.MaxSlots + 1, -1 << 30} {
		_, err := s.st.Enqueue(s.ctx, s.req("bad", "n", n))
		wantInvalid(fmt.Sprintf("Enqueue with %d slots", n), err)
		_, err = s.st.SetLimit(s.ctx, "n", n)
		wantInvalid(fmt.Sprintf("SetLimit(n, %d)", n), err)
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		r := s.req("bad", "n", 1)
		r.TTL = ttl
		_, err := s.st.Enqueue(s.ctx, r)
		wantInvalid(fmt.Sprintf("Enqueue with TTL %v", ttl), err)
	}
	// Ids name files and keys: nothing that walks a path or is unbounded.
	for _, id := range []string{"", "../x", "a/b", "a.b", "x y", strings.Repeat("i", 65)} {
		r := s.req("bad", "n", 1)
		r.ID = id
		_, err := s.st.Enqueue(s.ctx, r)
		wantInvalid(fmt.Sprintf("Enqueue with id %q", id), err)
	}
	if s.Failed() {
		s.FailNow()
	}
	sn := s.snap()
	if len(sn.Limits) != 0 || len(sn.Tickets) != 0 {
		s.Fatalf("invalid requests left %d limits and %d tickets, want none", len(sn.Limits), len(sn.Tickets))
	}

	// The bounds themselves are valid.
	long := strings.Repeat("n", 128)
	a := s.enq("A", long, store.MaxSlots)
	s.wantHeld(a, 0)
	s.checkLimit(long, store.MaxSlots, 1, 0)
	s.setLimit("Z9._:-z", 0)

	// An id refused with a bad ttl was not created, so it is not tombstoned.
	r := s.req("B", "n", 1)
	r.TTL = 0
	if _, err := s.st.Enqueue(s.ctx, r); !errors.Is(err, store.ErrInvalid) {
		s.Fatalf("Enqueue with TTL 0: %v, want ErrInvalid", err)
	}
	r.TTL = s.h.TTL
	s.wantHeld(s.enqReq(r), 0)

	for _, ttl := range []time.Duration{0, -time.Second} {
		_, err := s.st.Renew(s.ctx, a, ttl)
		wantInvalid(fmt.Sprintf("Renew with TTL %v", ttl), err)
	}
	s.wantHeld(a, 0)
	s.renew(a)
}

// A restart loses nothing: tickets, fences, limits and tombstones survive.
func testReopen(s *suite) {
	if s.b.Reopen == nil {
		s.Skip("backend has no Reopen")
	}
	a := s.enq("A", "a", 2)
	b := s.enq("B", "a", 2)
	c := s.enq("C", "a", 2)
	x := s.enq("X", "x", 1)
	s.release(x, true)
	s.setLimit("empty", 3)
	before := s.snap()

	s.st = s.b.Reopen()
	if s.st == nil {
		s.Fatal("Reopen returned nil")
	}
	after := s.snap()
	if !reflect.DeepEqual(limitKeys(before), limitKeys(after)) {
		s.Fatalf("limits before reopen %v, after %v", limitKeys(before), limitKeys(after))
	}
	if !reflect.DeepEqual(ticketKeys(before), ticketKeys(after)) {
		s.Fatalf("tickets before reopen %v, after %v", ticketKeys(before), ticketKeys(after))
	}
	for i, tk := range after.Tickets {
		if !reflect.DeepEqual(tk.Holder, before.Tickets[i].Holder) {
			s.Fatalf("%s: holder %+v after reopen, %+v before", s.who(tk.ID), tk.Holder, before.Tickets[i].Holder)
		}
	}

	s.advance(s.part())
	a = s.renew(a)
	b = s.renew(b)
	c = s.renew(c)
	if c.State != store.Waiting {
		s.Fatalf("Renew C after reopen: %s, want waiting", c.State)
	}
	_, err := s.st.Enqueue(s.ctx, store.EnqueueRequest{ID: x.ID, Limit: "x", Slots: 1, TTL: s.h.TTL, Holder: holder("X")})
	if !errors.Is(err, store.ErrRemoved) {
		s.Fatalf("Enqueue X after reopen, X released before: %v, want ErrRemoved", err)
	}
	d := s.enq("D", "a", 2)
	if d.Fence <= c.Fence || d.Fence <= x.Fence {
		s.Fatalf("D's fence %d after reopen is not above the fences before it (C %d, X %d)", d.Fence, c.Fence, x.Fence)
	}
	s.wantWaiting(d, 2)
	s.release(a, true)
	s.wantHeld(c, a.Slot)
	s.wantHeld(b, b.Slot)
	s.wantWaiting(d, 1)
	s.checkLimit("empty", 3, 0, 0)
}

func limitKeys(sn store.Snapshot) []string {
	var out []string
	for _, l := range sn.Limits {
		out = append(out, fmt.Sprintf("%s slots=%d held=%d waiting=%d", l.Name, l.Slots, l.Held, l.Waiting))
	}
	sort.Strings(out)
	return out
}

func ticketKeys(sn store.Snapshot) []string {
	var out []string
	for _, tk := range sn.Tickets {
		out = append(out, fmt.Sprintf("%s %s %s fence=%d slot=%d pos=%d ttl=%v limits=%q weight=%d in=%v", tk.ID, tk.Limit, tk.State, tk.Fence, tk.Slot, tk.Position, tk.TTL, tk.Names(), tk.Weighs(), tk.In(tk.Limit)))
	}
	return out
}

// Many clients on one store: never more holders than slots, in the store or in fact.
func testConcurrent(s *suite) {
	const (
		workers = 8
		iters   = 20
		slots   = 3
		limit   = "conc"
	)
	s.setLimit(limit, slots)
	ids := make([][]string, workers)
	for w := range ids {
		for i := range iters {
			ids[w] = append(ids[w], s.id(fmt.Sprintf("W%d.%d", w, i)))
		}
	}
	var (
		holders  atomic.Int32 // clients that believe they hold a slot right now
		peak     atomic.Int32
		slotUsed [slots]atomic.Bool
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(60 * time.Second)
	fail := func(format string, args ...any) {
		s.Helper()
		stop.Store(true)
		s.Errorf(format, args...)
	}

	// one is a client's whole life with one ticket. It reports false to stop the worker.
	one := func(id, name string) bool {
		ctx := s.ctx
		bell, err := s.st.Watch(ctx, id)
		if err != nil {
			fail("%s: Watch: %v", name, err)
			return false
		}
		defer func() { _ = bell.Close() }()
		tk, err := s.st.Enqueue(ctx, store.EnqueueRequest{ID: id, Limit: limit, Slots: slots, TTL: s.h.TTL, Holder: holder(name)})
		if err != nil {
			fail("%s: Enqueue: %v", name, err)
			return false
		}
		held := false
		defer func() {
			// Whatever happened, let go, so the other clients are not blocked.
			if !held {
				_, _ = s.st.Cancel(context.WithoutCancel(ctx), tk)
			}
		}()
		renewed := time.Now()
		for tk.State != store.Held {
			if stop.Load() {
				return false
			}
			if time.Now().After(deadline) {
				fail("%s: not admitted before the deadline (position %d)", name, tk.Position)
				return false
			}
			select {
			case <-bell.C():
			case <-time.After(25 * time.Millisecond):
			case <-ctx.Done():
				fail("%s: %v", name, ctx.Err())
				return false
			}
			if time.Since(renewed) > s.h.TTL/4 { // a real clock (etcd) would expire us
				tk, err = s.st.Renew(ctx, tk, s.h.TTL)
				if err != nil {
					fail("%s: Renew while waiting: %v", name, err)
					return false
				}
				renewed = time.Now()
				continue
			}
			got, err := s.st.Get(ctx, id)
			if err != nil {
				fail("%s: Get while waiting: %v", name, err)
				return false
			}
			tk = got
		}
		held = true

		n := holders.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n > slots {
			fail("%s: %d clients hold slots of a %d-slot limit at once", name, n, slots)
		}
		if tk.Slot < 0 || tk.Slot >= slots {
			fail("%s: holds slot %d of a %d-slot limit", name, tk.Slot, slots)
		} else if !slotUsed[tk.Slot].CompareAndSwap(false, true) {
			fail("%s: holds slot %d, which another client holds", name, tk.Slot)
		}
		sn, err := s.st.Snapshot(ctx, limit)
		if err != nil {
			fail("%s: Snapshot: %v", name, err)
		} else {
			inStore := 0
			for _, t := range sn.Tickets {
				if t.Limit == limit && t.State == store.Held {
					inStore++
				}
			}
			l, _ := findLimit(sn, limit)
			if inStore > slots || l.Held > slots {
				fail("%s: snapshot shows %d held tickets (limit says %d) in a %d-slot limit", name, inStore, l.Held, slots)
			}
		}
		if tk.Slot >= 0 && tk.Slot < slots {
			slotUsed[tk.Slot].Store(false)
		}
		holders.Add(-1)
		ok, err := s.st.Release(ctx, tk, store.Released)
		if err != nil || !ok {
			fail("%s: Release = %v, %v; want true, nil", name, ok, err)
			return false
		}
		return !stop.Load()
	}

	for w := range workers {
		wg.Go(func() {
			for i, id := range ids[w] {
				if !one(id, fmt.Sprintf("W%d.%d (%s)", w, i, id)) {
					return
				}
			}
		})
	}
	wg.Wait()
	if s.Failed() {
		return
	}
	s.checkLimit(limit, slots, 0, 0)
	s.Logf("%d clients × %d tickets on a %d-slot limit: at most %d held at once", workers, iters, slots, peak.Load())
}

// --- reaping, death, child groups and the event log ---

// other is a second handle on the store, as a second reaper process has one;
// the store itself when the backend has no Skewed.
func (s *suite) other() store.Store {
	s.Helper()
	if s.b.Skewed == nil {
		return s.st
	}
	st := s.b.Skewed(0)
	if st == nil {
		s.Fatal("Backend.Skewed(0) returned nil")
	}
	return st
}

// reapOn runs Reap on st and checks the shape of its removals; who names the reaper in messages.
func (s *suite) reapOn(st store.Store, who string, dry bool, limits ...string) []store.Removal {
	s.Helper()
	op := fmt.Sprintf("%sReap(dryRun=%v, %q)", who, dry, limits)
	rm, err := st.Reap(s.ctx, store.ReapOptions{DryRun: dry, Limits: limits})
	if err != nil {
		s.Fatalf("%s: %v", op, err)
	}
	s.checkRemovals(op, rm)
	return rm
}

func (s *suite) reap(dry bool, limits ...string) []store.Removal {
	s.Helper()
	return s.reapOn(s.st, "", dry, limits...)
}

// checkRemovals checks what every removal must carry: the ticket, the
// reason, the evidence, and each ticket once.
func (s *suite) checkRemovals(op string, rm []store.Removal) {
	s.Helper()
	seen := map[string]bool{}
	for _, r := range rm {
		switch {
		case r.Ticket.ID == "" || r.Ticket.Limit == "":
			s.Fatalf("%s: a removal without a ticket id or limit: %+v", op, r)
		case seen[r.Ticket.ID]:
			s.Fatalf("%s: lists %s twice", op, s.who(r.Ticket.ID))
		case r.Reason != store.Reaped:
			s.Fatalf("%s: %s removed as %q, want %q", op, s.who(r.Ticket.ID), r.Reason, store.Reaped)
		case r.Evidence == "":
			s.Fatalf("%s: %s removed without evidence", op, s.who(r.Ticket.ID))
		}
		seen[r.Ticket.ID] = true
	}
}

// removed names the tickets of rm, sorted.
func (s *suite) removed(rm []store.Removal) []string {
	out := []string{}
	for _, r := range rm {
		out = append(out, s.who(r.Ticket.ID))
	}
	sort.Strings(out)
	return out
}

// wantRemoved checks that rm lists exactly tks, with their limits and fences.
func (s *suite) wantRemoved(op string, rm []store.Removal, tks ...store.Ticket) {
	s.Helper()
	want := []string{}
	for _, tk := range tks {
		want = append(want, s.who(tk.ID))
	}
	sort.Strings(want)
	if got := s.removed(rm); !slices.Equal(got, want) {
		s.Fatalf("%s removed %v, want %v", op, got, want)
	}
	for _, r := range rm {
		for _, tk := range tks {
			// A ticket of several limits is removed once, under any of them.
			if r.Ticket.ID == tk.ID && (!slices.Contains(tk.Names(), r.Ticket.Limit) || r.Ticket.Fence != tk.Fence) {
				s.Fatalf("%s: %s removed as of limit %q fence %d, want limit %q fence %d", op, s.who(tk.ID), r.Ticket.Limit, r.Ticket.Fence, tk.Names(), tk.Fence)
			}
		}
	}
}

// wantKept checks that tk is still stored, expired or not: no reap removed it.
func (s *suite) wantKept(tk store.Ticket, why string) {
	s.Helper()
	got, err := s.st.Get(s.ctx, tk.ID)
	if err != nil {
		s.Fatalf("Get %s: %v; want it still stored (%s)", s.who(tk.ID), err, why)
	}
	if got.Fence != tk.Fence {
		s.Fatalf("Get %s: fence %d, want %d", s.who(tk.ID), got.Fence, tk.Fence)
	}
}

// eventKinds are the kinds of event the contract names.
var eventKinds = []string{"admitted", string(store.Released), string(store.Cancelled), string(store.Reaped), string(store.ForceReleased), string(store.Lost)}

// events reads the newest n events of limit and checks what every read must
// satisfy: at most n (and MaxEvents), of that limit only, oldest first.
func (s *suite) events(limit string, n int) []store.Event {
	s.Helper()
	ev, err := s.st.Events(s.ctx, limit, n)
	if err != nil {
		s.Fatalf("Events(%q, %d): %v", limit, n, err)
	}
	if len(ev) > max(n, 0) || len(ev) > store.MaxEvents {
		s.Fatalf("Events(%q, %d): %d events, want at most %d (and at most MaxEvents %d)", limit, n, len(ev), n, store.MaxEvents)
	}
	for i, e := range ev {
		if limit != "" && e.Limit != limit {
			s.Fatalf("Events(%q, %d): event %d (%s of %s) is of limit %q", limit, n, i, e.Kind, s.who(e.Ticket), e.Limit)
		}
		if i > 0 && e.Seq <= ev[i-1].Seq {
			s.Fatalf("Events(%q, %d): event %d has seq %d after seq %d: want oldest first, seq increasing", limit, n, i, e.Seq, ev[i-1].Seq)
		}
	}
	return ev
}

// kindsOf returns the kinds of tk's events in its limit's log, oldest first.
func (s *suite) kindsOf(tk store.Ticket) []string {
	s.Helper()
	out := []string{}
	for _, e := range s.events(tk.Limit, store.MaxEvents) {
		if e.Ticket == tk.ID {
			out = append(out, e.Kind)
		}
	}
	return out
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// trio is a 1-slot limit whose holder T reaches its deadline while B and C
// wait on renewed leases.
type trio struct {
	limit   string
	t, b, c store.Ticket
}

// trios sets up one trio per limit and moves the clock to the T's deadline
// exactly (Remaining 0: expired) with B and C 0.4·TTL from theirs.
func (s *suite) trios(limits ...string) []*trio {
	s.Helper()
	out := []*trio{}
	for _, l := range limits {
		tr := &trio{limit: l, t: s.enq("T@"+l, l, 1), b: s.enq("B@"+l, l, 1), c: s.enq("C@"+l, l, 1)}
		s.wantHeld(tr.t, 0)
		s.wantWaiting(tr.b, 1)
		s.wantWaiting(tr.c, 2)
		out = append(out, tr)
	}
	// On a real clock (etcd) making many trios takes a while, more so under
	// the race detector: every lease starts again from here, so that the
	// steps below time them all alike, however long the making took.
	for _, tr := range out {
		tr.t, tr.b, tr.c = s.renew(tr.t), s.renew(tr.b), s.renew(tr.c)
	}
	s.advance(s.part())
	for _, tr := range out {
		tr.b = s.renew(tr.b)
		tr.c = s.renew(tr.c)
	}
	s.advance(s.h.TTL - s.part())
	return out
}

// wantSucceeded checks a trio once T was removed: T is gone for good, B holds
// T's slot and was admitted once, C still waits, one ticket is held.
func (s *suite) wantSucceeded(tr *trio) store.Ticket {
	s.Helper()
	s.wantGone(tr.t)
	s.wantLost(tr.t)
	b := s.wantHeld(tr.b, tr.t.Slot)
	s.wantWaiting(tr.c, 1)
	s.checkLimit(tr.limit, 1, 1, 1)
	if k := s.kindsOf(tr.b); count(k, "admitted") != 1 {
		s.Fatalf("%s: events %v, want admitted exactly once", s.who(tr.b.ID), k)
	}
	if k := s.kindsOf(tr.c); count(k, "admitted") != 0 {
		s.Fatalf("%s: events %v, want no admission: it waits behind B in a 1-slot limit", s.who(tr.c.ID), k)
	}
	return b
}

// A reaper's scan is a hint: the removal is decided on the state current in
// the step that removes, so a renewal that lands between the scan and the
// reap wins (docs/leases.md A1, scenario 1). The reaper's clock reads ahead
// of the renewer's, so that it sees T expired while T can still renew.
func testRenewAfterScan(s *suite) {
	if s.b.Skewed == nil {
		s.Skip("backend has no Skewed handle")
	}
	eps, skew := s.h.TTL/100, s.h.TTL/10
	reaper := s.b.Skewed(skew)
	if reaper == nil {
		s.Fatal("Backend.Skewed returned nil")
	}
	t := s.enq("T", "a1", 1)
	s.advance(s.h.TTL - eps) // T has ε left; by the reaper's clock it expired skew−ε ago
	if got := s.get(t); got.Expired() {
		s.Fatalf("T is expired (remaining %v) %v before its deadline", got.Remaining, eps)
	}
	s.wantRemoved("the reaper's dry run, its clock 0.1·TTL ahead, at T's deadline − ε", s.reapOn(reaper, "reaper: ", true, "a1"), t)
	t = s.renew(t) // lands between the reaper's scan and its reap
	if rm := s.reapOn(reaper, "reaper: ", false, "a1"); len(rm) != 0 {
		s.Fatalf("the reaper removed %v after T renewed to a deadline %v ahead even of the reaper's clock: its earlier scan decided", s.removed(rm), s.h.TTL-skew)
	}
	t = s.wantHeld(t, 0)
	b := s.enq("B", "a1", 1) // B acquires after the reaper's pass: it waits
	s.wantWaiting(b, 1)
	s.advance(s.part())
	b = s.renew(b)
	s.advance(s.h.TTL - s.part()) // T's renewed deadline passes
	s.wantRemoved("Reap at T's renewed deadline", s.reap(false, "a1"), t)
	s.wantHeld(b, 0)
	s.wantLost(t)
	if rm := s.reap(false); len(rm) != 0 {
		s.Fatalf("a second Reap removed %v, want nothing", s.removed(rm))
	}
	if rm := s.reapOn(reaper, "reaper: ", false); len(rm) != 0 {
		s.Fatalf("the reaper's Reap removed %v, want nothing", s.removed(rm))
	}
	if k := s.kindsOf(t); count(k, string(store.Reaped)) != 1 {
		s.Fatalf("T: events %v, want reaped exactly once", k)
	}
	s.checkLimit("a1", 1, 1, 0)
}

// Two reapers that both saw T expired free its slot once: only the step
// that removes T frees it (docs/leases.md A2, scenario 2).
func testTwoReapers(s *suite) {
	const rounds = 6
	limits := []string{"a2"}
	for i := range rounds {
		limits = append(limits, fmt.Sprintf("a2c%d", i))
	}
	trs := s.trios(limits...)
	r1, r2 := s.st, s.other()

	// In turn: both scan, then both reap; later reaps find nothing.
	tr := trs[0]
	s.wantRemoved("reaper 1's dry run", s.reapOn(r1, "reaper 1: ", true, tr.limit), tr.t)
	s.wantRemoved("reaper 2's dry run", s.reapOn(r2, "reaper 2: ", true, tr.limit), tr.t)
	s.wantRemoved("reaper 1's Reap", s.reapOn(r1, "reaper 1: ", false, tr.limit), tr.t)
	b := s.wantHeld(tr.b, 0)
	for i, st := range []store.Store{r2, s.st, r1, r2} {
		if rm := s.reapOn(st, "", false, tr.limit); len(rm) != 0 {
			s.Fatalf("Reap %d, after reaper 1 removed T and B was admitted, removed %v; want nothing", i+2, s.removed(rm))
		}
	}
	if got := s.wantSucceeded(tr); got.Slot != b.Slot || got.Fence != b.Fence {
		s.Fatalf("B changed: slot %d fence %d, was slot %d fence %d", got.Slot, got.Fence, b.Slot, b.Fence)
	}

	// At once, the second reaper starting up to 0.5 ms after the first.
	for i, tr := range trs[1:] {
		var (
			rms   [2][]store.Removal
			errs  [2]error
			wg    sync.WaitGroup
			start = make(chan struct{})
		)
		for k, st := range []store.Store{r1, r2} {
			wg.Go(func() {
				<-start
				if k == 1 {
					time.Sleep(time.Duration(i) * 100 * time.Microsecond)
				}
				rms[k], errs[k] = st.Reap(s.ctx, store.ReapOptions{Limits: []string{tr.limit}})
			})
		}
		close(start)
		wg.Wait()
		n := 0
		for k := range rms {
			op := fmt.Sprintf("reaper %d: Reap(%q) at once with reaper %d", k+1, tr.limit, 2-k)
			if errs[k] != nil {
				s.Fatalf("%s: %v", op, errs[k])
			}
			s.checkRemovals(op, rms[k])
			for _, r := range rms[k] {
				if r.Ticket.ID != tr.t.ID {
					s.Fatalf("%s removed %s, want only T", op, s.who(r.Ticket.ID))
				}
				n++
			}
		}
		if n != 1 {
			s.Fatalf("two reapers at once on %q removed T %d times (reaper 1 %v, reaper 2 %v), want once", tr.limit, n, s.removed(rms[0]), s.removed(rms[1]))
		}
		s.wantSucceeded(tr)
	}
	if rm := s.reap(false); len(rm) != 0 {
		s.Fatalf("a last Reap removed %v, want nothing", s.removed(rm))
	}
}

// T's deadline passes as its child exits: its release and a reap race, in
// either order or at once, and T is removed once (docs/leases.md A3, scenario 3).
func testReleaseRacingReap(s *suite) {
	const rounds = 8
	limits := []string{"a3a", "a3b"}
	for i := range rounds {
		limits = append(limits, fmt.Sprintf("a3c%d", i))
	}
	trs := s.trios(limits...)

	// Release, then Reap.
	tr := trs[0]
	s.release(tr.t, true)
	if rm := s.reap(false, tr.limit); len(rm) != 0 {
		s.Fatalf("Reap after T was released removed %v, want nothing", s.removed(rm))
	}
	s.wantSucceeded(tr)

	// Reap, then Release.
	tr = trs[1]
	s.wantRemoved("Reap at T's deadline", s.reap(false, tr.limit), tr.t)
	s.release(tr.t, false)
	s.wantSucceeded(tr)

	// At once: the release first in even rounds, the reap in odd ones, the
	// other starting 0, 0.25, 0.5, 0.75 ms later.
	reaper := s.other()
	for i, tr := range trs[2:] {
		var (
			released         bool
			rm               []store.Removal
			relErr, reapErr  error
			wg               sync.WaitGroup
			start            = make(chan struct{})
			delay            = time.Duration(i/2) * 250 * time.Microsecond
			release, reapNow = func() { released, relErr = s.st.Release(s.ctx, tr.t, store.Released) },
				func() { rm, reapErr = reaper.Reap(s.ctx, store.ReapOptions{Limits: []string{tr.limit}}) }
		)
		first, second := release, reapNow
		if i%2 == 1 {
			first, second = reapNow, release
		}
		wg.Go(func() { <-start; first() })
		wg.Go(func() { <-start; time.Sleep(delay); second() })
		close(start)
		wg.Wait()
		if relErr != nil || reapErr != nil {
			s.Fatalf("%q: Release and Reap at once: Release err %v, Reap err %v", tr.limit, relErr, reapErr)
		}
		op := fmt.Sprintf("Reap(%q) at once with T's Release", tr.limit)
		s.checkRemovals(op, rm)
		n := 0
		if released {
			n++
		}
		for _, r := range rm {
			if r.Ticket.ID != tr.t.ID {
				s.Fatalf("%s removed %s, want at most T", op, s.who(r.Ticket.ID))
			}
			n++
		}
		if n != 1 {
			s.Fatalf("%q: Release and Reap at once removed T %d times (Release = %v, Reap removed %v), want once", tr.limit, n, released, s.removed(rm))
		}
		s.wantSucceeded(tr)
	}
}

// A holder that releases after its ticket was reaped frees nothing: its slot
// is already B's (docs/leases.md A4, scenario 4). With store.Lost the
// release is logged.
func testReleaseAfterReap(s *suite) {
	tr := s.trios("a4")[0]
	s.wantRemoved("Reap at T's deadline", s.reap(false, tr.limit), tr.t)
	b := s.wantSucceeded(tr)
	s.release(tr.t, false)
	if got := s.wantSucceeded(tr); got.Slot != b.Slot || got.Fence != b.Fence {
		s.Fatalf("B changed: slot %d fence %d, was slot %d fence %d", got.Slot, got.Fence, b.Slot, b.Fence)
	}
	if k := s.kindsOf(tr.t); count(k, string(store.Released)) != 0 || count(k, string(store.Reaped)) != 1 {
		s.Fatalf("T: events %v after its holder released it late, want reaped once and never released", k)
	}
	s.releaseWhy(tr.t, store.Lost, false)
	s.wantSucceeded(tr)
	if k := s.kindsOf(tr.t); count(k, string(store.Lost)) != 1 || count(k, string(store.Released)) != 0 {
		s.Fatalf("T: events %v after its holder released it as lost, want one %q event and no %q", k, store.Lost, store.Released)
	}
}

// A renewal delayed past the ticket's release is refused and re-creates
// nothing (docs/leases.md A7, scenario 12).
func testLateRenewAfterRelease(s *suite) {
	a := s.enq("A", "l", 1)
	b := s.enq("B", "l", 1)
	s.advance(s.part())
	late := s.renew(a) // the ticket as a delayed renewal carries it
	b = s.renew(b)
	s.release(a, true)
	b = s.wantHeld(b, 0)
	s.wantLost(late)
	s.wantLost(a)
	s.wantGone(a)
	if got := s.wantHeld(b, 0); got.Fence != b.Fence {
		s.Fatalf("B's fence changed from %d to %d", b.Fence, got.Fence)
	}
	s.checkLimit("l", 1, 1, 0)
	c := s.enq("C", "l", 1)
	s.wantWaiting(c, 1)
	s.wantLost(late)
	s.checkLimit("l", 1, 1, 1)
}

// A renewal delayed past the ticket's reap is refused and re-creates nothing;
// the next holder keeps its fence and slot (docs/leases.md A7, scenario 13).
func testLateRenewAfterReap(s *suite) {
	a := s.enq("A", "l", 1)
	b := s.enq("B", "l", 1)
	s.advance(s.part())
	b = s.renew(b)
	s.advance(s.part()) // A expired; B renewed 0.6 TTL ago
	s.wantRemoved("Reap", s.reap(false, "l"), a)
	b = s.wantHeld(b, 0)
	for range 2 {
		s.wantLost(a)
		s.wantGone(a)
		if got := s.wantHeld(b, 0); got.Fence != b.Fence {
			s.Fatalf("B's fence changed from %d to %d", b.Fence, got.Fence)
		}
		s.checkLimit("l", 1, 1, 0)
	}
	if rm := s.reap(false); len(rm) != 0 {
		s.Fatalf("Reap after A's late renewal removed %v, want nothing", s.removed(rm))
	}
}

// Reap removes the expired tickets of the limits it names, of every limit
// when it names none; a limit that does not exist is an error, and the
// Reap then removes nothing.
func testReapNamedLimits(s *suite) {
	type pair struct{ h, w store.Ticket }
	ls := []string{"ra", "rb", "rc"}
	p := map[string]*pair{}
	for _, l := range ls {
		p[l] = &pair{h: s.enq("H@"+l, l, 1), w: s.enq("W@"+l, l, 1)}
	}
	s.advance(s.part())
	for _, l := range ls {
		p[l].w = s.renew(p[l].w)
	}
	s.advance(s.part()) // every H expired, every W renewed 0.6 TTL ago

	s.wantRemoved(`Reap("ra")`, s.reap(false, "ra"), p["ra"].h)
	s.wantHeld(p["ra"].w, 0)
	for _, l := range []string{"rb", "rc"} {
		s.wantKept(p[l].h, `Reap("ra") does not touch limit `+l)
		s.wantWaiting(p[l].w, 1)
	}
	for _, bad := range [][]string{{"missing"}, {"rb", "missing"}, {"missing", "rb"}} {
		for _, dry := range []bool{true, false} {
			rm, err := s.st.Reap(s.ctx, store.ReapOptions{DryRun: dry, Limits: bad})
			if !errors.Is(err, store.ErrLimitNotFound) {
				s.Fatalf("Reap(dryRun=%v, %q): removed %v, err %v; want ErrLimitNotFound", dry, bad, s.removed(rm), err)
			}
		}
	}
	s.wantKept(p["rb"].h, "a Reap that failed removes nothing")
	s.wantWaiting(p["rb"].w, 1)
	s.wantRemoved(`Reap("rb", "rc")`, s.reap(false, "rb", "rc"), p["rb"].h, p["rc"].h)
	s.wantHeld(p["rb"].w, 0)
	s.wantHeld(p["rc"].w, 0)

	s.advance(s.pastTTL())
	x := s.enq("X", "rx", 1)
	s.wantRemoved("Reap() of every limit", s.reap(false), p["ra"].w, p["rb"].w, p["rc"].w)
	s.wantHeld(x, 0)
	for _, l := range ls {
		s.checkLimit(l, 1, 0, 0)
	}
	if rm := s.reap(false); len(rm) != 0 {
		s.Fatalf("a second Reap() removed %v, want nothing", s.removed(rm))
	}
}

// A dry run removes nothing, promotes nobody, and lists what a Reap then removes.
func testReapDryRun(s *suite) {
	h1 := s.enq("H1", "da", 1)
	w1 := s.enq("W1", "da", 1)
	w2 := s.enq("W2", "da", 1)
	h2 := s.enq("H2", "db", 2)
	h3 := s.enq("H3", "db", 2)
	s.advance(s.part())
	w2 = s.renew(w2)
	h3 = s.renew(h3)
	s.advance(s.part()) // H1, W1, H2 expired; W2, H3 renewed 0.6 TTL ago
	before := ticketKeys(s.snap())
	for range 2 {
		s.wantRemoved("Reap(dryRun)", s.reap(true), h1, w1, h2)
		s.wantRemoved(`Reap(dryRun, "da")`, s.reap(true, "da"), h1, w1)
		if after := ticketKeys(s.snap()); !slices.Equal(before, after) {
			s.Fatalf("a dry run changed the store: tickets before %v, after %v", before, after)
		}
	}
	s.wantRemoved("Reap after the dry runs", s.reap(false), h1, w1, h2)
	s.wantHeld(w2, 0)
	s.wantHeld(h3, -1)
	s.checkLimit("da", 1, 1, 0)
	s.checkLimit("db", 2, 1, 0)
	if rm := s.reap(true); len(rm) != 0 {
		s.Fatalf("a dry run after the Reap lists %v, want nothing", s.removed(rm))
	}
}

// A Reap frees the slots of the expired holders, says why, and admits the
// next waiters in FIFO order.
func testReapFrees(s *suite) {
	a := s.enq("A", "rf", 2)
	b := s.enq("B", "rf", 2)
	c := s.enq("C", "rf", 2)
	d := s.enq("D", "rf", 2)
	e := s.enq("E", "rf", 2)
	s.advance(s.part())
	c, d, e = s.renew(c), s.renew(d), s.renew(e)
	s.advance(s.part()) // A, B expired
	rm := s.reap(false, "rf")
	s.wantRemoved(`Reap("rf")`, rm, a, b)
	for _, r := range rm {
		if !strings.Contains(strings.ToLower(r.Evidence), "expired") {
			s.Fatalf("Reap: %s removed with evidence %q, want it to say it expired", s.who(r.Ticket.ID), r.Evidence)
		}
		if r.Ticket.State != store.Held {
			s.Fatalf("Reap: %s removed as %s, but it held a slot", s.who(r.Ticket.ID), r.Ticket.State)
		}
	}
	s.wantSlots([]int{0, 1}, c, d)
	s.wantWaiting(e, 1)
	s.checkLimit("rf", 2, 2, 1)
	s.wantLost(a)
	s.wantLost(b)
}

// A holder the judge proves dead is reaped at once, long before its TTL,
// with the judge's evidence; its slot goes to the next waiter (docs/leases.md rule 9).
func testDeadHolderReaped(s *suite) {
	a := s.enq("A", "dd", 1)
	b := s.enq("B", "dd", 1)
	x := s.enq("X", "dx", 1)
	s.advance(s.h.TTL / 10)
	s.kill(a)
	for _, dry := range []bool{true, false} {
		s.judgeActed()
		rm := s.reap(dry)
		s.wantRemoved(fmt.Sprintf("Reap(dryRun=%v) with A's holder dead", dry), rm, a)
		if rm[0].Evidence != DeadEvidence {
			s.Fatalf("Reap(dryRun=%v): A removed with evidence %q, want the judge's %q", dry, rm[0].Evidence, DeadEvidence)
		}
		acted := s.judgeActed()
		if dry && len(acted) > 0 {
			s.Fatalf("Reap(dryRun=true) let the judge act (stop the work of) %v: a dry run only asks", acted)
		}
		if !dry && !slices.Contains(acted, a.ID) {
			s.Fatalf("Reap removed A without letting the judge act on it (the judge acted on %v)", acted)
		}
	}
	s.wantGone(a)
	s.wantLost(a)
	s.wantHeld(b, 0)
	s.wantHeld(x, 0)
	if rm := s.reap(false); len(rm) != 0 {
		s.Fatalf("a second Reap removed %v, want nothing", s.removed(rm))
	}
}

// An admission into a full limit with waiters sweeps a holder proven dead at
// once and admits the next waiter.
func testDeadHolderSwept(s *suite) {
	a := s.enq("A", "ds", 1)
	b := s.enq("B", "ds", 1)
	s.kill(a)
	c := s.enq("C", "ds", 1)
	if c.State != store.Waiting || c.Position != 1 {
		s.Fatalf("C: %s at position %d, want waiting at position 1 behind B, who takes dead A's slot", c.State, c.Position)
	}
	s.wantGone(a)
	s.wantHeld(b, 0)
	s.wantWaiting(c, 1)
	var ev []string
	for _, e := range s.events("ds", store.MaxEvents) {
		if e.Ticket == a.ID && e.Kind == string(store.Reaped) {
			ev = append(ev, e.Evidence)
		}
	}
	if len(ev) != 1 || ev[0] != DeadEvidence {
		s.Fatalf("A's reaped events have evidence %q, want one with the judge's %q", ev, DeadEvidence)
	}
}

// A holder the judge does not declare dead stays until its TTL, judge or not.
func testLiveHolderKept(s *suite) {
	eps := s.h.TTL / 100
	a := s.enq("A", "dl", 1)
	b := s.enq("B", "dl", 1)
	s.advance(s.part())
	b = s.renew(b)
	s.advance(s.h.TTL - s.part() - eps) // A has ε left
	for _, dry := range []bool{true, false} {
		if rm := s.reap(dry); len(rm) != 0 {
			s.Fatalf("Reap(dryRun=%v) removed %v before their TTL; the judge declares nobody dead", dry, s.removed(rm))
		}
	}
	c := s.enq("C", "dl", 1)
	s.wantHeld(a, 0)
	s.wantWaiting(b, 1)
	s.wantWaiting(c, 2)
	s.advance(eps)
	rm := s.reap(false)
	s.wantRemoved("Reap at A's deadline", rm, a)
	if ev := rm[0].Evidence; ev == DeadEvidence || !strings.Contains(strings.ToLower(ev), "expired") {
		s.Fatalf("Reap: A removed with evidence %q, want it to say it expired", ev)
	}
	s.wantHeld(b, 0)
	s.wantWaiting(c, 1)
}

// SetChild records the child's process group on the live ticket and nothing
// else changes: not the lease, the state, the slot or the fence. A ticket
// that is gone, or another fence, is lost.
func testSetChild(s *suite) {
	a := s.enq("A", "sc", 1)
	b := s.enq("B", "sc", 1)
	s.advance(s.part())
	b = s.renew(b)
	before := s.wantHeld(a, 0)
	const pgid, start = 4321, 987654321
	want := before.Holder
	want.Pgid, want.PgidStart = pgid, start
	check := func(op string, tk store.Ticket) {
		s.Helper()
		if !reflect.DeepEqual(tk.Holder, want) {
			s.Fatalf("%s: holder %+v, want %+v", op, tk.Holder, want)
		}
		if tk.ID != a.ID || tk.Fence != a.Fence || tk.State != store.Held || tk.Slot != before.Slot {
			s.Fatalf("%s: %q %s slot %d fence %d, want %s held in slot %d, fence %d", op, tk.ID, tk.State, tk.Slot, tk.Fence, s.who(a.ID), before.Slot, a.Fence)
		}
		if tk.Remaining > before.Remaining {
			s.Fatalf("%s: remaining %v, more than the %v before SetChild: SetChild extended the lease", op, tk.Remaining, before.Remaining)
		}
	}
	got, err := s.st.SetChild(s.ctx, a, pgid, start)
	if err != nil {
		s.Fatalf("SetChild A: %v", err)
	}
	check("SetChild A", got)
	check("Get A", s.wantHeld(a, 0))
	found := false
	for _, tk := range s.snap("sc").Tickets {
		if tk.ID == a.ID {
			check("Snapshot", tk)
			found = true
		}
	}
	if !found {
		s.Fatal("Snapshot: A missing")
	}
	s.wantWaiting(b, 1)

	stale := a
	stale.Fence += 1000
	if got, err := s.st.SetChild(s.ctx, stale, 1, 1); !errors.Is(err, store.ErrLost) {
		s.Fatalf("SetChild A with another fence: %+v, %v; want ErrLost", got.Holder, err)
	}
	check("Get A after a SetChild with another fence", s.wantHeld(a, 0))

	s.advance(s.part()) // 1.2 TTL after A's Enqueue
	s.wantLost(a)
	s.wantNotLive(a)
	c := s.enq("C", "sc", 1) // sweeps A
	s.wantHeld(b, 0)
	s.wantWaiting(c, 1)
	if got, err := s.st.SetChild(s.ctx, a, pgid, start); !errors.Is(err, store.ErrLost) {
		s.Fatalf("SetChild A after it expired and was swept: %+v, %v; want ErrLost", got.Holder, err)
	}
	s.wantGone(a)
	s.release(b, true)
	if got, err := s.st.SetChild(s.ctx, b, pgid, start); !errors.Is(err, store.ErrLost) {
		s.Fatalf("SetChild B after its release: %+v, %v; want ErrLost", got.Holder, err)
	}
	s.wantGone(b)
	s.wantHeld(c, 0)
}

// The event log records each admission and removal, with the reason; Events
// returns the newest n, oldest first, of one limit or of all.
func testEvents(s *suite) {
	a := s.enq("A", "e1", 1)
	b := s.enq("B", "e1", 1)
	x := s.enq("X", "e2", 1)
	s.release(a, true) // released A, admitted B
	c := s.enq("C", "e1", 1)
	s.cancel(c, true)
	d := s.enq("D", "e1", 1)
	s.releaseWhy(d, store.ForceReleased, true)
	s.releaseWhy(x, store.Lost, true)
	s.advance(s.pastTTL())
	s.wantRemoved(`Reap("e1")`, s.reap(false, "e1"), b)

	type ev struct {
		kind string
		tk   store.Ticket
	}
	check := func(limit string, want []ev) []store.Event {
		s.Helper()
		got := s.events(limit, 1000)
		var known []store.Event
		for _, e := range got {
			if slices.Contains(eventKinds, e.Kind) {
				known = append(known, e)
			}
		}
		show := func() string {
			var out []string
			for _, e := range known {
				out = append(out, e.Kind+" "+s.who(e.Ticket))
			}
			return strings.Join(out, ", ")
		}
		if len(known) != len(want) {
			s.Fatalf("Events(%q): %s; want %d events", limit, show(), len(want))
		}
		for i, w := range want {
			e := known[i]
			if e.Kind != w.kind || e.Ticket != w.tk.ID || e.Limit != w.tk.Limit || e.Fence != w.tk.Fence {
				s.Fatalf("Events(%q) event %d: %s of %s in %q fence %d, want %s of %s in %q fence %d (all: %s)",
					limit, i, e.Kind, s.who(e.Ticket), e.Limit, e.Fence, w.kind, s.who(w.tk.ID), w.tk.Limit, w.tk.Fence, show())
			}
			if e.Time.IsZero() {
				s.Errorf("Events(%q) event %d (%s of %s): no time", limit, i, e.Kind, s.who(e.Ticket))
			}
			if e.Kind == "admitted" && e.Slot != 0 {
				s.Errorf("Events(%q) event %d: %s admitted into slot %d, want 0", limit, i, s.who(e.Ticket), e.Slot)
			}
			if e.Kind == string(store.Reaped) && e.Evidence == "" {
				s.Errorf("Events(%q) event %d: %s reaped without evidence", limit, i, s.who(e.Ticket))
			}
		}
		return got
	}
	e1 := check("e1", []ev{{"admitted", a}, {"released", a}, {"admitted", b}, {"cancelled", c}, {"force-released", d}, {"reaped", b}})
	check("e2", []ev{{"admitted", x}, {"lost", x}})
	all := check("", []ev{{"admitted", a}, {"admitted", x}, {"released", a}, {"admitted", b}, {"cancelled", c},
		{"force-released", d}, {"lost", x}, {"reaped", b}})

	seqs := func(evs []store.Event) []uint64 {
		var out []uint64
		for _, e := range evs {
			out = append(out, e.Seq)
		}
		return out
	}
	for _, n := range []int{1, 2, 3} {
		for _, l := range []struct {
			name string
			full []store.Event
		}{{"e1", e1}, {"", all}} {
			got, want := seqs(s.events(l.name, n)), seqs(l.full[len(l.full)-n:])
			if !slices.Equal(got, want) {
				s.Fatalf("Events(%q, %d): seqs %v, want the newest %d, oldest first: %v", l.name, n, got, n, want)
			}
		}
	}
	if got := s.events("e1", 0); len(got) != 0 {
		s.Fatalf("Events(e1, 0): %d events, want none", len(got))
	}
	s.events("", store.MaxEvents+1) // never more than MaxEvents
}

// wantEvent checks that the newest events of limit log kind for tk.
func (s *suite) wantEvent(limit string, tk store.Ticket, kind string) {
	s.Helper()
	evs, err := s.st.Events(s.ctx, limit, 100)
	if err != nil {
		s.Fatalf("Events(%q): %v", limit, err)
	}
	var kinds []string
	for _, e := range evs {
		if e.Ticket == tk.ID {
			if e.Kind == kind {
				return
			}
			kinds = append(kinds, e.Kind)
		}
	}
	s.Fatalf("Events(%q): no %q event of %s (it has %q)", limit, kind, s.who(tk.ID), kinds)
}

// Cancel removes a waiting ticket, closes its place in the queue, frees
// nothing held, and a second Cancel (or one with a stale fence) is a no-op.
func testCancelWaiting(s *suite) {
	a := s.enq("A", "q", 1)
	b := s.enq("B", "q", 1)
	c := s.enq("C", "q", 1)
	s.cancel(store.Ticket{ID: b.ID, Limit: b.Limit, Fence: b.Fence + 1000}, false) // another fence
	s.wantWaiting(b, 1)
	s.cancel(b, true)
	s.wantGone(b)
	s.wantHeld(a, 0)
	s.wantWaiting(c, 1)
	s.checkLimit("q", 1, 1, 1)
	s.cancel(b, false) // idempotent
	s.wantHeld(a, 0)
	s.wantWaiting(c, 1)
	s.checkLimit("q", 1, 1, 1)
	s.wantEvent("q", b, string(store.Cancelled))
	if _, err := s.st.Enqueue(s.ctx, store.EnqueueRequest{ID: b.ID, Limit: "q", Slots: 1, TTL: s.h.TTL, Holder: holder("B")}); !errors.Is(err, store.ErrRemoved) {
		s.Fatalf("Enqueue %s after Cancel: %v, want ErrRemoved", s.who(b.ID), err)
	}
}

// A ticket promoted before its holder saw it (the holder still has its
// waiting copy) is removed as cancelled, since its job never ran: its slot
// is freed once and goes to the next waiter, and cancelling it again frees
// nothing more.
func testCancelPromoted(s *suite) {
	a := s.enq("A", "q", 1)
	b := s.enq("B", "q", 1) // the waiting copy its holder keeps
	c := s.enq("C", "q", 1)
	d := s.enq("D", "q", 1)
	s.release(a, true)
	s.wantHeld(b, 0)
	s.cancel(b, true)
	s.wantGone(b)
	s.wantHeld(c, 0)
	s.wantWaiting(d, 1)
	s.checkLimit("q", 1, 1, 1)
	s.cancel(b, false)
	s.wantHeld(c, 0)
	s.wantWaiting(d, 1)
	s.checkLimit("q", 1, 1, 1)
	s.wantEvent("q", b, string(store.Cancelled))
}

// Cancel of an id never enqueued (its create still in flight) writes
// nothing live and refuses the create when it lands.
func testCancelBeforeCreate(s *suite) {
	ghost := store.Ticket{ID: s.id("G"), Limit: "q"}
	s.cancel(ghost, false)
	s.wantNoLimit("q")
	if got, err := s.st.Enqueue(s.ctx, store.EnqueueRequest{ID: ghost.ID, Limit: "q", Slots: 1, TTL: s.h.TTL, Holder: holder("G")}); !errors.Is(err, store.ErrRemoved) {
		s.Fatalf("Enqueue %s after Cancel: ticket %+v, err %v; want ErrRemoved", s.who(ghost.ID), got, err)
	}
}

// Close is idempotent, and every operation after it fails with an error
// wrapping ErrClosed: never a panic, never a success.
func testClose(s *suite) {
	a := s.enq("A", "q", 1)
	bell, err := s.st.Watch(s.ctx, s.id("W"))
	if err != nil {
		s.Fatalf("Watch: %v", err)
	}
	if err := s.st.Close(); err != nil {
		s.Fatalf("Close: %v", err)
	}
	if err := s.st.Close(); err != nil {
		s.Fatalf("Close again: %v", err)
	}
	if err := bell.Close(); err != nil {
		s.Fatalf("Bell.Close after the store's Close: %v", err)
	}
	ops := []struct {
		name string
		fn   func() error
	}{
		{"Enqueue", func() error { _, err := s.st.Enqueue(s.ctx, s.req("B", "q", 1)); return err }},
		{"Get", func() error { _, err := s.st.Get(s.ctx, a.ID); return err }},
		{"Renew", func() error { _, err := s.st.Renew(s.ctx, a, s.h.TTL); return err }},
		{"Release", func() error { _, err := s.st.Release(s.ctx, a, store.Released); return err }},
		{"Cancel", func() error { _, err := s.st.Cancel(s.ctx, a); return err }},
		{"SetChild", func() error { _, err := s.st.SetChild(s.ctx, a, 1, 1); return err }},
		{"Reap", func() error { _, err := s.st.Reap(s.ctx, store.ReapOptions{}); return err }},
		{"ReapDryRun", func() error { _, err := s.st.Reap(s.ctx, store.ReapOptions{DryRun: true}); return err }},
		{"Events", func() error { _, err := s.st.Events(s.ctx, "", 10); return err }},
		{"Snapshot", func() error { _, err := s.st.Snapshot(s.ctx); return err }},
		{"SetLimit", func() error { _, err := s.st.SetLimit(s.ctx, "q", 2); return err }},
		{"RemoveLimit", func() error { return s.st.RemoveLimit(s.ctx, "q", true) }},
		{"Watch", func() error {
			b, err := s.st.Watch(s.ctx, s.id("W2"))
			if err == nil {
				b.Close()
			}
			return err
		}},
	}
	for _, op := range ops {
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					s.Fatalf("%s after Close panicked: %v", op.name, r)
				}
			}()
			err = op.fn()
		}()
		if !errors.Is(err, store.ErrClosed) {
			s.Fatalf("%s after Close: %v, want an error wrapping ErrClosed", op.name, err)
		}
	}
}
