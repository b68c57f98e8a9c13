package gate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/slotctl/slotctl/store"
)

// DefaultPoll is the fallback poll period of a waiter (jittered ±20%): it
// only matters when a wake-up was lost, e.g. its promoter died between
// commit and ring.
const DefaultPoll = 5 * time.Second

// DefaultQuietPoll is the fallback poll period of a quiet waiter (not yet in
// line, docs/leases.md rule 17), jittered ±20%: its bell says when it comes
// into line, and hundreds of them must cost next to nothing while they wait.
const DefaultQuietPoll = 5 * time.Minute

// ErrBusy is returned by Wait when the ticket was not admitted in time.
var ErrBusy = errors.New("not admitted in time")

// Store is the part of store.Store that a Gate needs.
type Store interface {
	Watch(ctx context.Context, id string) (store.Bell, error)
	Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error)
	Get(ctx context.Context, id string) (store.Ticket, error)
	Release(ctx context.Context, t store.Ticket, why store.Reason) (bool, error)
	Cancel(ctx context.Context, t store.Ticket) (bool, error)
	Reap(ctx context.Context, o store.ReapOptions) ([]store.Removal, error)
	Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error)
}

// Gate admits jobs through one store.
type Gate struct {
	Store Store
	// PollEvery is the fallback poll period; 0 means DefaultPoll.
	PollEvery time.Duration
	// QuietPollEvery is a quiet waiter's; 0 means DefaultQuietPoll.
	QuietPollEvery time.Duration
	// Rand returns numbers in [0,1) for jitter; nil means math/rand/v2.
	Rand func() float64
	// WatchHolders, if set, watches the holders that the head of a queue
	// waits for (proc.WatchHolders: their supervisors' pidfds): died closes
	// when one of them has died, and the head sweeps at once instead of at
	// that holder's expiry. nil: the expiry alone.
	WatchHolders func(holders []store.Ticket) (died <-chan struct{}, stop func())
	// JoinAgain, if set, is asked after Join's write lost its answer
	// (store.ErrUnknownOutcome: an election, a member stalled) whether to
	// write the same ticket again: the store finds the ticket if the lost
	// write made it. nil, or false, and Join fails.
	JoinAgain func(err error) bool
}

// NewID mints a ticket id: 128 random bits in hex. It is minted before the
// ticket is written, so a retried write is idempotent and a cancel can
// tombstone an id whose create is still in flight.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// An Entry is one ticket in a limit's queue, from Join until Leave or Close.
type Entry struct {
	g     *Gate
	bell  store.Bell
	t     store.Ticket
	nudge chan struct{}

	watchMu   sync.Mutex
	stopWatch func() // the holders' watch, if any
}

// Join puts a ticket for req in its limit's queue. The bell is made before
// the ticket is written, so a promotion right after the write is not missed.
// If the write's outcome is unknown (an error after it may have committed)
// and JoinAgain does not send it again, Join cancels req.ID, which also
// refuses the write if it lands later.
func (g *Gate) Join(ctx context.Context, req store.EnqueueRequest) (*Entry, error) {
	bell, err := g.Store.Watch(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	t, err := g.Store.Enqueue(ctx, req)
	for errors.Is(err, store.ErrUnknownOutcome) && g.JoinAgain != nil && g.JoinAgain(err) {
		t, err = g.Store.Enqueue(ctx, req)
	}
	if err != nil {
		bell.Close()
		if !isRefusal(err) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			_, _ = g.Store.Cancel(cctx, store.Ticket{ID: req.ID})
		}
		return nil, err
	}
	return &Entry{g: g, bell: bell, t: t, nudge: make(chan struct{}, 1)}, nil
}

// isRefusal tells an answer that certainly wrote nothing.
func isRefusal(err error) bool {
	var conflict *store.SlotsConflictError
	var busy *store.LockTimeoutError // the lock was never taken: nothing written
	return errors.As(err, &conflict) || errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrRemoved) ||
		errors.Is(err, store.ErrQueueFull) || // --max-waiting: a full queue writes nothing, so its id needs no tombstone
		errors.As(err, &busy)
}

// Nudge makes Wait read the ticket now, as a ring of its bell does. A caller
// that renews the waiting ticket nudges when a renewal's answer shows it
// held: a ring lost to a promoter that died after its commit then costs one
// renewal period, and the fallback poll can be slow. Safe from any goroutine.
func (e *Entry) Nudge() {
	select {
	case e.nudge <- struct{}{}:
	default:
	}
}

// Ticket is the entry's ticket as last read.
func (e *Entry) Ticket() store.Ticket { return e.t }

