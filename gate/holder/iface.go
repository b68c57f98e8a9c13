package holder

import (
	"context"
	"os"
	"syscall"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
)

// Store is the part of store.Store the holder needs: the gate's, renewals,
// and recording the job's process group.
type Store interface {
	gate.Store
	renew.Renewer
	SetChild(ctx context.Context, t store.Ticket, pgid int, pgidStart uint64) (store.Ticket, error)
}

// A Child is the running job.
type Child interface {
	// Exited is closed once the job's own process (its command) has exited.
	Exited() <-chan struct{}
	// Gone is closed once nothing of the job is left: its command and every
	// process descended from it, in whatever group or session.
	Gone() <-chan struct{}
	// Signal sends s to the whole job.
	Signal(s syscall.Signal)
	// Foreground reports whether the job shares the supervisor's group on a
	// terminal: the terminal then delivers Ctrl-C and Ctrl-\ to it itself.
	Foreground() bool
	// Group is the process group a reaper can prove the job gone by, and
	// its start time; ok is false when there is none to record.
	Group() (pgid int, start uint64, ok bool)
	// Exit is the job's status, after Exited.
	Exit() (Exit, error)
	// Close is called once, when the holder is done with the job: after
	// Gone, or after giving up on it.
	Close()
	// Lease says that the job's lease is kept until stopIn from now at
	// least: if no later Lease comes by then, the job is to be stopped
	// (SIGTERM) without the supervisor, and SIGKILLed at killIn, so that a
	// stopped or hung supervisor does not leave its job running past its
	// lease. Safe from any goroutine.
	Lease(stopIn, killIn time.Duration)
}

// Exit is how the job's process ended.
type Exit struct {
	Code   int            // its exit status, when it exited
	Signal syscall.Signal // the signal that killed it, or 0
}

// A Starter starts the job of ticket t. ctx is cancelled, with a cause
// wrapping store.ErrLost, when the lease is lost.
type Starter func(ctx context.Context, t store.Ticket) (Child, error)

// A Lease keeps the ticket's lease; *renew.Keeper is one.
type Lease interface {
	Lost() <-chan struct{}
	Err() error
	Deadline() time.Duration
	Expiry() time.Duration
	Hold()
	Check()
	Stop()
}

var _ Lease = (*renew.Keeper)(nil)

// NewLease starts renewing t, whose first write was sent at sent. onRenew
// sees each acknowledged renewal.
type NewLease func(t store.Ticket, sent time.Duration, onRenew func(store.Ticket)) Lease

// EventKind is what ended a Wait.
type EventKind int

// The events a Waiter returns.
const (
	Timer  EventKind = iota // the clock reached Wake.At
	Done                    // Wake.Done is closed
	Lost                    // Wake.Lost is closed
	Exited                  // Wake.Exited is closed
	Bell                    // Wake.Bell rang
	Nudge                   // Wake.Nudge fired
	Signal                  // a signal arrived (Event.Signal)
)

// An Event is what a Wait returned.
type Event struct {
	Kind   EventKind
	Signal os.Signal
}

// A Wake is what the holder waits for: the first of these.
type Wake struct {
	At     time.Duration // a moment on the holder's clock; 0 means none
	Done   <-chan struct{}
	Lost   <-chan struct{}
	Exited <-chan struct{}
	Bell   <-chan struct{}
	Nudge  <-chan struct{}
}

// A Waiter is where the holder blocks, and the only place: the real one
// selects on the channels, the signals and a timer; the simulation's hands
// control back to its scheduler and returns the event it chooses.
type Waiter interface {
	Wait(w Wake) Event
}

// RealWaiter waits on the channels of a Wake, the signals and a timer.
type RealWaiter struct {
	Now     func() time.Duration
	Signals <-chan os.Signal
}

// Wait implements Waiter.
func (r RealWaiter) Wait(w Wake) Event {
	var tc <-chan time.Time
	if w.At != 0 {
		d := w.At - r.Now()
		if d <= 0 {
			return Event{Kind: Timer}
		}
		t := time.NewTimer(d)
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-tc:
		return Event{Kind: Timer}
	case <-w.Done:
		return Event{Kind: Done}
	case <-w.Lost:
		return Event{Kind: Lost}
	case <-w.Exited:
		return Event{Kind: Exited}
	case <-w.Bell:
		return Event{Kind: Bell}
	case <-w.Nudge:
		return Event{Kind: Nudge}
	case s := <-r.Signals:
		return Event{Kind: Signal, Signal: s}
	}
}
