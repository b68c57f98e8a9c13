package gate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// --- helpers ---

func newGate(t *testing.T, poll time.Duration) (*Gate, *boltstore.Store, *boltstore.FakeClock) {
	t.Helper()
	clock := boltstore.NewFakeClock(boltstore.Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()})
	s, err := boltstore.New(filepath.Join(t.TempDir(), "slots.db"), boltstore.Options{Clock: clock, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &Gate{Store: s, PollEvery: poll}, s, clock
}

func request(limit string, slots int) store.EnqueueRequest {
	return store.EnqueueRequest{ID: NewID(), Limit: limit, Slots: slots, TTL: time.Minute,
		Holder: store.Holder{Host: "h", Pid: os.Getpid(), Argv: []string{"true"}}}
}

func join(t *testing.T, g *Gate, req store.EnqueueRequest) *Entry {
	t.Helper()
	e, err := g.Join(context.Background(), req)
	if err != nil {
		t.Fatalf("Join(%s): %v", req.Limit, err)
	}
	return e
}

// bellPath is where the bbolt store keeps this user's bell of ticket id.
func bellPath(s *boltstore.Store, id string) string {
	return filepath.Join(s.Path()+".bells", strconv.Itoa(os.Geteuid()), id)
}

type waitResult struct {
	t   store.Ticket
	err error
	at  time.Time
}

// waitAsync runs e.Wait in a goroutine.
func waitAsync(e *Entry, ctx context.Context, timeout time.Duration) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		t, err := e.Wait(ctx, timeout, nil)
		ch <- waitResult{t, err, time.Now()}
	}()
	return ch
}

func await(t *testing.T, ch <-chan waitResult, within time.Duration) waitResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("Wait did not return within %v", within)
		return waitResult{}
	}
}

func notYet(t *testing.T, ch <-chan waitResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Wait returned early: %+v, %v", r.t, r.err)
	default:
	}
}

// silentStore hands out bells that never ring, as if every ring were lost.
type silentStore struct{ store.Store }

type silentBell struct{ c chan struct{} }

func (b silentBell) C() <-chan struct{} { return b.c }
func (silentBell) Close() error         { return nil }

func (silentStore) Watch(context.Context, string) (store.Bell, error) {
	return silentBell{make(chan struct{})}, nil
}

// lostAckStore commits every Enqueue and then reports a failure, as when the
// connection drops after the write.
type lostAckStore struct{ store.Store }

func (s lostAckStore) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	if _, err := s.Store.Enqueue(ctx, req); err != nil {
		return store.Ticket{}, err
	}
	return store.Ticket{}, fmt.Errorf("%w: connection reset after the write", store.ErrUnavailable)
}

// --- tests ---

func TestJoinWaitFreeLimitHeldAtOnce(t *testing.T) {
	g, _, _ := newGate(t, 0)
	e := join(t, g, request("free", 1))
	defer e.Leave(context.Background(), store.Released)
	if e.Ticket().State != store.Held {
		t.Fatalf("ticket on a free limit is %s, want held", e.Ticket().State)
	}
	for _, timeout := range []time.Duration{0, -1, 20 * time.Second} {
		start := time.Now()
		tk, err := e.Wait(context.Background(), timeout, nil)
		if err != nil || tk.State != store.Held {
			t.Errorf("Wait(%v) = %s, %v; want held", timeout, tk.State, err)
		}
		if el := time.Since(start); el > 10*time.Second { // half the longest timeout: not waited on
			t.Errorf("Wait(%v) on a held ticket took %v", timeout, el)
		}
	}
}

func TestWaitZeroOnFullLimitIsBusy(t *testing.T) {
	g, s, _ := newGate(t, 0)
	ctx := context.Background()
	h := join(t, g, request("full", 1))
	defer h.Leave(ctx, store.Released)
	w := join(t, g, request("full", 1))
	tk, err := w.Wait(ctx, 0, nil)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Wait(0) on a full limit: %v, want ErrBusy", err)
	}
	if tk.State != store.Waiting {
		t.Errorf("Wait(0) returned a %s ticket", tk.State)
	}
	if got, err := s.Get(ctx, w.Ticket().ID); err != nil || got.State != store.Waiting {
		t.Fatalf("after ErrBusy the ticket is %+v, %v; want still waiting", got, err)
	}
	if ok, err := w.Leave(ctx, store.Cancelled); !ok || err != nil {
		t.Errorf("Leave = %v, %v; want true", ok, err)
	}
	if _, err := s.Get(ctx, w.Ticket().ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after Leave: Get = %v, want ErrNotFound", err)
	}
	if ok, err := w.Leave(ctx, store.Cancelled); ok || err != nil {
		t.Errorf("second Leave = %v, %v; want false, nil", ok, err)
	}
}