// Wait sleeps until the ticket is held and returns it. timeout < 0 waits
// without bound; 0 does not wait. Not admitted in time, it returns ErrBusy
// and the ticket is still in the queue: call Leave. A ticket removed while
// waiting (it expired, an operator released it) returns an error wrapping
// store.ErrLost. update, if not nil, sees each fresh read of the ticket.
//
// Wait is built from the steps a caller that waits on more (package
// gate/holder) uses on its own: Bell, Nudged, PollPeriod, Expiry, Sweep and
// Refresh.
func (e *Entry) Wait(ctx context.Context, timeout time.Duration, update func(store.Ticket)) (store.Ticket, error) {
	var deadline <-chan time.Time
	if timeout >= 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		deadline = tm.C
	}
	poll := time.NewTimer(e.PollPeriod())
	defer poll.Stop()
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	defer expiry.Stop()
	for {
		if e.t.State == store.Held {
			return e.t, nil
		}
		if timeout == 0 {
			return e.t, ErrBusy
		}
		if d, ok := e.Expiry(ctx); ok {
			expiry.Reset(d)
		}
		select {
		case <-ctx.Done():
			return e.t, context.Cause(ctx)
		case <-deadline:
			return e.LastLook(ctx)
		case <-e.bell.C():
		case <-e.nudge:
		case <-poll.C:
			poll.Reset(e.PollPeriod())
		case <-expiry.C:
			e.Sweep(ctx)
		}
		t, err := e.Refresh(ctx)
		switch {
		case errors.Is(err, store.ErrLost):
			return t, err
		case err != nil:
			continue // transient: the next poll tries again; the renewer judges the lease
		}
		if update != nil {
			update(t)
		}
	}
}

// Bell is the channel the entry's bell rings on: the ticket changed.
func (e *Entry) Bell() <-chan struct{} { return e.bell.C() }

// Nudged receives the wake-ups of Nudge.
func (e *Entry) Nudged() <-chan struct{} { return e.nudge }

// Refresh reads the ticket once. A ticket that is gone returns an error
// wrapping store.ErrLost; any other error is transient and leaves the
// entry's ticket as it was.
func (e *Entry) Refresh(ctx context.Context) (store.Ticket, error) {
	t, err := e.g.Store.Get(ctx, e.t.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return e.t, fmt.Errorf("%w: %w", store.ErrLost, err)
	case err != nil:
		return e.t, err
	}
	e.t = t
	if t.State == store.Held {
		e.unwatch()
	}
	return t, nil
}

// Saw takes t, an answer of the store about the entry's ticket that the
// caller read by other means (a renewal), as the entry's ticket, and
// returns it.
func (e *Entry) Saw(t store.Ticket) store.Ticket {
	e.t = t
	return t
}

// LastLook is the read at the end of a bounded wait: the promotion may have
// landed with the deadline. Not held, it returns ErrBusy.
func (e *Entry) LastLook(ctx context.Context) (store.Ticket, error) {
	if t, err := e.g.Store.Get(ctx, e.t.ID); err == nil && t.State == store.Held {
		e.t = t
		return t, nil
	}
	return e.t, ErrBusy
}

// Sweep reaps the entry's limits: the first holder's lease ran out, so sweep
// now rather than at the next write, and a dead holder's slot comes back
// within its TTL. A ticket of several limits sweeps all of them: the holder
// that blocks it may be in any (docs/leases.md §2.1 item 9).
func (e *Entry) Sweep(ctx context.Context) {
	_, _ = e.g.Store.Reap(ctx, store.ReapOptions{Limits: e.t.Names()})
}

// Expiry is how long to sleep before Sweep, when this ticket is next in
// line: until the first holder's lease runs out, or a spent rate's window
// opens (HeadExpiry). Only the head of the queue watches, so a long queue
// costs one read per wake-up, not one per waiter. ok is false when there is
// nothing to watch.
//
// A ticket of several limits may be the first waiter in one of them and not
// in its first (Position counts its first limit only), so it reads all of
// its limits and watches the holders of those it heads (TicketExpiry).
func (e *Entry) Expiry(ctx context.Context) (time.Duration, bool) {
	if len(e.t.Limits) > 1 {
		snap, err := e.g.Store.Snapshot(ctx, e.t.Names()...)
		if err != nil {
			return 0, false
		}
		in := headsOf(snap, e.t)
		e.watch(held(snap, in))
		return headExpiry(snap, in)
	}
	if e.t.Position != 1 {
		return 0, false
	}
	snap, err := e.g.Store.Snapshot(ctx, e.t.Limit)
	if err != nil {
		return 0, false
	}
	e.watch(held(snap, func(string) bool { return true }))
	return HeadExpiry(snap)
}

// held is the held tickets of snap in the limits in.
func held(snap store.Snapshot, in func(limit string) bool) []store.Ticket {
	var out []store.Ticket
	for _, t := range snap.Tickets {
		if t.State == store.Held && in(t.Limit) {
			out = append(out, t)
		}
	}
	return out
}

// deathSweeps are when the head sweeps after a holder died: its guard may
// still be killing the job, and the judge waits for the last process.
var deathSweeps = []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}

