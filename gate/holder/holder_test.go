package holder_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

const ttl = 30 * time.Second

// env is a real bbolt store on a fake clock, and the holder's own clock:
// the store's plus skew, so a test can make the holder's lease run out
// (a suspend, a slow write) while the store still has it.
type env struct {
	st    *boltstore.Store
	clock *boltstore.FakeClock
	skew  atomic.Int64
	sigs  chan os.Signal
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{clock: boltstore.NewFakeClock(boltstore.Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()}), sigs: make(chan os.Signal, 4)}
	st, err := boltstore.New(filepath.Join(t.TempDir(), "slots.db"), boltstore.Options{Clock: e.clock, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.st = st
	return e
}

func (e *env) now() time.Duration { return e.clock.Now().Mono + time.Duration(e.skew.Load()) }

func (e *env) config(s holder.Store, limit string) holder.Config {
	return holder.Config{
		Store:   s,
		Gate:    gate.Gate{PollEvery: time.Hour},
		Request: store.EnqueueRequest{ID: gate.NewID(), Limit: limit, Slots: 1, TTL: ttl, Holder: store.Holder{Host: "h", Pid: os.Getpid()}},
		Wait:    -1, KillAfter: 10 * time.Second,
		Renew:   renew.Options{TTL: ttl},
		Now:     e.now,
		Signals: e.sigs,
		Start: func(context.Context, store.Ticket) (holder.Child, error) {
			return nil, errors.New("the job must not start")
		},
	}
}

// event is the newest event of ticket id, or "".
func (e *env) event(t *testing.T, limit, id string) string {
	t.Helper()
	evs, err := e.st.Events(context.Background(), limit, 100)
	if err != nil {
		t.Fatal(err)
	}
	kind := ""
	for _, ev := range evs {
		if ev.Ticket == id {
			kind = ev.Kind
		}
	}
	return kind
}

// slowEnqueue's enqueue takes longer than the lease on the holder's clock.
type slowEnqueue struct {
	*boltstore.Store
	e *env
}

func (s slowEnqueue) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	t, err := s.Store.Enqueue(ctx, req)
	s.e.skew.Add(int64(ttl))
	return t, err
}

// TestLostBeforeStartReleases: admitted with a lease already used up, the
// holder does not start the job, and releases the ticket as lost (a `lost`
// event; the slot comes back now, not at expiry).
func TestLostBeforeStartReleases(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(slowEnqueue{e.st, e}, "a")
	out := holder.Run(context.Background(), cfg)
	if out.Result != holder.LostBeforeStart {
		t.Fatalf("result %v (%v), want LostBeforeStart", out.Result, out.Err)
	}
	if _, err := e.st.Get(context.Background(), cfg.Request.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ticket still in the store after a loss before start (Get: %v): the slot stays held until it expires", err)
	}
	if k := e.event(t, "a", cfg.Request.ID); k != string(store.Lost) {
		t.Errorf("last event of the ticket %q, want %q", k, store.Lost)
	}
}

// waitBehind starts a run of limit (one slot) behind a holder that keeps it
// for an hour, on the store st (e.st if nil), and returns once the run
// waits: its config and where its outcome comes.
func (e *env) waitBehind(ctx context.Context, t *testing.T, limit string, st holder.Store) (holder.Config, <-chan holder.Outcome) {
	t.Helper()
	if _, err := e.st.Enqueue(ctx, store.EnqueueRequest{ID: gate.NewID(), Limit: limit, Slots: 1, TTL: time.Hour, Holder: store.Holder{Host: "h", Pid: 1}}); err != nil {
		t.Fatal(err)
	}
	if st == nil {
		st = e.st
	}
	cfg := e.config(st, limit)
	waiting := make(chan struct{})
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.WaitStart {
			close(waiting)
		}
	}
	done := make(chan holder.Outcome, 1)
	go func() { done <- holder.Run(ctx, cfg) }()
	<-waiting
	return cfg, done
}

