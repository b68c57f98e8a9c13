package renew

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/slotctl/slotctl/store"
)

// mode is how the fake store answers the next Renew calls.
type mode int

const (
	answer  mode = iota // acknowledge, after delay if set
	failing             // a transient error
	refuse              // an error wrapping store.ErrLost
	hang                // block until ctx is done
	stuck               // block until release is closed, ignoring ctx
)

type call struct {
	sent   time.Duration // Now when the call reached the store
	ticket store.Ticket  // the ticket passed in
	ttl    time.Duration
	budget time.Duration // time left on ctx's deadline when sent; -1 if none
	acked  bool
}

// fakeStore is an in-memory Renewer whose behaviour the test switches.
type fakeStore struct {
	now     func() time.Duration
	release chan struct{}
	unstick func() // closes release, once

	mu       sync.Mutex
	mode     mode
	delay    time.Duration
	held     bool // answer with a held ticket
	calls    []call
	inflight int
}

func newFake(now func() time.Duration) *fakeStore {
	release := make(chan struct{})
	return &fakeStore{now: now, release: release, unstick: sync.OnceFunc(func() { close(release) })}
}

func (f *fakeStore) set(m mode, delay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode, f.delay = m, delay
}

func (f *fakeStore) hold() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = true
}

func (f *fakeStore) log() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

func (f *fakeStore) busy() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inflight
}

func (f *fakeStore) Renew(ctx context.Context, t store.Ticket, ttl time.Duration) (store.Ticket, error) {
	f.mu.Lock()
	i := len(f.calls)
	c := call{sent: f.now(), ticket: t, ttl: ttl, budget: -1}
	if dl, ok := ctx.Deadline(); ok {
		c.budget = time.Until(dl)
	}
	f.calls = append(f.calls, c)
	f.inflight++
	m, delay, held := f.mode, f.delay, f.held
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()

	switch m {
	case failing:
		return store.Ticket{}, errors.New("store unavailable: connection refused")
	case refuse:
		return store.Ticket{}, fmt.Errorf("renew %s: expired 2s ago: %w", t.ID, store.ErrLost)
	case hang:
		<-ctx.Done()
		return store.Ticket{}, ctx.Err()
	case stuck:
		<-f.release
		return store.Ticket{}, errors.New("answered too late")
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return store.Ticket{}, ctx.Err()
		}
	}
	if held {
		t.State, t.Slot, t.Position = store.Held, 0, 0
	}
	f.mu.Lock()
	f.calls[i].acked = true
	f.mu.Unlock()
	return t, nil
}

func waiting() store.Ticket {
	return store.Ticket{ID: "t1", Limit: "build", State: store.Waiting, Fence: 7, Slot: -1, Position: 2, TTL: 3 * time.Second}
}

// bubbleClock is a Now for use inside a synctest bubble, plus a knob that
// moves it ahead without letting any goroutine run (a stop or a suspend).
func bubbleClock() (now func() time.Duration, jump func(time.Duration)) {
	start := time.Now()
	var off atomic.Int64
	now = func() time.Duration { return time.Since(start) + time.Duration(off.Load()) }
	jump = func(d time.Duration) { off.Add(int64(d)) }
	return now, jump
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// lostAt waits for Lost and returns the Now reading when it closed.
func lostAt(t *testing.T, k *Keeper, now func() time.Duration) time.Duration {
	t.Helper()
	select {
	case <-k.Lost():
		return now()
	case <-time.After(time.Hour):
		t.Fatal("lease never lost")
		return 0
	}
}

func near(got, want time.Duration) bool {
	d := got - want
	return d > -time.Millisecond && d < time.Millisecond
}

// sleepUntil sleeps until now() reaches at.
func sleepUntil(now func() time.Duration, at time.Duration) { time.Sleep(at - now()) }

// The three-second lease used by most tests: renew every 1s, deadline 2.7s after a send.
func opts(now func() time.Duration) Options {
	return Options{TTL: 3 * time.Second, Every: time.Second, Margin: 300 * time.Millisecond, Jitter: -1, Now: now}
}

func TestRenewsWaitingAndHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		var mu sync.Mutex
		var seen []store.State
		o := opts(now)
		o.OnRenew = func(t store.Ticket) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, t.State)
		}
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 2500*time.Millisecond)
		if k.Err() != nil || closed(k.Lost()) {
			t.Fatalf("alive lease: Err = %v, Lost closed = %v", k.Err(), closed(k.Lost()))
		}
		f.hold() // promoted between the renewals at 2s and 3s
		sleepUntil(now, 4500*time.Millisecond)

		calls := f.log()
		var passed []store.State
		for i, c := range calls {
			if want := time.Duration(i+1) * time.Second; c.sent != want {
				t.Errorf("renewal %d sent at %v, want %v", i, c.sent, want)
			}
			if c.ttl != o.TTL {
				t.Errorf("renewal %d asked for ttl %v, want %v", i, c.ttl, o.TTL)
			}
			passed = append(passed, c.ticket.State)
		}
		mu.Lock()
		got := fmt.Sprint(seen)
		mu.Unlock()
		if want := "[waiting waiting held held]"; got != want {
			t.Errorf("OnRenew saw %s, want %s", got, want)
		}
		// Each renewal carries the latest ticket the store returned.
		if got, want := fmt.Sprint(passed), "[waiting waiting waiting held]"; got != want {
			t.Errorf("Renew was passed %s, want %s", got, want)
		}
		if st := k.Ticket().State; st != store.Held {
			t.Errorf("Ticket().State = %s, want held", st)
		}
		if d, want := k.Deadline(), 4*time.Second+2700*time.Millisecond; d != want {
			t.Errorf("Deadline() = %v, want %v", d, want)
		}
		if k.Err() != nil {
			t.Errorf("Err() = %v while alive", k.Err())
		}
	})
}

func TestJitteredPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		// Defaults: Every = TTL/3 = 10s, Jitter = ±20%.
		k := Start(t.Context(), f, waiting(), now(), Options{
			TTL: 30 * time.Second, Now: now, Rand: rand.New(rand.NewPCG(1, 2)).Float64,
		})
		defer k.Stop()
		time.Sleep(10 * time.Minute)

		calls := f.log()
		if len(calls) < 40 {
			t.Fatalf("%d renewals in 10m, want about 60", len(calls))
		}
		prev, lo, hi := time.Duration(0), time.Hour, time.Duration(0)
		var last time.Duration
		for i, c := range calls {
			p := c.sent - prev
			if p < 8*time.Second || p > 12*time.Second {
				t.Errorf("period %d = %v, want 10s ± 20%%", i, p)
			}
			if p == last {
				t.Errorf("periods %d and %d are both %v: not jittered", i-1, i, p)
			}
			lo, hi, last, prev = min(lo, p), max(hi, p), p, c.sent
		}
		if hi-lo < 3*time.Second {
			t.Errorf("periods span only %v..%v: jitter narrower than ±20%%", lo, hi)
		}
	})
}

func TestNoJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		k := Start(t.Context(), f, waiting(), now(), Options{TTL: 30 * time.Second, Jitter: -1, Now: now})
		defer k.Stop()
		time.Sleep(time.Minute + time.Second)
		for i, c := range f.log() {
			if want := time.Duration(i+1) * 10 * time.Second; c.sent != want {
				t.Errorf("renewal %d sent at %v, want %v", i, c.sent, want)
			}
		}
	})
}

func TestErrLostIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		k := Start(t.Context(), f, waiting(), now(), opts(now))
		defer k.Stop()

		sleepUntil(now, 1500*time.Millisecond)
		f.set(refuse, 0)
		at := lostAt(t, k, now)
		if at != 2*time.Second {
			t.Errorf("lost at %v, want at once when the store refused at 2s", at)
		}
		if err := k.Err(); !errors.Is(err, store.ErrLost) || errors.Is(err, ErrDeadline) {
			t.Errorf("Err() = %v, want store.ErrLost", err)
		}
		time.Sleep(time.Minute)
		calls := f.log()
		if len(calls) != 2 {
			t.Fatalf("%d calls, want 2: the refusal must not be retried", len(calls))
		}
		if c := calls[1]; c.acked || c.sent != 2*time.Second {
			t.Errorf("last call %+v, want the refused one at 2s", c)
		}
	})
}

func TestTransientOutageShorterThanBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		var logs atomic.Int32
		o := opts(now)
		o.Logf = func(string, ...any) { logs.Add(1) }
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		// The outage starts right after the ack of the renewal sent at 1s
		// and lasts 1.55s < TTL − Every − Margin = 1.7s.
		sleepUntil(now, 1050*time.Millisecond)
		f.set(failing, 0)
		sleepUntil(now, 2600*time.Millisecond)
		f.set(answer, 0)
		sleepUntil(now, 10*time.Second)

		if closed(k.Lost()) {
			t.Fatalf("lost after an outage shorter than the budget: %v", k.Err())
		}
		var failed int
		for _, c := range f.log() {
			if !c.acked {
				failed++
			}
		}
		if failed < 3 {
			t.Errorf("%d failed calls, want the failure retried several times", failed)
		}
		if n := logs.Load(); int(n) != failed {
			t.Errorf("Logf called %d times for %d failures", n, failed)
		}
		calls := f.log()
		last := calls[len(calls)-1]
		if !last.acked || k.Deadline() != last.sent+2700*time.Millisecond {
			t.Errorf("after recovery: last call %+v, Deadline() = %v", last, k.Deadline())
		}
	})
}

func TestTransientOutageLongerThanBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		var logs atomic.Int32
		o := opts(now)
		o.Logf = func(string, ...any) { logs.Add(1) }
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 1050*time.Millisecond)
		f.set(failing, 0)
		deadline := time.Second + 2700*time.Millisecond
		if at := lostAt(t, k, now); !near(at, deadline) {
			t.Errorf("lost at %v, want at the deadline %v", at, deadline)
		}
		err := k.Err()
		if !errors.Is(err, ErrDeadline) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("Err() = %v, want ErrDeadline naming the last failure", err)
		}
		time.Sleep(time.Minute)

		// Retries back off from Every/10, doubling up to Every/2, and none is
		// sent at or past the deadline.
		var gaps []time.Duration
		calls := f.log()
		for i, c := range calls {
			if c.sent >= deadline {
				t.Errorf("call %d sent at %v, past the deadline %v", i, c.sent, deadline)
			}
			if c.budget < 0 || c.sent+c.budget > deadline {
				t.Errorf("call %d at %v had ctx budget %v, beyond the deadline %v", i, c.sent, c.budget, deadline)
			}
			if i >= 2 {
				gaps = append(gaps, c.sent-calls[i-1].sent)
			}
		}
		if got, want := fmt.Sprint(gaps), "[100ms 200ms 400ms 500ms]"; got != want {
			t.Errorf("retry gaps %s, want %s", got, want)
		}
		if n := logs.Load(); n != 5 {
			t.Errorf("Logf called %d times, want 5", n)
		}
	})
}

func TestHungStoreLostAtLocalDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		o := opts(now)
		o.Margin = 0 // default: TTL/10
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 2050*time.Millisecond) // acks sent at 1s and 2s
		f.set(hang, 0)
		const lastAck = 2 * time.Second
		deadline := lastAck + o.TTL - o.TTL/10
		if d := k.Deadline(); d != deadline {
			t.Errorf("Deadline() = %v, want %v", d, deadline)
		}
		at := lostAt(t, k, now)
		if !near(at, deadline) || at >= lastAck+o.TTL {
			t.Errorf("lost at %v, want %v (before the store's expiry at %v)", at, deadline, lastAck+o.TTL)
		}
		if err := k.Err(); !errors.Is(err, ErrDeadline) || errors.Is(err, store.ErrLost) {
			t.Errorf("Err() = %v, want ErrDeadline", err)
		}
		calls := f.log()
		hung := calls[len(calls)-1]
		if hung.sent != 3*time.Second || hung.budget != deadline-hung.sent {
			t.Errorf("hung call %+v: want sent at 3s with ctx budget %v", hung, deadline-hung.sent)
		}
		time.Sleep(time.Minute)
		if n := len(f.log()); n != len(calls) {
			t.Errorf("%d calls after the loss, want none", n-len(calls))
		}
		k.Stop()
		if n := f.busy(); n != 0 {
			t.Errorf("%d calls in flight after Stop", n)
		}
	})
}

