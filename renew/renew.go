package renew

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// ErrDeadline is the loss the holder decides on its own: the store may
// already have expired the lease, so the job must be treated as unleased.
var ErrDeadline = errors.New("no renewal acknowledged before the local deadline")

// Renewer is the part of store.Store that renew needs.
type Renewer interface {
	Renew(ctx context.Context, t store.Ticket, ttl time.Duration) (store.Ticket, error)
}

// Options configure a Keeper. Only TTL is required.
type Options struct {
	TTL   time.Duration // lease length asked of the store; required, > 0
	Every time.Duration // renewal period; 0 means TTL/3
	// WaitEvery is the renewal period until Hold: a waiting ticket has no
	// job to stop in the margin, so it may renew less often (WaitPeriod);
	// 0 means Every. At Hold the next renewal is due Every after the last
	// acknowledged one (at once if that passed).
	WaitEvery time.Duration
	Jitter    float64       // ± fraction of Every (and of retry backoff); 0 means 0.2, negative means none
	Margin    time.Duration // subtracted from the deadline for clock rate and delivery slack; 0 means TTL/10
	// Watchdog is how often the deadline is checked between renewals; 0
	// means 1s. Go timers stop during suspend, so this bounds how late a
	// loss is noticed after a resume.
	Watchdog time.Duration
	// WatchdogOnHold starts the watchdog only once Hold is called: a waiting
	// ticket is then checked at its renewals and its deadline alone, so that
	// hundreds of queued jobs do not each wake every second for nothing.
	WatchdogOnHold bool
	// Now is a monotonic clock that counts through suspend; nil means
	// proc.Boottime. It is called from several goroutines.
	Now func() time.Duration
	// Rand returns a number in [0,1); nil means math/rand/v2.Float64. It is
	// only called from the renewing goroutine, so a seeded source is fine.
	Rand func() float64
	// OnRenew is called, from the renewing goroutine, with the store's answer
	// to each acknowledged renewal (it shows a waiting ticket becoming held).
	// It must not call Stop.
	OnRenew func(store.Ticket)
	// Logf receives warnings about transient failures; nil discards them.
	Logf func(format string, args ...any)
}