// TestWaiterPastItsOwnDeadlineWaitsOn: a waiter whose own deadline passed
// (suspended, or a busy machine) while its ticket stayed in the store is
// not lost: it holds no slot, so it renews and waits on (docs/leases.md
// rule 17).
func TestWaiterPastItsOwnDeadlineWaitsOn(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, done := e.waitBehind(ctx, t, "w", nil)
	e.clock.Advance(ttl + time.Second) // the store's clock and the holder's: past the lease
	e.sigs <- syscall.SIGCONT          // resumed: the holder checks its lease
	renewed := false
	for range 200 {
		got, err := e.st.Get(ctx, cfg.Request.ID)
		if err != nil {
			t.Fatalf("Get the waiter's ticket: %v", err)
		}
		if got.Remaining == ttl {
			renewed = true
			break
		}
		select {
		case out := <-done:
			t.Fatalf("Run returned %v (%v) past its own deadline, its ticket still stored; want it to renew and wait on", out.Result, out.Err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if !renewed {
		t.Fatal("the waiter past its own deadline did not renew within 10s")
	}
	cancel()
	if out := <-done; out.Result == holder.LostWaiting {
		t.Errorf("result %v (%v), want the cancelled wait", out.Result, out.Err)
	}
}

// TestWaiterWhoseTicketIsGoneIsLost: a waiter whose ticket the store removed
// (a TTL late, nobody vouching) learns it at its next look and exits lost.
func TestWaiterWhoseTicketIsGoneIsLost(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, done := e.waitBehind(ctx, t, "w", nil)
	e.clock.Advance(ttl + time.Second)
	if rm, err := e.st.Reap(ctx, store.ReapOptions{}); err != nil || len(rm) != 1 {
		t.Fatalf("Reap: %d removed, %v; want the late waiter", len(rm), err)
	}
	e.sigs <- syscall.SIGCONT
	var out holder.Outcome
	select {
	case out = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its ticket was reaped")
	}
	if out.Result != holder.LostWaiting || !errors.Is(out.Err, store.ErrLost) {
		t.Fatalf("result %v (%v), want LostWaiting wrapping ErrLost", out.Result, out.Err)
	}
}

// unreachable is the store with its network gone once down is set: every
// call hangs until its context ends, as on etcd with the server gone.
type unreachable struct {
	*boltstore.Store
	down atomic.Bool
	e    *env
	slow bool // the enqueue takes longer than the lease (slowEnqueue), then the store goes
}

// hang waits as a call to a store that does not answer: until its
// context ends or the store's own timeout (--store-timeout, 5s) runs out.
func (u *unreachable) hang(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
	}
	return store.ErrUnavailable
}

func (u *unreachable) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	t, err := u.Store.Enqueue(ctx, req)
	if u.slow {
		u.e.skew.Add(int64(ttl))
		u.down.Store(true)
	}
	return t, err
}

func (u *unreachable) Release(ctx context.Context, t store.Ticket, why store.Reason) (bool, error) {
	if u.down.Load() {
		return false, u.hang(ctx)
	}
	return u.Store.Release(ctx, t, why)
}

func (u *unreachable) Cancel(ctx context.Context, t store.Ticket) (bool, error) {
	if u.down.Load() {
		return false, u.hang(ctx)
	}
	return u.Store.Cancel(ctx, t)
}

func (u *unreachable) Get(ctx context.Context, id string) (store.Ticket, error) {
	if u.down.Load() {
		return store.Ticket{}, u.hang(ctx)
	}
	return u.Store.Get(ctx, id)
}

func (u *unreachable) Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error) {
	if u.down.Load() {
		return store.Snapshot{}, u.hang(ctx)
	}
	return u.Store.Snapshot(ctx, limits...)
}