// A store call that ignores its ctx must neither delay the verdict nor
// outlive Stop.
func TestStuckCallDoesNotBlockDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		defer f.unstick() // a failed check must not leave the call stuck in the bubble
		k := Start(t.Context(), f, waiting(), now(), opts(now))

		sleepUntil(now, 1050*time.Millisecond)
		f.set(stuck, 0)
		deadline := time.Second + 2700*time.Millisecond
		if at := lostAt(t, k, now); !near(at, deadline) {
			t.Errorf("lost at %v, want %v while the call is stuck", at, deadline)
		}
		if f.busy() != 1 {
			t.Fatalf("want the call still stuck")
		}

		var stopped atomic.Bool
		go func() { k.Stop(); stopped.Store(true) }()
		synctest.Wait()
		if stopped.Load() {
			t.Fatal("Stop returned while a Renew call was in flight")
		}
		f.unstick()
		synctest.Wait()
		if !stopped.Load() || f.busy() != 0 {
			t.Fatalf("after the call returned: stopped = %v, in flight = %d", stopped.Load(), f.busy())
		}
	})
}

// Acks delayed by 0.4·TTL still keep the lease, but the deadline follows the
// send time: once the store stops answering, Lost fires at the last acked
// send + TTL − Margin, not a delay later.
func TestSlowAcksCountFromSendTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		o := opts(now)
		f.set(answer, o.TTL*4/10)
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		// Renewal sent at 1s is acked at 2.2s; the deadline is 1s + 2.7s.
		sleepUntil(now, 2300*time.Millisecond)
		if d, want := k.Deadline(), 3700*time.Millisecond; d != want {
			t.Errorf("Deadline() after a slow ack = %v, want %v (send time + TTL − Margin)", d, want)
		}
		sleepUntil(now, 5*time.Second)
		f.set(hang, 0) // the call sent at 4.6s is still acked at 5.8s
		at := lostAt(t, k, now)

		var lastAck time.Duration
		for _, c := range f.log() {
			if c.acked {
				lastAck = c.sent
			}
		}
		if lastAck != 4600*time.Millisecond {
			t.Fatalf("last acked call sent at %v, want 4.6s", lastAck)
		}
		if want := lastAck + o.TTL - o.Margin; !near(at, want) {
			t.Errorf("lost at %v, want %v = last acked send + TTL − Margin", at, want)
		}
		if !errors.Is(k.Err(), ErrDeadline) {
			t.Errorf("Err() = %v, want ErrDeadline", k.Err())
		}
	})
}

func TestCheckAfterProcessStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, jump := bubbleClock()
		f := newFake(now)
		o := opts(now)
		o.Watchdog = time.Hour // only Check may notice
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 1500*time.Millisecond)
		n := len(f.log())
		jump(10 * time.Second) // stopped for longer than the TTL; nothing ran
		if closed(k.Lost()) {
			t.Fatal("lost before anything looked at the clock")
		}
		k.Check()
		if !closed(k.Lost()) {
			t.Fatal("Check after the stop did not report the loss at once")
		}
		if !errors.Is(k.Err(), ErrDeadline) {
			t.Errorf("Err() = %v, want ErrDeadline", k.Err())
		}
		time.Sleep(time.Minute)
		if m := len(f.log()); m != n {
			t.Errorf("%d renewals after the loss, want none", m-n)
		}
	})
}

// A renewal tick that finds the deadline passed declares the loss instead
// of sending a renewal.
func TestRenewalTickChecksDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, jump := bubbleClock()
		f := newFake(now)
		o := opts(now)
		o.Watchdog = time.Hour
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 1500*time.Millisecond)
		jump(10 * time.Second) // Go timers did not see these 10s
		at := lostAt(t, k, now)
		if want := 12 * time.Second; at != want {
			t.Errorf("lost at %v, want at the next renewal tick (%v)", at, want)
		}
		if calls := f.log(); len(calls) != 1 {
			t.Errorf("%d renewals, want only the one before the jump: none may be sent past the deadline", len(calls))
		}
	})
}

// An ack that returns after the deadline passed does not revive the lease,
// even though its send time would give a later deadline: the check is made
// when the call returns, before the ack is applied.
func TestLateAckDoesNotRevive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, jump := bubbleClock()
		f := newFake(now)
		o := opts(now)
		o.Watchdog = time.Hour
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 1500*time.Millisecond) // acked at 1s: deadline 3.7s
		f.set(answer, 500*time.Millisecond)
		sleepUntil(now, 2200*time.Millisecond) // the call sent at 2s is in flight
		jump(1600 * time.Millisecond)          // now 3.8s: past 3.7s, short of 2s + 2.7s
		at := lostAt(t, k, now)
		if want := 4100 * time.Millisecond; at != want {
			t.Errorf("lost at %v, want %v, when the late ack returned", at, want)
		}
		if !errors.Is(k.Err(), ErrDeadline) {
			t.Errorf("Err() = %v, want ErrDeadline", k.Err())
		}
		if d := k.Deadline(); d != 3700*time.Millisecond {
			t.Errorf("Deadline() = %v: the late ack moved it", d)
		}
	})
}