func (o Options) withDefaults() Options {
	if o.Every == 0 {
		o.Every = o.TTL / 3
	}
	if o.WaitEvery == 0 {
		o.WaitEvery = o.Every
	}
	if o.Jitter == 0 {
		o.Jitter = 0.2
	}
	if o.Margin == 0 {
		o.Margin = o.TTL / 10
	}
	if o.Watchdog == 0 {
		o.Watchdog = time.Second
	}
	if o.Now == nil {
		o.Now = proc.Boottime
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// Validate reports options with which no lease could be kept, e.g. a period
// that, jittered, reaches past the deadline. Start panics on them; a caller
// holding user input checks first.
func (o Options) Validate() error {
	if o.TTL <= 0 {
		return fmt.Errorf("renew: ttl %v: want > 0", o.TTL)
	}
	if o.Every < 0 || o.WaitEvery < 0 || o.Margin < 0 || o.Watchdog < 0 {
		return fmt.Errorf("renew: negative period, margin or watchdog (%v, %v, %v, %v)", o.Every, o.WaitEvery, o.Margin, o.Watchdog)
	}
	if o.Jitter >= 1 {
		return fmt.Errorf("renew: jitter %v: want < 1", o.Jitter)
	}
	d := o.withDefaults()
	if d.Margin >= d.TTL {
		return fmt.Errorf("renew: margin %v: want less than the ttl %v", d.Margin, d.TTL)
	}
	for _, every := range []time.Duration{d.Every, d.WaitEvery} {
		longest := every
		if d.Jitter > 0 {
			longest = time.Duration(float64(every) * (1 + d.Jitter))
		}
		if longest >= d.TTL-d.Margin {
			return fmt.Errorf("renew: renewing every %v (up to %v with jitter) cannot keep a %v lease with a %v margin", every, longest, d.TTL, d.Margin)
		}
	}
	return nil
}

// WaitPeriod is a waiting ticket's renewal period for a lease of ttl renewed
// every every once held: half the TTL, at most TTL − 10s (so that, jittered
// and less the margin, most of two request timeouts are left for retries),
// and no less than every. With --ttl 30s a waiter renews every 15s, not
// 10s: idle queues cost a third less (200 idle waiters renew about 13
// times a second instead of 20).
func WaitPeriod(ttl, every time.Duration) time.Duration {
	return max(every, min(ttl-10*time.Second, ttl/2))
}

// A Keeper renews one ticket until Stop or until the lease is presumed lost.
type Keeper struct {
	r        Renewer
	o        Options
	lost     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	hold     chan struct{} // closed by Hold
	holdOnce sync.Once

	stopWatch func() // stops the watchdog's ticker; used by the renewing goroutine only

	mu      sync.Mutex
	ticket  store.Ticket
	lease   Lease // the local deadline
	lastErr error // last transient failure since the last ack
	err     error // set once, with lost closed
}

// A Lease is the holder's side of a lease, as pure arithmetic on a monotonic
// clock: no goroutines, no timers. Its local deadline is the send time of the
// last acknowledged renewal + TTL − Margin. The Keeper keeps one; the
// simulation (internal/testkit/sim) drives one directly, step by step, so that its
// holders decide loss with this same code.
type Lease struct {
	ttl, margin time.Duration
	sent        time.Duration // send time of the last acknowledged renewal
	deadline    time.Duration // sent + ttl − margin
}

// NewLease starts a lease whose first write (the enqueue, which counts as the
// first acknowledged renewal) was sent at sent.
func NewLease(sent, ttl, margin time.Duration) Lease {
	return Lease{ttl: ttl, margin: margin, sent: sent, deadline: sent + ttl - margin}
}

// Expiry is the earliest moment the store could judge the lease expired:
// Sent + TTL, the local deadline + Margin. A job stopped on loss must be
// gone by then.
func (l Lease) Expiry() time.Duration { return l.sent + l.ttl }

// Sent is the send time of the last acknowledged renewal.
func (l Lease) Sent() time.Duration { return l.sent }

// Deadline is the local deadline: Sent + TTL − Margin.
func (l Lease) Deadline() time.Duration { return l.deadline }

// Expired reports whether the lease must be presumed lost at now: now is at
// or past the deadline.
func (l Lease) Expired(now time.Duration) bool { return now >= l.deadline }

// Acked records the acknowledgement, received at now, of a renewal sent at
// sent. An ack that arrives once the lease has expired changes nothing and
// reports false: the holder may already have been told it is lost, and that
// verdict is final. Otherwise the deadline moves to sent + TTL − Margin and
// Acked reports whether the lease is alive at now (the ack itself may have
// taken longer than TTL − Margin).
func (l *Lease) Acked(sent, now time.Duration) bool {
	if l.Expired(now) {
		return false
	}
	l.sent, l.deadline = sent, sent+l.ttl-l.margin
	return !l.Expired(now)
}

// Start begins renewing t at once in a goroutine. sentAt is the Now() reading
// taken just before the write that created t was sent: that write counts as
// the first acknowledged renewal, so the next one is due a period after it.
//
// Cancelling ctx stops renewing but not the deadline watch: Lost still fires
// when the lease runs out. Call Stop in any case to join. Start panics on
// options that fail Validate.
func Start(ctx context.Context, r Renewer, t store.Ticket, sentAt time.Duration, opts Options) *Keeper {
	if err := opts.Validate(); err != nil {
		panic(err.Error())
	}
	o := opts.withDefaults()
	k := &Keeper{
		r:      r,
		o:      o,
		lost:   make(chan struct{}),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		hold:   make(chan struct{}),
		ticket: t,
		lease:  NewLease(sentAt, o.TTL, o.Margin),
	}
	k.expired(o.Now()) // a slow enqueue may have used up the lease already
	go k.run(ctx)
	return k
}

// Lost is closed once the lease is presumed lost. The verdict is final.
func (k *Keeper) Lost() <-chan struct{} { return k.lost }

// Err is nil while the lease is alive. After Lost it wraps store.ErrLost
// (the store refused the renewal) or ErrDeadline (no ack in time).
func (k *Keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Deadline is the local deadline on the Now clock: the send time of the last
// acknowledged renewal + TTL − Margin.
func (k *Keeper) Deadline() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease.Deadline()
}

// Expiry is the earliest moment, on the Now clock, the store could judge
// the lease expired: the send time of the last acknowledged renewal + TTL.
func (k *Keeper) Expiry() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease.Expiry()
}

// Ticket is the latest ticket the store returned (t until the first ack).
func (k *Keeper) Ticket() store.Ticket {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ticket
}

// Check checks the local deadline now, in the caller's goroutine, so that
// after a process stop (SIGCONT) the loss is known before the job runs on.
func (k *Keeper) Check() { k.expired(k.o.Now()) }

// Hold tells the Keeper that the ticket is held and a job runs: with
// WatchdogOnHold, the watchdog starts now, and each renewal says the
// ticket is held (a store that no longer holds it refuses the renewal).
// Idempotent.
func (k *Keeper) Hold() { k.holdOnce.Do(func() { close(k.hold) }) }

// Stop stops renewing and waits until the renewing goroutine and any store
// call have returned; the caller may release the ticket after it. It cancels
// an in-flight call's context but waits for the call even if it ignores that.
// Stop is idempotent and does not close Lost.
func (k *Keeper) Stop() {
	k.stopOnce.Do(func() { close(k.stop) })
	<-k.done
}

// expired declares the lease lost if now is at or past the deadline, and
// reports whether it is lost.
func (k *Keeper) expired(now time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.expiredLocked(now)
}

func (k *Keeper) expiredLocked(now time.Duration) bool {
	if k.err == nil && k.lease.Expired(now) {
		err := fmt.Errorf("%w: last acknowledged renewal sent %v ago (ttl %v, margin %v)",
			ErrDeadline, (now - k.lease.Sent()).Round(time.Millisecond), k.o.TTL, k.o.Margin)
		if k.lastErr != nil {
			err = fmt.Errorf("%w; last error: %v", err, k.lastErr)
		}
		k.loseLocked(err)
	}
	return k.err != nil
}

func (k *Keeper) lose(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.loseLocked(err)
}

func (k *Keeper) loseLocked(err error) {
	if k.err == nil {
		k.err = err
		close(k.lost)
	}
}

// ack records a renewal sent at sent and acknowledged at now. An ack that
// arrives after the deadline does not revive the lease: the holder may
// already have been told it is lost, and the verdict is final.
func (k *Keeper) ack(t store.Ticket, sent, now time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.expiredLocked(now) {
		return false
	}
	k.lease.Acked(sent, now)
	k.ticket = t
	k.lastErr = nil
	return !k.expiredLocked(now) // the ack itself may have taken longer than TTL − Margin
}

// jitter spreads d uniformly over d·(1 ± Jitter).
func (k *Keeper) jitter(d time.Duration) time.Duration {
	if k.o.Jitter <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 + k.o.Jitter*(2*k.o.Rand()-1)))
}