// TestReleaseAfterLossIsBounded: after a lease lost before the job could
// start (the enqueue outlasted it), with the store unreachable, the release
// that cannot succeed is bounded by what is left of the lease, not the
// whole release timeout (5s). (A waiter past its own deadline is not lost:
// TestWaiterPastItsOwnDeadlineWaitsOn.)
func TestReleaseAfterLossIsBounded(t *testing.T) {
	e := newEnv(t)
	u := &unreachable{Store: e.st, e: e, slow: true}
	start := time.Now()
	out := holder.Run(context.Background(), e.config(u, "u"))
	took := time.Since(start)
	if out.Result != holder.LostBeforeStart {
		t.Fatalf("result %v (%v), want LostBeforeStart", out.Result, out.Err)
	}
	if took > 4*time.Second { // room for a loaded machine, below the 5s
		t.Errorf("Run took %s to return after the loss with the store unreachable, want well under the 5s release timeout", took)
	}
}

// TestSignalledWaiterThatCannotLeave: a waiter signalled while the store
// does not answer cannot remove its ticket: the outcome says so (LeaveErr,
// and a LeaveFailed note), so that the run does not claim it left the
// queue, and it returns within the release timeout.
func TestSignalledWaiterThatCannotLeave(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	u := &unreachable{Store: e.st, e: e}
	if _, err := e.st.Enqueue(ctx, store.EnqueueRequest{ID: gate.NewID(), Limit: "u", Slots: 1, TTL: time.Hour, Holder: store.Holder{Host: "h", Pid: 1}}); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(u, "u")
	cfg.ReleaseTimeout = 300 * time.Millisecond
	waiting := make(chan struct{})
	var noted atomic.Bool
	cfg.Notify = func(n holder.Note) {
		switch n.Kind {
		case holder.WaitStart:
			close(waiting)
		case holder.LeaveFailed:
			noted.Store(true)
		}
	}
	done := make(chan holder.Outcome)
	go func() { done <- holder.Run(ctx, cfg) }()
	<-waiting
	u.down.Store(true)
	start := time.Now()
	e.sigs <- syscall.SIGTERM
	out := <-done
	if out.Result != holder.Signalled || out.LeaveErr == nil || !noted.Load() {
		t.Fatalf("result %v (%v), LeaveErr %v, LeaveFailed noted %v: want signalled, with the failed removal said", out.Result, out.Err, out.LeaveErr, noted.Load())
	}
	if took := time.Since(start); took > 4*time.Second { // below the store's 5s
		t.Errorf("returned %s after the signal, want within the release timeout (300ms) and the store's 5s", took)
	}
}

// busyStore is locked by others for its first n enqueues: each fails with
// the lock timeout and writes nothing.
type busyStore struct {
	*boltstore.Store
	n int
}

func (b *busyStore) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	if b.n > 0 {
		b.n--
		time.Sleep(time.Millisecond) // the lock's wait, shortened
		return store.Ticket{}, &store.LockTimeoutError{Path: "slots.db", Waited: 5 * time.Second}
	}
	return b.Store.Enqueue(ctx, req)
}

// runNoting runs cfg with wait, a job that ends at once; it returns the
// ticket the job ran under (none: it did not run) and how many StoreBusy
// notes came first.
func runNoting(cfg holder.Config, wait time.Duration) (ran store.Ticket, busy int, out holder.Outcome) {
	cfg.Wait = wait
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.StoreBusy {
			busy++
		}
	}
	cfg.Start = func(_ context.Context, t store.Ticket) (holder.Child, error) {
		ran = t
		return nil, errors.New("started")
	}
	out = holder.Run(context.Background(), cfg)
	return ran, busy, out
}

// TestBusyStoreIsWaitedFor: a run that may wait keeps trying an enqueue that
// found the store locked by others (nothing was written); one that may not
// wait fails with the store's error.
func TestBusyStoreIsWaitedFor(t *testing.T) {
	for _, wait := range []time.Duration{-1, 0} {
		e := newEnv(t)
		ran, busy, out := runNoting(e.config(&busyStore{Store: e.st, n: 3}, "b"), wait)
		var lte *store.LockTimeoutError
		switch {
		case wait != 0 && (ran.ID == "" || busy != 3):
			t.Errorf("wait %v: ran %q after %d busy notes (%v: %v); want it run after 3", wait, ran.ID, busy, out.Result, out.Err)
		case wait == 0 && (ran.ID != "" || !errors.As(out.Err, &lte)):
			t.Errorf("--no-wait: ran %q, %v: %v; want the lock timeout, not run", ran.ID, out.Result, out.Err)
		}
	}
}