func TestWaitTimeoutIsBusy(t *testing.T) {
	g, _, _ := newGate(t, 0)
	ctx := context.Background()
	h := join(t, g, request("busy", 1))
	defer h.Leave(ctx, store.Released)
	w := join(t, g, request("busy", 1))
	defer w.Leave(ctx, store.Cancelled)
	start := time.Now()
	_, err := w.Wait(ctx, 300*time.Millisecond, nil)
	el := time.Since(start)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Wait(300ms): %v, want ErrBusy", err)
	}
	if el < 300*time.Millisecond || el > 1300*time.Millisecond {
		t.Errorf("Wait(300ms) returned after %v", el)
	}
}

// handoffs measures, n times, from the holder's Leave to the waiter's Wait
// returning held.
func handoffs(t *testing.T, g *Gate, limit string, n int) []time.Duration {
	t.Helper()
	ctx := context.Background()
	holder := join(t, g, request(limit, 1))
	var lat []time.Duration
	for range n {
		w := join(t, g, request(limit, 1))
		if w.Ticket().State != store.Waiting {
			t.Fatalf("waiter is %s, want waiting", w.Ticket().State)
		}
		ch := waitAsync(w, ctx, 10*time.Second)
		time.Sleep(20 * time.Millisecond) // let it go to sleep on the bell
		notYet(t, ch)
		start := time.Now()
		if ok, err := holder.Leave(ctx, store.Released); !ok || err != nil {
			t.Fatalf("holder Leave = %v, %v", ok, err)
		}
		r := await(t, ch, 3*time.Second)
		if r.err != nil || r.t.State != store.Held {
			t.Fatalf("waiter Wait = %+v, %v; want held", r.t, r.err)
		}
		d := r.at.Sub(start)
		if d > time.Second {
			t.Errorf("handoff took %v, want < 1s", d)
		}
		lat = append(lat, d)
		holder = w
	}
	holder.Leave(ctx, store.Released)
	slices.Sort(lat)
	return lat
}

func TestHandoffIsPrompt(t *testing.T) {
	g, _, _ := newGate(t, 0) // the default poll, 2s ±20%
	lat := handoffs(t, g, "handoff", 20)
	t.Logf("handoff over %d (Leave -> Wait returns held): median %v, p90 %v, max %v",
		len(lat), lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1])
}

func TestBellAloneWakes(t *testing.T) {
	g, _, _ := newGate(t, time.Hour) // the poll never fires within the test
	g.Rand = func() float64 { return 0 }
	lat := handoffs(t, g, "bellonly", 3)
	t.Logf("bell-only handoff: median %v", lat[len(lat)/2])
}

func TestPollFallbackAdmits(t *testing.T) {
	g, s, _ := newGate(t, 50*time.Millisecond)
	g.Store = silentStore{s}
	ctx := context.Background()
	h := join(t, g, request("poll", 1))
	w := join(t, g, request("poll", 1))
	var updates atomic.Int32
	ch := make(chan waitResult, 1)
	go func() {
		tk, err := w.Wait(ctx, 5*time.Second, func(store.Ticket) { updates.Add(1) })
		ch <- waitResult{tk, err, time.Now()}
	}()
	time.Sleep(150 * time.Millisecond)
	notYet(t, ch)
	start := time.Now()
	h.Leave(ctx, store.Released)
	r := await(t, ch, 3*time.Second)
	if r.err != nil || r.t.State != store.Held {
		t.Fatalf("Wait with a silent bell = %+v, %v; want held by polling", r.t, r.err)
	}
	if d := r.at.Sub(start); d > time.Second {
		t.Errorf("poll fallback admitted after %v, want about one 50ms poll", d)
	}
	if updates.Load() < 2 {
		t.Errorf("update saw %d reads, want one per poll", updates.Load())
	}
	w.Leave(ctx, store.Released)
}