// backoff is the delay before retry n (1-based), jittered.
func (k *Keeper) backoff(n int) time.Duration { return k.jitter(RetryDelay(k.o.Every, n)) }

// RetryDelay is the delay before retry n (1-based) of a failed renewal with
// renewal period every, before jitter: doubling from every/10 (at least
// 100ms), capped at every/2. The simulation (internal/testkit/sim) uses it too.
func RetryDelay(every time.Duration, n int) time.Duration {
	cap := every / 2
	d := min(max(every/10, 100*time.Millisecond), cap)
	for i := 1; i < n && d < cap; i++ {
		d *= 2
	}
	return min(d, cap)
}

type result struct {
	t    store.Ticket
	err  error
	sent time.Duration
}

// run is the renewing goroutine. It waits on the store call, the next
// renewal, the deadline timer and the watchdog at once, so that no one of
// them can hold up the deadline decision.
func (k *Keeper) run(ctx context.Context) {
	defer close(k.done)

	l := &renewLoop{k: k, ctx: ctx, results: make(chan result, 1), cancelCall: func() {}}
	defer l.drain()

	now := k.o.Now()
	k.mu.Lock()
	l.every = k.o.WaitEvery // until Hold
	first, deadline := k.lease.Sent()+k.jitter(l.every), k.lease.Deadline()
	k.mu.Unlock()
	l.next = time.NewTimer(max(first-now, 0))
	defer l.next.Stop()
	l.deadT = time.NewTimer(max(deadline-now, 0))
	defer l.deadT.Stop()
	l.holdC = k.hold
	if !k.o.WatchdogOnHold {
		l.startWatch()
	}
	defer func() {
		if k.stopWatch != nil {
			k.stopWatch()
		}
	}()

	l.ctxDone = ctx.Done() // nil once cancelled, and for a context that never is
	l.renewing = true
	for {
		select {
		case <-k.stop:
			return
		case <-k.lost: // Check found it lost
			return
		case <-l.ctxDone:
			l.ctxDone, l.renewing = nil, false
			l.next.Stop() // renew no more; keep watching the deadline
			continue
		case <-l.holdC:
			if l.held() {
				return
			}
			continue
		case <-l.watchC:
		case <-l.deadT.C:
		case <-l.next.C:
			if l.send() {
				return
			}
			continue
		case res := <-l.results:
			if l.answered(res) {
				return
			}
			continue
		}
		// A timer fired: the watchdog, or the deadline timer (which may be
		// early if Now runs slower than Go's timers).
		now := k.o.Now()
		if k.expired(now) {
			return
		}
		l.deadT.Reset(max(k.Deadline()-now, 0))
	}
}