func TestWatchdogAfterSuspend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, jump := bubbleClock()
		f := newFake(now)
		o := opts(now)
		o.Watchdog = 200 * time.Millisecond
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 1500*time.Millisecond)
		jump(10 * time.Second) // suspended: Now counted on, Go timers did not
		resumed := now()
		at := lostAt(t, k, now)
		if at-resumed > o.Watchdog {
			t.Errorf("loss noticed %v after resume, want within the watchdog period %v", at-resumed, o.Watchdog)
		}
		if !errors.Is(k.Err(), ErrDeadline) {
			t.Errorf("Err() = %v, want ErrDeadline", k.Err())
		}
	})
}

// With WatchdogOnHold a waiting ticket is not checked every watchdog period
// (hundreds of waiters would each wake every second); once held, it is.
func TestWatchdogOnHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, jump := bubbleClock()
		f := newFake(now)
		o := opts(now)
		o.Watchdog = 200 * time.Millisecond
		o.WatchdogOnHold = true
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 1500*time.Millisecond)
		jump(10 * time.Second)             // suspended: Now counted on, Go timers did not
		time.Sleep(300 * time.Millisecond) // past a watchdog period, before the next renewal (at 2s)
		if closed(k.Lost()) {
			t.Fatalf("a waiting ticket was checked by the watchdog before Hold")
		}
		k.Hold()
		held := now()
		at := lostAt(t, k, now)
		if at-held > o.Watchdog {
			t.Errorf("loss noticed %v after Hold, want within the watchdog period %v", at-held, o.Watchdog)
		}
		k.Hold() // idempotent
	})
}

// Hold checks the deadline at once: a suspend during the wait left the
// deadline timer late by as long, and neither the watchdog's first tick
// nor the next renewal may be what finds the lease over.
func TestHoldChecksDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, jump := bubbleClock()
		f := newFake(now)
		o := opts(now)
		o.Watchdog = time.Hour // the watchdog finds nothing here
		o.WatchdogOnHold = true
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()

		sleepUntil(now, 1500*time.Millisecond)
		jump(10 * time.Second) // suspended: Now counted on, Go timers did not
		k.Hold()
		held := now()
		if at := lostAt(t, k, now); at != held {
			t.Errorf("loss noticed %v after Hold, want at Hold", at-held)
		}
	})
}

func TestStopJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		k := Start(t.Context(), f, waiting(), now(), opts(now))

		sleepUntil(now, 2500*time.Millisecond)
		k.Stop()
		n := len(f.log())
		time.Sleep(time.Hour)
		if m := len(f.log()); m != n {
			t.Errorf("%d renewals after Stop", m-n)
		}
		k.Stop() // idempotent
		if closed(k.Lost()) || k.Err() != nil {
			t.Errorf("Stop declared the lease lost: %v", k.Err())
		}
	})
}

func TestStopCancelsHungCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		k := Start(t.Context(), f, waiting(), now(), opts(now))

		sleepUntil(now, 1050*time.Millisecond)
		f.set(hang, 0)
		sleepUntil(now, 2500*time.Millisecond) // the call sent at 2s hangs
		if f.busy() != 1 {
			t.Fatal("want a call in flight")
		}
		before := now()
		k.Stop()
		if after := now(); after != before {
			t.Errorf("Stop waited %v for the hung call instead of cancelling it", after-before)
		}
		if f.busy() != 0 {
			t.Error("call still in flight after Stop")
		}
		n := len(f.log())
		time.Sleep(time.Hour)
		if m := len(f.log()); m != n {
			t.Errorf("%d renewals after Stop", m-n)
		}
	})
}

func TestCancelledContextStillWatchesDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		ctx, cancel := context.WithCancel(t.Context())
		k := Start(ctx, f, waiting(), now(), opts(now))
		defer k.Stop()

		sleepUntil(now, 1500*time.Millisecond)
		cancel()
		if at, want := lostAt(t, k, now), 3700*time.Millisecond; !near(at, want) {
			t.Errorf("lost at %v, want %v", at, want)
		}
		if n := len(f.log()); n != 1 {
			t.Errorf("%d renewals, want only the one before the cancel", n)
		}
	})
}

func TestStartPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		time.Sleep(time.Minute)
		f := newFake(now)
		k := Start(t.Context(), f, waiting(), now()-3*time.Second, opts(now))
		defer k.Stop()
		if !closed(k.Lost()) || !errors.Is(k.Err(), ErrDeadline) {
			t.Errorf("an enqueue older than the TTL: Lost closed = %v, Err = %v", closed(k.Lost()), k.Err())
		}
	})
}

func TestValidate(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		o  Options
		ok bool
	}{
		{Options{TTL: 30 * s}, true},
		{Options{TTL: 3 * s, Every: s, Margin: 300 * time.Millisecond, Jitter: -1}, true},
		{Options{}, false},
		{Options{TTL: -s}, false},
		{Options{TTL: 3 * s, Every: -s}, false},
		{Options{TTL: 3 * s, Margin: 3 * s}, false},
		{Options{TTL: 3 * s, Jitter: 1}, false},
		{Options{TTL: 3 * s, Every: 2 * s}, true},                                // up to 2.4s < 2.7s
		{Options{TTL: 3 * s, Every: 2500 * time.Millisecond}, false},             // up to 3s ≥ 2.7s
		{Options{TTL: 3 * s, Every: 2700 * time.Millisecond, Jitter: -1}, false}, // no slack at all
		{Options{TTL: 3 * s, Watchdog: -s}, false},
	} {
		if err := tc.o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate() = %v, want ok = %v", tc.o, err, tc.ok)
		}
	}
}

// TestWaitEveryUntilHold: a waiting ticket renews every WaitEvery; at Hold
// the period is Every again, counted from the last acknowledged renewal
// (at once when that is past), so that a job starts with a lease renewed
// at the holder's rate. A Keeper that kept WaitEvery after Hold would leave
// the holder a 2.5s gap here, past its window.
func TestWaitEveryUntilHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		o := opts(now) // TTL 3s, Every 1s, no jitter
		o.WaitEvery = 2500 * time.Millisecond
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()
		sleepUntil(now, 6*time.Second) // renewals at 2.5s and 5s
		k.Hold()                       // 1s after the last: due now
		sleepUntil(now, 8500*time.Millisecond)
		var sent []time.Duration
		for _, c := range f.log() {
			sent = append(sent, c.sent)
		}
		if got, want := fmt.Sprint(sent), "[2.5s 5s 6s 7s 8s]"; got != want {
			t.Errorf("renewals sent at %s, want %s", got, want)
		}
		if k.Err() != nil {
			t.Errorf("Err() = %v while alive", k.Err())
		}
	})
}

func TestWaitPeriod(t *testing.T) {
	for _, c := range []struct{ ttl, want time.Duration }{
		{6 * time.Second, 2 * time.Second},   // short: the holder's period
		{30 * time.Second, 15 * time.Second}, // half
		{60 * time.Second, 30 * time.Second},
		{15 * time.Second, 5 * time.Second}, // 10s left for retries at most
	} {
		got := WaitPeriod(c.ttl, c.ttl/3)
		if got != c.want {
			t.Errorf("WaitPeriod(%v) = %v, want %v", c.ttl, got, c.want)
		}
		if err := (Options{TTL: c.ttl, WaitEvery: got}).Validate(); err != nil {
			t.Errorf("WaitPeriod(%v) = %v does not keep the lease: %v", c.ttl, got, err)
		}
	}
}

// TestRenewsHeldOnceHeld: once Hold says a job runs, each renewal names the
// ticket held, whatever the last answer said (a store that has it waiting
// then refuses it); before, it sends the ticket as acknowledged.
func TestRenewsHeldOnceHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now, _ := bubbleClock()
		f := newFake(now)
		o := opts(now) // TTL 3s, Every 1s, no jitter
		k := Start(t.Context(), f, waiting(), now(), o)
		defer k.Stop()
		sleepUntil(now, 1500*time.Millisecond) // a renewal at 1s
		k.Hold()
		sleepUntil(now, 2500*time.Millisecond) // and at 2s
		var states []store.State
		for _, c := range f.log() {
			states = append(states, c.ticket.State)
		}
		if got, want := fmt.Sprint(states), fmt.Sprint([]store.State{store.Waiting, store.Held}); got != want {
			t.Errorf("renewals sent the ticket %s, want %s", got, want)
		}
	})
}