// lostStore loses the answer of its first n enqueues, as an etcd store does
// through an election: the first is written, the others write nothing.
type lostStore struct {
	*boltstore.Store
	n, sent int
	at      []time.Time // when each enqueue came
}

func (l *lostStore) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	l.sent++
	l.at = append(l.at, time.Now())
	if l.n == 0 {
		return l.Store.Enqueue(ctx, req)
	}
	l.n--
	if l.sent == 1 {
		if _, err := l.Store.Enqueue(ctx, req); err != nil {
			return store.Ticket{}, err
		}
	}
	return store.Ticket{}, fmt.Errorf("%w: test: no answer (%w)", store.ErrUnavailable, store.ErrUnknownOutcome)
}

// TestLostJoinAnswerIsSentAgain: a run that may wait sends an enqueue
// whose answer was lost again, the same ticket, which finds what the
// first write made, each time after a pause that doubles (100, 200, 400
// ms: no busy loop on a store that loses every answer at once); one that
// may not wait fails with the store's error, and its ticket, written or
// not, is cancelled.
func TestLostJoinAnswerIsSentAgain(t *testing.T) {
	for _, wait := range []time.Duration{-1, time.Hour, 0} {
		e := newEnv(t)
		l := &lostStore{Store: e.st, n: 3}
		cfg := e.config(l, "l")
		ran, busy, out := runNoting(cfg, wait)
		switch {
		case wait != 0 && (ran.ID != cfg.Request.ID || busy != 3 || l.sent != 4):
			t.Errorf("wait %v: ran ticket %q after %d notes and %d enqueues (%v: %v); want %s run after 3 lost answers", wait, ran.ID, busy, l.sent, out.Result, out.Err, cfg.Request.ID)
		case wait == 0 && (ran.ID != "" || !errors.Is(out.Err, store.ErrUnknownOutcome) || l.sent != 1):
			t.Errorf("--no-wait: ran %q after %d enqueues, %v: %v; want the lost answer, once, not run", ran.ID, l.sent, out.Result, out.Err)
		}
		for i := 1; i < len(l.at); i++ {
			if gap, least := l.at[i].Sub(l.at[i-1]), 100*time.Millisecond<<(i-1); gap < least {
				t.Errorf("wait %v: enqueue %d sent %v after the lost one, want a pause of %v first", wait, i+1, gap, least)
			}
		}
		if wait == 0 {
			if _, err := e.st.Get(context.Background(), cfg.Request.ID); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("--no-wait: the ticket the lost write made: %v; want it cancelled", err)
			}
		}
	}
}

// TestSignalWhileAnswersAreLost: a run that keeps sending an enqueue whose
// answers are lost ends on SIGTERM, and cancels the ticket that the first
// write made.
func TestSignalWhileAnswersAreLost(t *testing.T) {
	e := newEnv(t)
	l := &lostStore{Store: e.st, n: 1 << 30}
	cfg := e.config(l, "l")
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.StoreBusy && l.sent == 2 {
			e.sigs <- syscall.SIGTERM
		}
	}
	out := holder.Run(context.Background(), cfg)
	if out.Result != holder.Signalled || out.Signal != syscall.SIGTERM {
		t.Errorf("%v %v (%v), want Signalled by SIGTERM", out.Result, out.Signal, out.Err)
	}
	if _, err := e.st.Get(context.Background(), cfg.Request.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the ticket the first lost write made: %v; want it cancelled", err)
	}
}