// renewLoop is the state of the renewing goroutine's loop: its timers, the
// store call in flight and what it still watches. Its own type so that
// each case of the loop's select is a method of its own.
type renewLoop struct {
	k   *Keeper
	ctx context.Context
	// results carries the answer of the call in flight (inflight), whose
	// context cancelCall cancels.
	results    chan result
	inflight   bool
	cancelCall context.CancelFunc
	every      time.Duration    // the renewal period: WaitEvery until Hold, then Every
	next       *time.Timer      // the next renewal, or retry
	deadT      *time.Timer      // the local deadline
	watchC     <-chan time.Time // the watchdog: nil until it runs
	holdC      <-chan struct{}  // Hold: nil once it came
	ctxDone    <-chan struct{}  // nil once cancelled, and for a context that never is
	renewing   bool             // false once ctx is cancelled: the deadline is still watched
	failures   int              // failed renewals since the last ack
}

// drain cancels the call in flight and waits for it: drain before
// release, Stop returns only after the call does.
func (l *renewLoop) drain() {
	l.cancelCall()
	if l.inflight {
		<-l.results
	}
}

// startWatch starts the watchdog, which checks the deadline between
// renewals (Go timers stop during suspend).
func (l *renewLoop) startWatch() {
	w := time.NewTicker(l.k.o.Watchdog)
	l.watchC = w.C
	l.k.stopWatch = w.Stop
}

