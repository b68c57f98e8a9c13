package policy

import (
	"context"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// A Tx is one atomic step over a backend's state: every read sees one
// state, the step's own writes included, and the writes commit together or
// not at all. The records it returns are checked (Rec.Check and the like);
// one it cannot read wraps store.ErrCorrupt.
type Tx interface {
	// Now is the store's clock, read once for the step.
	Now() Instant
	// PreviousBoot reports whether boot is a boot of the store's clock that
	// has ended (a host-local store after a reboot); a lease of an ended
	// boot is over.
	PreviousBoot(boot string) bool

	// LimitNames is every limit's name, sorted.
	LimitNames() ([]string, error)
	Limit(name string) (LimitRec, bool, error)
	PutLimit(name string, l LimitRec) error
	// DeleteLimit removes a limit and its counters (its tickets are gone).
	DeleteLimit(name string) error

	// Queue is the tickets naming limit, in fence order.
	Queue(limit string) ([]Rec, error)
	// Lookup finds a live ticket by id.
	Lookup(id string) (Rec, bool, error)
	// Put writes a ticket, new or changed, under every limit it names.
	Put(r Rec) error
	// Delete removes a live ticket.
	Delete(r Rec) error
	// NextFence issues the next fence: greater than every one issued.
	NextFence() (uint64, error)

	Tomb(id string) (Tomb, bool, error)
	// PutTomb remembers a removed id; the backend may forget old ones (a
	// day, or past its bound).
	PutTomb(id string, t Tomb) error

	// Log appends an event (the backend numbers it and keeps the newest
	// store.MaxEvents).
	Log(e store.Event) error
	// Counts reads a limit's counters (zero when none were written).
	Counts(limit string) (store.Counts, error)
	PutCounts(c store.Counts) error

	// Ring asks the backend to wake r's waiter once the step commits.
	Ring(r Rec)
	// Gone tells the backend that r was removed: its bell rings after the
	// commit and may then be dropped.
	Gone(r Rec)
}

// A Bounded is a Tx whose backend bounds what one step may write (etcd:
// one transaction of at most 128 operations). Fits reports whether the
// step has room for one more removal or admission of r. A settle without
// room stops there, commits what it did (its removals before the
// admissions that rest on them), and the store settles again in the next
// step.
type Bounded interface {
	Fits(r Rec) bool
}

// A Positioner is a Tx that counts a waiter's place in line (1-based,
// among its first limit's waiters) without reading the whole queue.
type Positioner interface {
	Position(r Rec) (int, error)
}

// A HeadQueuer is a Tx that reads the head of a queue without decoding the
// waiters behind it (store.HeadReader's cost does not grow with the queue).
type HeadQueuer interface {
	// QueueHeads is limit's held tickets and its oldest waiting one, in
	// fence order, and how many of its tickets wait.
	QueueHeads(limit string) (heads []Rec, waiting int, err error)
}

// A Settler is a Tx that tells, more cheaply than a settle, that a settle
// of limits would change nothing: a waiter's renewal asks it first, since
// hundreds of waiters renew a full limit all the time.
type Settler interface {
	Settled(limits []string) (bool, error)
}

// A Sharer is a Backend that can also run shared steps: a shared step
// excludes every Update but not other shared steps, and writes nothing but
// one ticket's renewal. Renewals are the store's most frequent writes; as
// shared steps they do not queue behind each other on a slow client, where
// a step holding the one lock may wait for the CPU for a long time.
type Sharer interface {
	UpdateShared(ctx context.Context, fn func(Tx) error) error
}

// A Backend is what a store supplies beneath the rules.
type Backend interface {
	// Update runs fn as one atomic step and commits what it wrote, or
	// nothing if fn fails. A backend that retries a step on a conflict runs
	// fn again from the start. An error that wraps store.ErrUnknownOutcome says
	// the commit may have taken effect.
	Update(ctx context.Context, fn func(Tx) error) error
	// View runs fn on a consistent state, writing nothing.
	View(ctx context.Context, fn func(Tx) error) error
	// Watch is store.Store.Watch.
	Watch(ctx context.Context, id string) (store.Bell, error)
	String() string
	Close() error
}

// Options are what a backend tells the rules about itself.
type Options struct {
	// Judge proves holders dead (store.Judge); nil judges by expiry only.
	Judge store.Judge
	// Keep vouches for an expired ticket whose job provably still runs
	// (SettleInput.Keep); nil on a shared store.
	Keep func(store.Ticket) bool
	// Quiet: waiters renew nothing until they come into line, their
	// liveness proven by the host (a host-local store).
	Quiet bool
	// MaxWeight, if not nil, bounds a ticket's growth by how many limits
	// it names (etcd: one transaction must hold its keys), below
	// store.MaxTicketSlots.
	MaxWeight func(limits int) int
	// BellUID is written into each new ticket (Rec.BellUID).
	BellUID *uint32
	// Mutations is test-only: planted bugs the simulation must catch.
	Mutations mutation.Set
}

// An Expirer is a Tx whose backend expires leases itself (etcd's server):
// Expired says why r's lease is over, or "" while it runs, in place of its
// deadline against Now.
type Expirer interface {
	Expired(r Rec) string
}

// A LateFence is a Tx that learns a new ticket's fence only once its step
// commits (etcd's create revision): NextFence's answer stands in for it
// until then, and Fence turns it into the fence the ticket has.
type LateFence interface {
	Fence(f uint64) uint64
}