// watch replaces the watch of the holders the entry waits for.
func (e *Entry) watch(holders []store.Ticket) {
	e.unwatch()
	if e.g.WatchHolders == nil || len(holders) == 0 {
		return
	}
	died, stop := e.g.WatchHolders(holders)
	done := make(chan struct{})
	var once sync.Once
	e.watchMu.Lock()
	e.stopWatch = func() { once.Do(func() { stop(); close(done) }) }
	e.watchMu.Unlock()
	names := e.t.Names()
	go func() {
		select {
		case <-died:
		case <-done:
			return
		}
		for _, d := range deathSweeps {
			select {
			case <-done:
				return
			case <-time.After(d):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			removed, _ := e.g.Store.Reap(ctx, store.ReapOptions{Limits: names})
			cancel()
			if len(removed) > 0 {
				e.Nudge()
				return
			}
		}
	}()
}

func (e *Entry) unwatch() {
	e.watchMu.Lock()
	stop := e.stopWatch
	e.stopWatch = nil
	e.watchMu.Unlock()
	if stop != nil {
		stop()
	}
}

// HeadExpiry is how long the head of a limit's queue sleeps before it sweeps
// the limit: until the first holder's lease in snap runs out or, for a
// limit whose rate is spent, its window opens (store.Limit.Opens), whichever
// comes first. The sweep is a settle, which admits the head once the rate
// allows: a waiter that renews nothing (a quiet bbolt waiter) or a limit
// nobody holds would otherwise wait for its next poll. ok is false when snap
// has neither. A few ms past the deadline, so that the store's clock agrees
// it passed; no sooner than 50 ms after one already past, so that a sweep
// that failed (a locked store) is not retried in a hot loop.
func HeadExpiry(snap store.Snapshot) (d time.Duration, ok bool) {
	return headExpiry(snap, func(string) bool { return true })
}

// TicketExpiry is HeadExpiry for waiting ticket t over a snapshot of its
// limits: only the holders of the limits in which t is the first waiter
// count, since in the others an older waiter watches. ok is false when t
// heads no limit that has a holder.
func TicketExpiry(snap store.Snapshot, t store.Ticket) (time.Duration, bool) {
	return headExpiry(snap, headsOf(snap, t))
}

// headsOf is the limits in which waiting ticket t is the first waiter.
func headsOf(snap store.Snapshot, t store.Ticket) func(limit string) bool {
	heads := map[string]bool{}
	for _, u := range snap.Tickets {
		if u.ID == t.ID && u.State == store.Waiting && u.Position == 1 {
			heads[u.Limit] = true // Position counts the waiters of the limit it is listed under
		}
	}
	return func(limit string) bool { return heads[limit] }
}

func headExpiry(snap store.Snapshot, in func(limit string) bool) (d time.Duration, ok bool) {
	first, found := time.Duration(0), false
	for _, t := range snap.Tickets {
		if t.State == store.Held && in(t.Limit) && (!found || t.Remaining < first) {
			first, found = t.Remaining, true
		}
	}
	for _, l := range snap.Limits {
		if l.Opens.IsZero() || !in(l.Name) {
			continue
		}
		if opens := l.Opens.Sub(snap.Now); !found || opens < first {
			first, found = opens, true
		}
	}
	if !found {
		return 0, false
	}
	if first <= 0 {
		first = 50 * time.Millisecond
	}
	return first + 5*time.Millisecond, true
}

// PollPeriod is the fallback poll period, jittered ±20%: a quiet waiter's
// while its ticket is quiet.
func (e *Entry) PollPeriod() time.Duration {
	p := e.g.PollEvery
	if p <= 0 {
		p = DefaultPoll
	}
	if e.t.Quiet {
		p = e.g.QuietPollEvery
		if p <= 0 {
			p = DefaultQuietPoll
		}
	}
	r := e.g.Rand
	if r == nil {
		r = mrand.Float64
	}
	return time.Duration(float64(p) * (0.8 + 0.4*r()))
}

// Leave removes the ticket, held or still waiting (compare-and-delete: a
// ticket already gone, or replaced, is left alone), and closes the bell. It
// reports whether this call removed the ticket. Leaving as store.Cancelled
// is Cancel.
func (e *Entry) Leave(ctx context.Context, why store.Reason) (bool, error) {
	if why == store.Cancelled {
		return e.Cancel(ctx)
	}
	e.Close()
	return e.g.Store.Release(ctx, e.t, why)
}

// Cancel gives up the ticket before its job ran (store.Store.Cancel: a
// ticket promoted meanwhile is removed as cancelled too) and closes the
// bell. It reports whether this call removed the ticket.
func (e *Entry) Cancel(ctx context.Context) (bool, error) {
	e.Close()
	return e.g.Store.Cancel(ctx, e.t)
}

// Close stops listening for wake-ups; the ticket stays. Idempotent.
func (e *Entry) Close() {
	e.unwatch()
	e.bell.Close()
}