// held switches to the held ticket's watch and period on Hold: the
// watchdog starts (WatchdogOnHold), and the next renewal is due Every
// after the last acknowledged one. The deadline is checked and its timer
// set anew from Now: a suspend during the wait left the timer late by as
// long (Go timers stop), and the job's lease must end on time, not at the
// watchdog's first tick. It reports whether the goroutine ends.
func (l *renewLoop) held() bool {
	k := l.k
	l.holdC = nil
	now := k.o.Now()
	if k.expired(now) {
		return true
	}
	l.deadT.Reset(max(k.Deadline()-now, 0))
	if k.o.WatchdogOnHold {
		l.startWatch()
	}
	if l.every != k.o.Every {
		l.every = k.o.Every
		if l.renewing && !l.inflight {
			k.mu.Lock()
			due := k.lease.Sent() + k.jitter(l.every)
			k.mu.Unlock()
			l.next.Reset(max(due-now, 0))
		}
	}
	return false
}

// send sends a renewal that came due, bounded by what is left of the
// lease, unless the lease is lost or the Keeper stopped. It reports
// whether the goroutine ends.
func (l *renewLoop) send() bool {
	k := l.k
	sent := k.o.Now()
	if k.expired(sent) {
		return true
	}
	select {
	case <-k.stop:
		return true
	default:
	}
	if l.ctx.Err() != nil {
		return false // the ctxDone case stops renewing
	}
	k.mu.Lock()
	t, left := k.ticket, k.lease.Deadline()-sent
	k.mu.Unlock()
	select {
	case <-k.hold:
		// Its job runs: it renews a held ticket, and a store that has it
		// waiting (a file replaced by an older copy) answers lost.
		t.State = store.Held
	default:
	}
	callCtx, cancel := context.WithTimeout(l.ctx, left)
	l.cancelCall, l.inflight = cancel, true
	go func() {
		nt, err := k.r.Renew(callCtx, t, k.o.TTL)
		l.results <- result{nt, err, sent}
	}()
	return false
}

// answered acts on the store's answer to a renewal: an ack moves the
// deadline on, a refusal loses the lease, any other failure is retried.
// It reports whether the goroutine ends.
func (l *renewLoop) answered(res result) bool {
	k := l.k
	l.inflight = false
	l.cancelCall()
	now := k.o.Now()
	switch {
	case res.err == nil:
		return l.acked(res, now)
	case errors.Is(res.err, store.ErrLost):
		k.lose(fmt.Errorf("store refused the renewal: %w", res.err))
		return true
	default:
		return l.failed(res.err, now)
	}
}

// acked records an acknowledged renewal, received at now, and sets the
// next renewal and the deadline timer from it. It reports whether the
// goroutine ends: an ack past the deadline does not revive the lease.
func (l *renewLoop) acked(res result, now time.Duration) bool {
	k := l.k
	if !k.ack(res.t, res.sent, now) {
		return true
	}
	l.failures = 0
	if k.o.OnRenew != nil {
		k.o.OnRenew(res.t)
	}
	now = k.o.Now()
	if l.renewing {
		l.next.Reset(max(res.sent+k.jitter(l.every)-now, 0))
	}
	l.deadT.Reset(max(k.Deadline()-now, 0))
	return false
}

// failed handles a transient failure of a renewal, answered at now: it is
// retried after a backoff while the lease lasts. It reports whether the
// goroutine ends.
func (l *renewLoop) failed(err error, now time.Duration) bool {
	k := l.k
	if k.expired(now) {
		return true
	}
	if !l.renewing || l.ctx.Err() != nil {
		return false // ctx cancelled: the failure is ours, not the store's
	}
	l.failures++
	k.mu.Lock()
	k.lastErr = err
	left := k.lease.Deadline() - now
	k.mu.Unlock()
	d := k.backoff(l.failures)
	k.o.Logf("renew: ticket %s: %v; retry %d in %v (lease presumed lost in %v)",
		k.Ticket().ID, err, l.failures, d.Round(time.Millisecond), left.Round(time.Millisecond))
	l.next.Reset(d)
	return false
}