// TestAdmittedPastItsOwnDeadlineRuns: a waiter whose own deadline passed (a
// slow machine) is admitted; the admission gave the ticket a whole lease,
// which the holder takes from its read of the ticket, so the job runs
// instead of exiting "lost before start".
func TestAdmittedPastItsOwnDeadlineRuns(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := e.st.Enqueue(ctx, store.EnqueueRequest{ID: gate.NewID(), Limit: "a", Slots: 1, TTL: time.Hour, Holder: store.Holder{Host: "h", Pid: 1}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.config(e.st, "a")
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.WaitStart {
			e.skew.Add(int64(ttl)) // the waiter's clock: its own deadline is past
			if _, err := e.st.Release(ctx, h, store.Released); err != nil {
				t.Error(err)
			}
		}
	}
	child := newFakeChild()
	started := false
	cfg.Start = func(context.Context, store.Ticket) (holder.Child, error) {
		started = true
		child.Signal(syscall.SIGTERM) // the job ends at once
		return child, nil
	}
	out := holder.Run(ctx, cfg)
	if !started {
		t.Fatalf("the job did not start: %v (%v)", out.Result, out.Err)
	}
}

// renewCounter counts the renewals that reach the store.
type renewCounter struct {
	*boltstore.Store
	n atomic.Int32
}

func (c *renewCounter) Renew(ctx context.Context, t store.Ticket, d time.Duration) (store.Ticket, error) {
	c.n.Add(1)
	return c.Store.Renew(ctx, t, d)
}

// TestQuietWaiterRenewsOnlyInLine: a waiter behind another renews nothing
// (renewing every 20ms, it would have renewed a dozen times), and starts
// renewing once the waiter ahead leaves and its bell says it is in line.
func TestQuietWaiterRenewsOnlyInLine(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ahead store.Ticket
	for _, id := range []string{"h", "w1"} {
		tk, err := e.st.Enqueue(ctx, store.EnqueueRequest{ID: id, Limit: "q", Slots: 1, TTL: time.Hour, Holder: store.Holder{Host: "h", Pid: 1}})
		if err != nil {
			t.Fatal(err)
		}
		ahead = tk
	}
	c := &renewCounter{Store: e.st}
	cfg := e.config(c, "q")
	cfg.Renew = renew.Options{TTL: ttl, Every: 20 * time.Millisecond, WaitEvery: 20 * time.Millisecond}
	waiting := make(chan store.Ticket, 1)
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.WaitStart {
			waiting <- n.Ticket
		}
	}
	done := make(chan holder.Outcome, 1)
	go func() { done <- holder.Run(ctx, cfg) }()
	if tk := <-waiting; !tk.Quiet {
		t.Fatalf("the second waiter is not quiet: %+v", tk)
	}
	time.Sleep(300 * time.Millisecond)
	if n := c.n.Load(); n != 0 {
		t.Fatalf("a quiet waiter renewed %d times", n)
	}
	if _, err := e.st.Cancel(ctx, ahead); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); c.n.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter now in line did not renew within 10s")
		}
	}
	cancel()
	<-done
}

// TestSignalWhileTheStoreIsBusy: a run that keeps trying a locked store
// still ends on SIGTERM, as a waiting run does, with nothing written.
func TestSignalWhileTheStoreIsBusy(t *testing.T) {
	e := newEnv(t)
	b := &busyStore{Store: e.st, n: 1 << 30}
	cfg := e.config(b, "b")
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.StoreBusy {
			select {
			case e.sigs <- syscall.SIGTERM:
			default:
			}
		}
	}
	done := make(chan holder.Outcome, 1)
	go func() { done <- holder.Run(context.Background(), cfg) }()
	select {
	case out := <-done:
		if out.Result != holder.Signalled || out.Signal != syscall.SIGTERM || out.Ticket.ID != "" {
			t.Errorf("%v %v (ticket %q), want Signalled by SIGTERM with no ticket", out.Result, out.Signal, out.Ticket.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a SIGTERM did not end a run that kept trying a locked store within 10s")
	}
}