// Nudge wakes a Wait whose bell is silent and whose poll is far off: the
// caller's renewal saw the ticket admitted.
func TestNudgeWakesWait(t *testing.T) {
	g, s, _ := newGate(t, time.Hour)
	g.Store = silentStore{s}
	ctx := context.Background()
	h := join(t, g, request("nudge", 1))
	w := join(t, g, request("nudge", 1))
	ch := waitAsync(w, ctx, 10*time.Second)
	h.Leave(ctx, store.Released)
	time.Sleep(100 * time.Millisecond)
	notYet(t, ch) // no ring, no poll: still asleep
	w.Nudge()
	w.Nudge() // a second nudge before the first is taken does not block
	if r := await(t, ch, 3*time.Second); r.err != nil || r.t.State != store.Held {
		t.Fatalf("Wait after Nudge = %+v, %v; want held", r.t, r.err)
	}
	w.Leave(ctx, store.Released)
}

func TestFIFOAdmission(t *testing.T) {
	g, _, _ := newGate(t, time.Hour)
	ctx := context.Background()
	h := join(t, g, request("fifo", 1))
	var entries []*Entry
	for i := range 5 {
		e := join(t, g, request("fifo", 1))
		if p := e.Ticket().Position; p != i+1 {
			t.Errorf("waiter %d joined at position %d", i, p)
		}
		entries = append(entries, e)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	errs := make(chan error, len(entries))
	for i, e := range entries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, err := e.Wait(ctx, 10*time.Second, nil)
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if tk.Slot != 0 {
				errs <- fmt.Errorf("waiter %d holds slot %d", i, tk.Slot)
			}
			time.Sleep(5 * time.Millisecond)
			if _, err := e.Leave(ctx, store.Released); err != nil {
				errs <- err
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	h.Leave(ctx, store.Released)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("waiters not all admitted within 10s")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if !slices.Equal(order, []int{0, 1, 2, 3, 4}) {
		t.Errorf("admission order %v, want the join order", order)
	}
}

func TestWaiterLostWhenSwept(t *testing.T) {
	g, s, clock := newGate(t, time.Hour)
	ctx := context.Background()
	hreq := request("lost", 1)
	hreq.TTL = time.Hour
	h := join(t, g, hreq)
	defer h.Leave(ctx, store.Released)
	wreq := request("lost", 1)
	wreq.TTL = 5 * time.Second
	w := join(t, g, wreq)
	defer w.Close()
	ch := waitAsync(w, ctx, 10*time.Second)
	time.Sleep(20 * time.Millisecond)
	clock.Advance(10 * time.Second) // the waiter's lease is over; the holder's is not
	start := time.Now()
	other := request("lost", 1)
	if _, err := s.Enqueue(ctx, other); err != nil { // sweeps the limit
		t.Fatal(err)
	}
	r := await(t, ch, 3*time.Second)
	if !errors.Is(r.err, store.ErrLost) {
		t.Fatalf("Wait of a swept waiter: %v, want ErrLost", r.err)
	}
	if d := r.at.Sub(start); d > time.Second {
		t.Errorf("swept waiter learned after %v; the removal should ring its bell", d)
	}
}

func TestWaitCtxCancelReturnsCause(t *testing.T) {
	g, s, _ := newGate(t, time.Hour)
	h := join(t, g, request("ctx", 1))
	defer h.Leave(context.Background(), store.Released)
	w := join(t, g, request("ctx", 1))
	cause := errors.New("operator pressed ^C")
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel(cause) }()
	start := time.Now()
	_, err := w.Wait(ctx, -1, nil)
	if !errors.Is(err, cause) {
		t.Errorf("Wait after cancel: %v, want the cause", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("Wait returned %v after the cancel", el)
	}
	if _, err := s.Get(context.Background(), w.Ticket().ID); err != nil {
		t.Errorf("a cancelled Wait leaves the ticket for Leave: Get = %v", err)
	}
	if ok, err := w.Leave(context.Background(), store.Cancelled); !ok || err != nil {
		t.Errorf("Leave after cancel = %v, %v", ok, err)
	}
}

func TestNewID(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := make(map[string]bool, 10000)
	for range 10000 {
		id := NewID()
		if !re.MatchString(id) {
			t.Fatalf("NewID() = %q, want 32 lower-case hex digits", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}

func TestJoinSlotsConflictLeavesNothing(t *testing.T) {
	g, s, _ := newGate(t, 0)
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "conf", 2); err != nil {
		t.Fatal(err)
	}
	req := request("conf", 3)
	req.CheckSlots = true
	e, err := g.Join(ctx, req)
	var conflict *store.SlotsConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("Join with 3 slots on a 2-slot limit: %v, want *SlotsConflictError", err)
	}
	if e != nil {
		t.Errorf("Join returned an entry with its error")
	}
	if conflict.Have != 2 || conflict.Want != 3 {
		t.Errorf("conflict = %+v", conflict)
	}
	if _, err := s.Get(ctx, req.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ticket after a refused Join: %v, want ErrNotFound", err)
	}
	if _, err := os.Lstat(bellPath(s, req.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("bell after a refused Join: %v, want none", err)
	}
	snap, err := s.Snapshot(ctx, "conf")
	if err != nil || len(snap.Tickets) != 0 {
		t.Errorf("limit after a refused Join: %+v, %v", snap, err)
	}
	// A refusal wrote nothing, so it needs no cancel: the id is not tombstoned.
	req.Slots, req.CheckSlots = 2, true
	if _, err := s.Enqueue(ctx, req); err != nil {
		t.Errorf("Enqueue of the refused id with the right size: %v", err)
	}
}

func TestJoinCancelsWhenEnqueueOutcomeUnknown(t *testing.T) {
	g, s, _ := newGate(t, 0)
	g.Store = lostAckStore{s}
	ctx := context.Background()
	req := request("ack", 1)
	e, err := g.Join(ctx, req)
	if !errors.Is(err, store.ErrUnavailable) || e != nil {
		t.Fatalf("Join = %v, %v; want the Enqueue error and no entry", e, err)
	}
	if _, err := s.Get(ctx, req.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ticket after Join cancelled an unknown write: %v, want ErrNotFound", err)
	}
	if _, err := s.Enqueue(ctx, req); !errors.Is(err, store.ErrRemoved) {
		t.Errorf("a retried or late write of the cancelled id: %v, want ErrRemoved", err)
	}
	snap, err := s.Snapshot(ctx, "ack")
	if err != nil || snap.Limits[0].Held != 0 || len(snap.Tickets) != 0 {
		t.Errorf("limit after the cancel: %+v, %v; want its slot free", snap, err)
	}
	if _, err := os.Lstat(bellPath(s, req.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("bell after a failed Join: %v, want none", err)
	}
}

func TestConcurrentHoldersNeverExceedSlots(t *testing.T) {
	g, s, _ := newGate(t, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const workers, slots = 20, 2
	var cur, peak, admitted atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := g.Join(ctx, request("conc", slots))
			if err != nil {
				errs <- fmt.Errorf("worker %d Join: %w", i, err)
				return
			}
			tk, err := e.Wait(ctx, 15*time.Second, nil)
			if err != nil {
				e.Leave(context.WithoutCancel(ctx), store.Cancelled)
				errs <- fmt.Errorf("worker %d Wait: %w", i, err)
				return
			}
			n := cur.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			if n > slots {
				errs <- fmt.Errorf("%d holders at once on a limit of %d", n, slots)
			}
			if tk.Slot < 0 || tk.Slot >= slots {
				errs <- fmt.Errorf("worker %d holds slot %d", i, tk.Slot)
			}
			admitted.Add(1)
			time.Sleep(5 * time.Millisecond)
			cur.Add(-1) // the work stops before the slot is let go
			if ok, err := e.Leave(ctx, store.Released); !ok || err != nil {
				errs <- fmt.Errorf("worker %d Leave = %v, %v", i, ok, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if admitted.Load() != workers {
		t.Errorf("%d of %d workers admitted", admitted.Load(), workers)
	}
	t.Logf("%d workers through a limit of %d in %v, peak %d holders", workers, slots, time.Since(start), peak.Load())
	snap, err := s.Snapshot(context.Background(), "conc")
	if err != nil || len(snap.Tickets) != 0 {
		t.Errorf("tickets left after all workers left: %+v, %v", snap.Tickets, err)
	}
}

// TestHeadExpiryExpiredHolder: a holder whose lease has already run out
// (Remaining 0 or below, as the store reports it) is the first expiry: the
// head waiter sweeps 50ms later, not at its next poll or renewal.
func TestHeadExpiryExpiredHolder(t *testing.T) {
	for _, rem := range []time.Duration{-time.Second, -time.Millisecond, 0} {
		snap := store.Snapshot{Tickets: []store.Ticket{
			{ID: "a", State: store.Held, Remaining: rem},
			{ID: "b", State: store.Held, Remaining: 10 * time.Second},
			{ID: "w", State: store.Waiting, Position: 1, Remaining: 20 * time.Second},
		}}
		d, ok := HeadExpiry(snap)
		if !ok || d != 55*time.Millisecond {
			t.Errorf("holder with %v left: HeadExpiry = %v, %v; want 55ms, true", rem, d, ok)
		}
	}
	if _, ok := HeadExpiry(store.Snapshot{Tickets: []store.Ticket{{ID: "w", State: store.Waiting, Remaining: time.Second}}}); ok {
		t.Error("HeadExpiry with no holder: ok, want false")
	}
}

// TestTicketExpiry: a waiting ticket of several limits watches the holders
// of the limits it heads, and only those: in "a" it is second (an older
// ticket waits there and watches "a"), in "b" first.
func TestTicketExpiry(t *testing.T) {
	w := store.Ticket{ID: "w", Limit: "a", Limits: []string{"a", "b"}, State: store.Waiting, Slot: -1, Fence: 5}
	var snap store.Snapshot
	snap.AddLimit(store.Limit{Name: "a", Slots: 1}, []store.Ticket{
		{ID: "ha", Limit: "a", State: store.Held, Fence: 1, Remaining: 3 * time.Second},
		{ID: "older", Limit: "a", State: store.Waiting, Slot: -1, Fence: 2, Remaining: time.Minute},
		w,
	})
	snap.AddLimit(store.Limit{Name: "b", Slots: 1}, []store.Ticket{
		{ID: "hb", Limit: "b", State: store.Held, Fence: 3, Remaining: 7 * time.Second},
		w,
	})
	d, ok := TicketExpiry(snap, w)
	if !ok || d != 7*time.Second+5*time.Millisecond {
		t.Errorf("TicketExpiry = %v, %v; want 7.005s (b's holder), true", d, ok)
	}
	if d, ok := TicketExpiry(snap, store.Ticket{ID: "older"}); !ok || d != 3*time.Second+5*time.Millisecond {
		t.Errorf("TicketExpiry of the head of a = %v, %v; want 3.005s, true", d, ok)
	}
	if _, ok := TicketExpiry(snap, store.Ticket{ID: "ha"}); ok {
		t.Error("TicketExpiry of a holder: ok, want false")
	}
}

// TestWaitSweepsEveryLimit: a waiter of two limits, blocked only in its
// second by a holder whose lease runs out, sweeps that limit at the
// holder's expiry and is admitted then, with no other write to the store:
// it watches and sweeps all of its limits, not only its first.
func TestWaitSweepsEveryLimit(t *testing.T) {
	g, s, clock := newGate(t, time.Hour)
	ctx := context.Background()
	if _, err := s.Enqueue(ctx, request("b", 1)); err != nil {
		t.Fatal(err)
	}
	req := request("", 1)
	req.Limits, req.TTL = []string{"a", "b"}, time.Hour
	e := join(t, g, req)
	defer e.Close()
	if e.Ticket().State != store.Waiting {
		t.Fatalf("the waiter is %s, want waiting behind b's holder", e.Ticket().State)
	}
	clock.Advance(2 * time.Minute) // b's holder (1m lease) expired; the waiter's (1h) did not
	start := time.Now()
	got, err := e.Wait(ctx, 3*time.Second, nil)
	if err != nil {
		t.Fatalf("Wait: %v after %s; want admitted once b's holder expired", err, time.Since(start))
	}
	if got.SlotsVar() != "a=0 b=0" {
		t.Errorf("admitted with slots %q, want a=0 b=0", got.SlotsVar())
	}
}

// A --max-waiting refusal wrote nothing, so Join leaves its id alone: no
// cancel, no tombstone (docs/leases.md §2.1 item 10). The store would take
// the same id later; a tombstone would refuse it.
func TestJoinQueueFullWritesNothing(t *testing.T) {
	g, s, _ := newGate(t, 0)
	h := join(t, g, request("full", 1))
	defer h.Leave(context.Background(), store.Released)
	req := request("full", 1)
	none := 0
	req.MaxWaiting = &none
	if _, err := g.Join(context.Background(), req); !errors.Is(err, store.ErrQueueFull) {
		t.Fatalf("Join behind a holder with --max-waiting 0: %v, want ErrQueueFull", err)
	}
	req.MaxWaiting = nil
	tk, err := s.Enqueue(context.Background(), req)
	if err != nil || tk.State != store.Waiting {
		t.Fatalf("Enqueue of the refused id afterwards: %s, %v; want waiting (nothing was written for it)", tk.State, err)
	}
}

// TestHeadExpiryRateOpens: the head of a limit whose rate is spent sweeps
// when the window opens (Limit.Opens), or at its holder's expiry if that
// comes first; a limit of another ticket's head does not count.
func TestHeadExpiryRateOpens(t *testing.T) {
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	rated := store.Limit{Name: "r", Slots: 2, Opens: now.Add(2 * time.Second)}
	snap := store.Snapshot{Now: now, Limits: []store.Limit{rated}, Tickets: []store.Ticket{
		{ID: "w", Limit: "r", State: store.Waiting, Position: 1, Remaining: time.Minute},
	}}
	if d, ok := HeadExpiry(snap); !ok || d != 2*time.Second+5*time.Millisecond {
		t.Errorf("no holder, window opens in 2s: HeadExpiry = %v, %v; want 2.005s, true", d, ok)
	}
	snap.Tickets = append(snap.Tickets, store.Ticket{ID: "h", Limit: "r", State: store.Held, Remaining: time.Second})
	if d, ok := HeadExpiry(snap); !ok || d != time.Second+5*time.Millisecond {
		t.Errorf("holder expires in 1s, window in 2s: HeadExpiry = %v, %v; want 1.005s, true", d, ok)
	}
	snap.Tickets[1].Remaining = 10 * time.Second
	if d, ok := HeadExpiry(snap); !ok || d != 2*time.Second+5*time.Millisecond {
		t.Errorf("holder expires in 10s, window in 2s: HeadExpiry = %v, %v; want 2.005s, true", d, ok)
	}

	// Two limits: the waiter heads "a" (rate spent) but not "r", where an
	// older ticket waits and watches r's window itself.
	w := store.Ticket{ID: "w", Limit: "a", Limits: []string{"a", "r"}, State: store.Waiting, Slot: -1, Fence: 5}
	var two store.Snapshot
	two.Now = now
	two.AddLimit(store.Limit{Name: "a", Slots: 1}, []store.Ticket{w})
	two.AddLimit(store.Limit{Name: "r", Slots: 1}, []store.Ticket{{ID: "older", Limit: "r", State: store.Waiting, Slot: -1, Fence: 2}, w})
	two.Limits[0].Opens = now.Add(3 * time.Second)
	two.Limits[1].Opens = now.Add(time.Second)
	if d, ok := TicketExpiry(two, w); !ok || d != 3*time.Second+5*time.Millisecond {
		t.Errorf("TicketExpiry = %v, %v; want 3.005s (a's window), true", d, ok)
	}
}

// TestWaitRateWindowOpens: the head of a limit whose rate is spent, with
// no holder to expire and no poll for an hour, sweeps when the window
// opens and is admitted then, with no other write to the store.
func TestWaitRateWindowOpens(t *testing.T) {
	s, err := boltstore.New(filepath.Join(t.TempDir(), "slots.db"), boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := &Gate{Store: s, PollEvery: time.Hour, QuietPollEvery: time.Hour}
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "r", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetPolicy(ctx, "r", store.PolicyChange{Rate: &store.Rate{N: 1, Per: time.Second}}); err != nil {
		t.Fatal(err)
	}
	first := join(t, g, request("r", 2))
	if first.Ticket().State != store.Held {
		t.Fatalf("the first run is %s, want held (the rate's one admission)", first.Ticket().State)
	}
	if ok, err := first.Leave(ctx, store.Released); !ok || err != nil {
		t.Fatalf("Leave = %v, %v", ok, err)
	}
	e := join(t, g, request("r", 2))
	defer e.Close()
	if e.Ticket().State != store.Waiting {
		t.Fatalf("the second run is %s, want waiting: the rate of 1/1s is spent", e.Ticket().State)
	}
	snap, err := s.Snapshot(ctx, "r")
	if err != nil || len(snap.Limits) != 1 || !snap.Limits[0].Opens.After(snap.Now) {
		t.Fatalf("snapshot: %+v, %v; want the limit's window to open later", snap.Limits, err)
	}
	// A bound for a loaded machine: the window opens within a second, the
	// poll not for an hour.
	got, err := e.Wait(ctx, time.Minute, nil)
	if err != nil {
		t.Fatalf("Wait: %v; want admitted when the window opened", err)
	}
	if got.State != store.Held {
		t.Errorf("admitted as %s", got.State)
	}
}
