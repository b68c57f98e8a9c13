// Package store holds admission tickets for named concurrency limits.
//
// A Store admits at most Limit.Slots held tickets per limit, in the order the
// tickets were enqueued. The ticket is the slot: there is no counter beside the
// tickets, and only the operation that actually removes a ticket frees its slot.
// Every method is one atomic step on the store's current state.
//
// Expiry is judged by the store's clock (the host's boot-time clock for the
// embedded bbolt store, the server's leases for etcd), never by the caller's.
package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// State is a ticket's place in its limit: waiting in the queue, or holding a slot.
type State string

// The two states of a live ticket.
const (
	Waiting State = "waiting"
	Held    State = "held"
)

// Holder identifies the process that owns a ticket. On the ticket's own host
// it is the evidence that lets a reaper prove the holder dead (boot id, pid
// namespace, pid and start time, child process group); elsewhere it is for display.
type Holder struct {
	Host      string   `json:"host"`
	User      string   `json:"user,omitempty"`
	BootID    string   `json:"boot_id,omitempty"`
	PidNS     uint64   `json:"pidns,omitempty"`
	Pid       int      `json:"pid"`
	PidStart  uint64   `json:"pid_start,omitempty"`  // clock ticks after boot, /proc/PID/stat field 22
	Pgid      int      `json:"pgid,omitempty"`       // the child's process group, once it runs
	PgidStart uint64   `json:"pgid_start,omitempty"` // start time of the group leader
	Argv      []string `json:"argv,omitempty"`
	Label     string   `json:"label,omitempty"`
	// URL is where the job comes from: its CI run's page (slotctl run --url,
	// else the CI's own variables), shown by ls -o wide.
	URL string `json:"url,omitempty"`
}

// Command is what to show for the holder: its label, else its command line.
func (h Holder) Command() string {
	if h.Label != "" {
		return h.Label
	}
	return shellJoin(h.Argv)
}

// A Ticket is one job's admission record: waiting in the queues of its
// limits or holding Weight slots of each (docs/leases.md §2.1 item 9). It is
// admitted to all of its limits in one step or to none.
type Ticket struct {
	ID string `json:"id"`
	// Limit is the limit this view of the ticket is under: its first limit,
	// or in a Snapshot the limit it is listed under (a ticket of several
	// limits is listed under each).
	Limit string `json:"limit"`
	// Limits are all of its limits in the order requested; empty (or just
	// Limit) for a ticket of one limit. Use Names.
	Limits []string `json:"limits,omitempty"`
	// Weight is how many slots it takes in each of its limits; 0 means 1.
	// Use Weighs.
	Weight int    `json:"weight,omitempty"`
	State  State  `json:"state"`
	Fence  uint64 `json:"fence"` // strictly increasing per store; also the queue order, across limits
	// Slot is the lowest slot index it holds in Limit (0..slots-1), -1 while waiting.
	Slot int `json:"slot"`
	// Indexes are the slot indexes it holds in each limit, ascending, while
	// held; nil while waiting (and for a held ticket of one limit and weight
	// one, which holds Slot). Use In.
	Indexes  map[string][]int `json:"indexes,omitempty"`
	Position int              `json:"position"` // 1-based place among Limit's waiters; 0 when held
	// Key names the work the ticket does within its limits (a branch, an
	// environment); "" for a run without one (docs/leases.md §2.1 item 10).
	Key string `json:"key,omitempty"`
	// Stop is set on a held ticket that a newer run of its key asked to
	// stop (--replace): its holder stops its job, releases and exits 143.
	Stop *Successor `json:"stop,omitempty"`
	// Replaces are the held tickets this waiting ticket asked to stop: it
	// is admitted only once none of them is live (never beside them).
	Replaces  []string      `json:"replaces,omitempty"`
	TTL       time.Duration `json:"ttl"`
	Holder    Holder        `json:"holder"`
	Created   time.Time     `json:"created"`           // wall clock, display only
	Admitted  time.Time     `json:"admitted,omitzero"` // wall clock, display only
	Renewed   time.Time     `json:"renewed,omitzero"`  // wall clock, display only
	Remaining time.Duration `json:"remaining"`         // lease left by the store's clock when read; <= 0 is expired
	// Quiet is set on a waiting ticket of a host-local store that is not
	// yet in line: its waiter renews nothing, as its liveness is proven from
	// the process table, and its Remaining means nothing. The settle that
	// brings it into line ends the quiet, gives it a whole lease and wakes
	// it (docs/leases.md rule 17).
	Quiet bool `json:"quiet,omitempty"`
	// Priority orders the ticket among the waiters of a limit whose order
	// is ByPriority (MinPriority..MaxPriority); Share is what it counts
	// against in a Fair limit, "" for its holder's user (ShareKey).
	Priority int    `json:"priority,omitempty"`
	Share    string `json:"share,omitempty"`
	// Effective is its effective priority in Limit when that limit's order
	// is ByPriority and it waits (Snapshot only).
	Effective *int `json:"effective_priority,omitempty"`
}

// A Successor names the newer run that superseded or replaced a ticket.
type Successor struct {
	Ticket string `json:"ticket"`
	Host   string `json:"host,omitempty"`
	Pid    int    `json:"pid,omitempty"`
	URL    string `json:"url,omitempty"`
}

// SuccessorOf names the run of ticket t as a successor.
func SuccessorOf(t Ticket) Successor {
	return Successor{Ticket: t.ID, Host: t.Holder.Host, Pid: t.Holder.Pid, URL: t.Holder.URL}
}

// Expired reports whether the store judged the lease over when the ticket was read.
func (t Ticket) Expired() bool { return !t.Quiet && t.Remaining <= 0 }

// Names is the ticket's limits in the order requested: Limits, or Limit alone.
func (t Ticket) Names() []string {
	if len(t.Limits) > 0 {
		return t.Limits
	}
	return []string{t.Limit}
}

// Weighs is the number of slots the ticket takes in each of its limits (at least 1).
func (t Ticket) Weighs() int { return max(t.Weight, 1) }

// Multi reports whether the ticket names more than one limit or weighs more than one slot.
func (t Ticket) Multi() bool { return len(t.Limits) > 1 || t.Weight > 1 }

// In is the slot indexes the ticket holds in limit, ascending; nil while
// waiting or when limit is not one of its limits.
func (t Ticket) In(limit string) []int {
	if t.State != Held {
		return nil
	}
	if ix, ok := t.Indexes[limit]; ok {
		return ix
	}
	if t.Indexes == nil && limit == t.Names()[0] && t.Slot >= 0 {
		return []int{t.Slot}
	}
	return nil
}

// Under returns the view of t listed under limit, one of its limits: Limit,
// Slot (its lowest index there) and nothing else changed.
func (t Ticket) Under(limit string) Ticket {
	if t.State == Held {
		if ix := t.In(limit); len(ix) > 0 {
			t.Slot = ix[0]
		}
	}
	if len(t.Limits) == 0 {
		t.Limits = []string{t.Limit}
	}
	t.Limit = limit
	return t
}

// SlotsVar is the value of SLOTCTL_SLOTS for a held ticket: NAME=I[,I...]
// pairs in the order of its limits, separated by spaces ("build=0 db=2,3").
func (t Ticket) SlotsVar() string {
	var b []byte
	for i, name := range t.Names() {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, name...)
		b = append(b, '=')
		for j, ix := range t.In(name) {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(ix), 10)
		}
	}
	return string(b)
}

// A Limit is a named pool of slots. Slots == 0 pauses admission.
type Limit struct {
	Name    string    `json:"name"`
	Slots   int       `json:"slots"`
	Held    int       `json:"held"`
	Waiting int       `json:"waiting"`
	Created time.Time `json:"created"`
	Policy  Policy    `json:"policy,omitzero"`
	// Starts is when the admissions that count against the rate were made
	// (within its window, oldest first); Opens, when the rate is spent, is
	// when the next admission may be made (Snapshot only).
	Starts []time.Time `json:"starts,omitempty"`
	Opens  time.Time   `json:"opens,omitzero"`
}

// Snapshot is a consistent read of limits and their tickets. Tickets are
// ordered by limit, then held (by fence) before waiting (in the order the
// limit's policy admits them: by fence when FIFO).
type Snapshot struct {
	Now     time.Time `json:"now"`
	Limits  []Limit   `json:"limits"`
	Tickets []Ticket  `json:"tickets"`
}

// EnqueueRequest asks for a ticket in one limit or several. ID is minted by
// the caller before the request, so that a retry is idempotent and a cancel
// can refuse a late create.
type EnqueueRequest struct {
	ID string
	// Limit names the ticket's one limit; Limits names several (in the
	// order given; Limit is then empty or Limits[0]). Use Names.
	Limit  string
	Limits []string
	// Weight is how many slots the ticket takes in each limit; 0 means 1.
	// A weight above the size of a limit that is not paused (0) is refused
	// with a *WeightError.
	Weight int
	// Slots is the size each limit is created with when it does not exist.
	Slots int
	// Sizes, where it names one of the limits, is the size that limit is
	// created with instead of Slots (a config file's sizes of each). Use SizeOf.
	Sizes map[string]int
	// CheckSlots refuses the request with a *SlotsConflictError when a limit
	// exists with another size.
	CheckSlots bool
	TTL        time.Duration
	Holder     Holder

	// Key names the work this ticket does in its limits (docs/leases.md
	// §2.1 item 10); see CheckKey. Supersede removes, in the enqueue's own
	// step, every older waiting ticket of the same key in any of its limits
	// (reason Superseded). Replace also asks every held ticket of the same
	// key in its limits to stop (Ticket.Stop) and admits this one only after
	// they are gone (Ticket.Replaces).
	Key       string
	Supersede bool
	Replace   bool
	// MaxWaiting, when set, refuses to queue (a *QueueFullError, nothing
	// written) a ticket that is not admitted at once while one of its
	// limits already has *MaxWaiting waiting tickets, counted after the
	// superseded ones are gone.
	MaxWaiting *int

	// Priority and Share order the ticket in limits whose order asks for
	// them (Ticket.Priority, Ticket.Share); see CheckPriority, CheckShare.
	Priority int
	Share    string
}

// Reason says why a ticket left the live set.
type Reason string

// Reasons a ticket is removed.
const (
	Released      Reason = "released"       // its holder let go after the child exited
	Cancelled     Reason = "cancelled"      // removed by Cancel: its holder gave up before its job ran
	Reaped        Reason = "reaped"         // expired or proven dead, removed by a sweep
	ForceReleased Reason = "force-released" // an operator removed it
	// Superseded: a newer waiting run of the same key took its place in the
	// queue (--supersede, --replace); its job never ran.
	Superseded Reason = "superseded"
	// Lost: the holder presumed its lease lost and stopped (or, with
	// --on-lost continue, did not stop) its child. Releasing with it removes
	// the ticket if the store still has it, and logs a "lost" event either way.
	Lost Reason = "lost"
	// Busy: the holder gave up waiting (--wait ran out) before its job
	// ran. Releasing with it is Cancel under another name: it removes the
	// ticket even if it was promoted meanwhile, tombstones an id never seen,
	// and logs a "busy" event instead of "cancelled".
	Busy Reason = "busy"
)

// Resized is the kind of event a held ticket logs when Resize changes its
// weight; the event's Weight is the new weight (docs/leases.md §2.1 item 12).
const Resized = "resized"

// Kept is the kind of event a ticket logs on the etcd store when a settle
// keeps it (its place, and a holder's slots) although its lease is gone,
// because the cluster elected a leader since it was granted: it is put
// under a hold, a new lease, which its holder takes over as it renews
// (docs/leases.md rule 16).
const Kept = "kept"

// An Event is one entry of a store's event log: admitted, released,
// cancelled, reaped (with the evidence), force-released, lost.
type Event struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"` // wall clock, display only
	Kind   string    `json:"kind"`
	Limit  string    `json:"limit"`
	Ticket string    `json:"ticket"`
	Fence  uint64    `json:"fence"`
	Slot   int       `json:"slot"`
	// A ticket of several limits logs one event in each (Limit), naming
	// them all; Weight and Indexes (its indexes in Limit) when it weighs more than 1.
	Limits  []string `json:"limits,omitempty"`
	Weight  int      `json:"weight,omitempty"`
	Indexes []int    `json:"indexes,omitempty"`
	// By is the newer run's ticket of a "superseded" or "replaced" event.
	By       string `json:"by,omitempty"`
	Host     string `json:"host,omitempty"`
	Pid      int    `json:"pid,omitempty"`
	User     string `json:"user,omitempty"`
	Command  string `json:"command,omitempty"`
	Evidence string `json:"evidence,omitempty"`
	// Waited is how long the ticket waited, on its "admitted" event; Held
	// is how long it was held, on the event that removes a held ticket.
	// Both by the wall clock (Created, Admitted), never negative.
	Waited time.Duration `json:"waited,omitempty"`
	Held   time.Duration `json:"held,omitempty"`
}

// Counts are a limit's counters since it was created (docs/leases.md
// §2.8): kept in the store beside its tickets and updated by Add in the
// same step as the event they count, so they never go backwards and never
// depend on the event log's pruning. Removing a limit removes its counts.
type Counts struct {
	Limit         string    `json:"limit"`
	Admitted      uint64    `json:"admitted"`
	Released      uint64    `json:"released"`
	Cancelled     uint64    `json:"cancelled"`
	Busy          uint64    `json:"busy"`
	Superseded    uint64    `json:"superseded"`
	Replaced      uint64    `json:"replaced"`
	Reaped        uint64    `json:"reaped"`
	Lost          uint64    `json:"lost"`
	ForceReleased uint64    `json:"force_released"`
	Wait          Histogram `json:"wait"` // Event.Waited of each admission
	Hold          Histogram `json:"hold"` // Event.Held of each held ticket removed
}

// HistogramBounds are the upper bounds, in seconds, of the buckets of every
// Histogram in Counts (one more bucket, +Inf, is implied).
var HistogramBounds = []float64{0.1, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400}

// A Histogram counts observations in the buckets of HistogramBounds.
type Histogram struct {
	// Buckets[i] counts the observations <= HistogramBounds[i] and above
	// the bound before (not cumulative); len(HistogramBounds)+1 entries,
	// the last for those above every bound. Nil until the first Observe.
	Buckets []uint64 `json:"buckets,omitempty"`
	Count   uint64   `json:"count"`
	Sum     float64  `json:"sum"` // seconds
}

// MaxEvents is how many of the newest events a store keeps.
const MaxEvents = 10000

// A Judge proves a ticket's holder dead on this host (docs/leases.md §4.3) and says
// how; anything it cannot prove is left to the TTL. A holder whose
// supervisor is dead but whose job still runs is orphaned: unleased work.
// With act set the judge may stop that work (and then call it dead); without
// (a dry run) it only says what it would do.
type Judge func(t Ticket, act bool) (evidence string, dead bool)

// Removal records one ticket removed by a sweep, with the evidence.
type Removal struct {
	Ticket   Ticket `json:"ticket"`
	Reason   Reason `json:"reason"`
	Evidence string `json:"evidence"` // e.g. "expired 41s ago", "previous boot"
}

// Store is the contract every backend meets; storetest checks it.
type Store interface {
	// Enqueue writes a waiting ticket, creating the limit if needed, sweeps
	// the limit and promotes waiters in FIFO order, all in one step. The
	// returned ticket may already be held. Enqueueing an id that is live
	// returns that ticket unchanged; an id that was ever removed is refused
	// with ErrRemoved.
	//
	// In the same step it supersedes and replaces (req.Supersede,
	// req.Replace: older waiting tickets of req.Key sharing a limit are
	// removed as Superseded, with a "superseded" event naming the new
	// ticket in By; held ones get Stop and a "replaced" event, and the new
	// ticket's Replaces lists them) and applies req.MaxWaiting (a refusal
	// writes nothing, supersedes nothing). A ticket that was superseded is
	// not found (Get wraps ErrNotFound, Renew ErrLost) with a
	// *SupersededError naming its successor. A stop request is part of
	// the held ticket: Get and Renew return it, a restart keeps it, and the
	// holder's bell rings when it is made.
	Enqueue(ctx context.Context, req EnqueueRequest) (Ticket, error)

	// Get returns the live ticket with this id, or an error wrapping ErrNotFound.
	Get(ctx context.Context, id string) (Ticket, error)

	// Renew extends t's lease by the store's clock. A ticket that is gone,
	// belongs to another fence, or has expired is not renewed: the error
	// wraps ErrLost and is final. The result tells whether t is now held.
	//
	// What ttl does depends on the backend. The bbolt store moves the
	// deadline to now+ttl, and ttl becomes the ticket's TTL. On etcd the
	// ticket's lease is granted once, by Enqueue, with the request's TTL
	// rounded up to whole seconds (a server may raise it to its minimum
	// TTL), and a lease's TTL cannot change: Renew refuses a ttl <= 0 with
	// ErrInvalid and otherwise ignores it. Its one keep-alive moves the
	// lease's expiry to now plus the granted TTL by the server's clock, and
	// the returned ticket's TTL stays the enqueued one. Callers therefore
	// renew with the TTL they enqueued with, which both backends agree on.
	//
	// A waiter's renewal also settles its limits: it admits it (and
	// others) when a rate window has opened, a priority aged, or a holder
	// expired since the last write.
	Renew(ctx context.Context, t Ticket, ttl time.Duration) (Ticket, error)

	// Release removes t if the stored ticket still has t's id and fence (any
	// fence when t.Fence is 0), and promotes the next waiters. It reports
	// whether this call removed it; a ticket already gone is not an error and
	// frees nothing. An id never seen is tombstoned, so that a create still in
	// flight (cancel before create) is refused when it lands.
	//
	// why is Released, Lost or ForceReleased; a waiter that gives up calls
	// Cancel instead.
	Release(ctx context.Context, t Ticket, why Reason) (bool, error)

	// Cancel removes t as Cancelled: its holder gave up before its job ran.
	// It is Release's compare-and-delete with that reason: a ticket already
	// gone (or with another fence, when t.Fence is not 0) is left alone and
	// frees nothing, so a second Cancel reports false and no error; an id
	// never seen is tombstoned, so that a create still in flight is refused
	// when it lands. A ticket promoted meanwhile (its holder had not seen it
	// yet) is removed as cancelled too, since its job never ran: its slot is
	// freed once and handed to the next waiter. It reports whether this call
	// removed the ticket.
	Cancel(ctx context.Context, t Ticket) (bool, error)

	// SetChild records the process group the holder's child runs in (and the
	// start time of its leader), the evidence that proves the job gone once
	// its supervisor dies. A ticket that is gone wraps ErrLost.
	SetChild(ctx context.Context, t Ticket, pgid int, pgidStart uint64) (Ticket, error)

	// Reap removes the expired and proven-dead tickets of o.Limits (all
	// limits when empty), judged on the current state inside the step that
	// removes them, and promotes the waiters this frees. With o.DryRun it
	// removes nothing and reports what it would remove.
	Reap(ctx context.Context, o ReapOptions) ([]Removal, error)

	// Events returns the newest n events (of one limit, or of all when limit
	// is ""), oldest first.
	Events(ctx context.Context, limit string, n int) ([]Event, error)

	// Snapshot reads the named limits (all when none) and their tickets.
	Snapshot(ctx context.Context, limits ...string) (Snapshot, error)

	// SetLimit creates or resizes a limit. Shrinking evicts nobody; growing
	// promotes waiters.
	SetLimit(ctx context.Context, name string, slots int) (Limit, error)

	// SetPolicy changes the scheduling policy of an existing limit (a
	// missing one wraps ErrLimitNotFound) and admits the waiters it lets
	// in, in one step. A policy that fails Policy.Check wraps ErrInvalid.
	SetPolicy(ctx context.Context, name string, ch PolicyChange) (Limit, error)

	// RemoveLimit deletes an empty limit; with force, its tickets too.
	// A missing limit wraps ErrLimitNotFound; one with tickets, ErrLimitInUse.
	RemoveLimit(ctx context.Context, name string, force bool) error

	// Counts returns the counters of the named limits (all when none), in
	// name order; a named limit that does not exist wraps ErrLimitNotFound.
	Counts(ctx context.Context, limits ...string) ([]Counts, error)

	// Resize sets the weight of held ticket t (same id and fence) toward
	// weight, in one step, and returns the ticket as it now is
	// (docs/leases.md §2.1 item 12). Shrinking always happens: it frees the
	// ticket's highest indexes in each of its limits and promotes waiters.
	// Growing takes only what is free in every one of its limits while no
	// ticket waits in any of them (waiters go first), so the weight may end
	// anywhere between the old one and weight. A weight change logs a
	// "resized" event. A ticket that is gone, of another fence, or expired
	// wraps ErrLost; one still waiting, or a weight below 1, ErrInvalid.
	Resize(ctx context.Context, t Ticket, weight int) (Ticket, error)

	// Watch returns a Bell that rings when the ticket with this id may have
	// changed (promoted, asked to stop, or removed). Call it before Enqueue so that no ring is
	// lost. A ring is a hint: the caller confirms with Get.
	Watch(ctx context.Context, id string) (Bell, error)

	// String is the store's canonical URL, the same for every path that names it.
	String() string

	// Close releases what the handle holds (descriptors, connections,
	// watches). Bells already returned stay valid until their own Close but
	// may stop ringing. Every operation after Close fails with an error
	// wrapping ErrClosed; Close itself is idempotent.
	Close() error
}

// ReapOptions say what a Reap sweeps.
type ReapOptions struct {
	// DryRun removes nothing and reports what would be removed.
	DryRun bool
	// Limits are the limits to sweep; empty means all.
	Limits []string
}

// A Bell delivers wake-ups for one ticket. C never closes.
type Bell interface {
	C() <-chan struct{}
	Close() error
}

// Errors of the Store contract.
var (
	// ErrNotFound: no live ticket has this id.
	ErrNotFound = errors.New("ticket not found")
	// ErrLost: the ticket is gone, expired or replaced; renewing it again cannot help.
	ErrLost = errors.New("lease lost")
	// ErrRemoved: the ticket id was released, reaped or cancelled before and may not be created again.
	ErrRemoved = errors.New("ticket id was removed before")
	// ErrLimitNotFound: no limit has this name.
	ErrLimitNotFound = errors.New("no such limit")
	// ErrLimitInUse: the limit still has tickets.
	ErrLimitInUse = errors.New("limit has tickets")
	// ErrUnavailable: the store cannot be opened or reached (locked, missing permission, down).
	ErrUnavailable = errors.New("store unavailable")
	// ErrUnknownOutcome: a write was sent and its answer never came (a
	// connection cut, an election), so it may or may not have taken
	// effect. The store runs such a write again for a while on its own;
	// an Enqueue sent again later with the same id finds its ticket if the
	// lost one wrote it. It comes wrapped with ErrUnavailable.
	ErrUnknownOutcome = errors.New("the answer to the commit was lost")
	// ErrCorrupt: the store holds a record this version cannot decode.
	ErrCorrupt = errors.New("store is corrupt or of an unknown format")
	// ErrInvalid: the request itself is malformed (bad name, slot count, ttl).
	ErrInvalid = errors.New("invalid request")
	// ErrClosed: the store handle was closed.
	ErrClosed = errors.New("store is closed")
	// ErrQueueFull: a limit already has as many waiting tickets as the
	// request allows (EnqueueRequest.MaxWaiting).
	ErrQueueFull = errors.New("queue is full")
)

// QueueFullError refuses to queue a ticket behind Waiting tickets of Limit
// (at most Max allowed). It wraps ErrQueueFull.
type QueueFullError struct {
	Limit   string
	Waiting int
	Max     int
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("%v: limit %q has %d waiting (at most %d allowed)", ErrQueueFull, e.Limit, e.Waiting, e.Max)
}

// Unwrap makes a QueueFullError an ErrQueueFull.
func (e *QueueFullError) Unwrap() error { return ErrQueueFull }

// SupersededError says a ticket is gone because a newer run of its key
// took its place. Get wraps it in ErrNotFound, Renew in ErrLost.
type SupersededError struct {
	ID string
	By Successor
}

func (e *SupersededError) Error() string {
	return fmt.Sprintf("ticket %s was superseded by ticket %s", e.ID, e.By.Ticket)
}

// MaxURL is the longest job URL (Holder.URL), in bytes.
const MaxURL = 2048

// CheckURL returns an error wrapping ErrInvalid for a job URL that is too
// long or holds anything but printable characters.
func CheckURL(url string) error {
	if len(url) > MaxURL || !IsPrintable(url) {
		return fmt.Errorf("%w: url %q: want at most %d printable characters", ErrInvalid, url, MaxURL)
	}
	return nil
}

// MaxKey is the longest key, in bytes.
const MaxKey = 256

// CheckKey returns an error wrapping ErrInvalid for a key that is too long
// or holds anything but printable characters (IsPrintable). "" is the key
// of a run without --key.
func CheckKey(key string) error {
	if len(key) > MaxKey || !IsPrintable(key) {
		return fmt.Errorf("%w: key %q: want 1-%d printable characters", ErrInvalid, key, MaxKey)
	}
	return nil
}

// LockTimeoutError: the store stayed locked by another process for all of
// Waited, the longest an operation may wait for its lock. It wraps
// ErrUnavailable.
type LockTimeoutError struct {
	Path   string        // what was locked, e.g. the bbolt file
	Waited time.Duration // how long the operation waited
}

func (e *LockTimeoutError) Error() string {
	return fmt.Sprintf("%v: store %s stayed locked by another process for %s", ErrUnavailable, e.Path, e.Waited.Round(time.Millisecond))
}

// Unwrap makes a LockTimeoutError an ErrUnavailable.
func (e *LockTimeoutError) Unwrap() error { return ErrUnavailable }

// SlotsConflictError refuses a request whose slot count disagrees with the existing limit.
type SlotsConflictError struct {
	Limit string
	Have  int
	Want  int
}

func (e *SlotsConflictError) Error() string {
	return fmt.Sprintf("limit %q has %d slots, not %d", e.Limit, e.Have, e.Want)
}

// MaxSlots is the largest size a limit may have.
const MaxSlots = 65535

// ValidLimitName reports whether name is a valid limit name:
// [A-Za-z0-9][A-Za-z0-9._:-]{0,127}. (Checked by hand: a regexp compiled at
// start-up costs every slotctl run more than the check ever will.)
func ValidLimitName(name string) bool {
	if len(name) == 0 || len(name) > 128 || !isAlnum(name[0]) {
		return false
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !isAlnum(c) && c != '.' && c != '_' && c != ':' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// CheckLimitName returns an error wrapping ErrInvalid that names a bad limit name.
func CheckLimitName(name string) error {
	if !ValidLimitName(name) {
		return fmt.Errorf("%w: limit name %q: want 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit", ErrInvalid, name)
	}
	return nil
}

// CheckID returns an error wrapping ErrInvalid for a ticket id outside
// [A-Za-z0-9_-]{1,64}: ids are file names (bbolt's bells) and key segments
// (etcd), so no path characters.
func CheckID(id string) error {
	ok := len(id) > 0 && len(id) <= 64
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = isAlnum(c) || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("%w: ticket id %q: want 1-64 characters of [A-Za-z0-9_-]", ErrInvalid, id)
	}
	return nil
}

// CheckTTL returns an error wrapping ErrInvalid for a ttl that is not positive.
func CheckTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: ttl %s: want a positive duration", ErrInvalid, ttl)
	}
	return nil
}

// Names is the request's limits in the order given.
func (r EnqueueRequest) Names() []string {
	if len(r.Limits) > 0 {
		return r.Limits
	}
	return []string{r.Limit}
}

// SizeOf is the size the limit name is created with when it does not exist.
func (r EnqueueRequest) SizeOf(name string) int {
	if n, ok := r.Sizes[name]; ok {
		return n
	}
	return r.Slots
}

// Weighs is the request's weight (at least 1).
func (r EnqueueRequest) Weighs() int { return max(r.Weight, 1) }

// MaxLimits is the most limits one ticket may name.
const MaxLimits = 16

// Check returns the first error of CheckID, CheckLimits, CheckWeight,
// CheckSlots and CheckTTL on the request: what every backend's Enqueue
// refuses first.
func (r EnqueueRequest) Check() error {
	if err := CheckID(r.ID); err != nil {
		return err
	}
	if len(r.Limits) > 0 && r.Limit != "" && r.Limit != r.Limits[0] {
		return fmt.Errorf("%w: limit %q and limits %q: name the first limit in both or only in Limits", ErrInvalid, r.Limit, r.Limits)
	}
	if err := CheckLimits(r.Names()); err != nil {
		return err
	}
	if err := CheckWeight(r.Weight); err != nil {
		return err
	}
	if err := CheckSlots(r.Slots); err != nil {
		return err
	}
	if err := CheckKey(r.Key); err != nil {
		return err
	}
	if err := CheckPriority(r.Priority); err != nil {
		return err
	}
	if err := CheckShare(r.Share); err != nil {
		return err
	}
	if err := CheckTicketSlots(len(r.Names()), r.Weight); err != nil {
		return err
	}
	if err := CheckHolder(r.Holder); err != nil {
		return err
	}
	if r.MaxWaiting != nil && *r.MaxWaiting < 0 {
		return fmt.Errorf("%w: at most %d waiting: want 0 or more", ErrInvalid, *r.MaxWaiting)
	}
	for name, n := range r.Sizes {
		if !slices.Contains(r.Names(), name) {
			return fmt.Errorf("%w: a size for limit %q, which the request does not name", ErrInvalid, name)
		}
		if err := CheckSlots(n); err != nil {
			return err
		}
	}
	return CheckTTL(r.TTL)
}

// CheckLimits returns an error wrapping ErrInvalid unless names are 1 to
// MaxLimits valid limit names, none of them twice.
func CheckLimits(names []string) error {
	if len(names) == 0 || len(names) > MaxLimits {
		return fmt.Errorf("%w: %d limits: want 1 to %d", ErrInvalid, len(names), MaxLimits)
	}
	for i, n := range names {
		if err := CheckLimitName(n); err != nil {
			return err
		}
		for _, m := range names[:i] {
			if m == n {
				return fmt.Errorf("%w: limit %q named twice: name each limit once", ErrInvalid, n)
			}
		}
	}
	return nil
}

// CheckWeight returns an error wrapping ErrInvalid for a weight outside
// 0..MaxSlots (0 means 1).
func CheckWeight(w int) error {
	if w < 0 || w > MaxSlots {
		return fmt.Errorf("%w: weight %d: want 1..%d slots", ErrInvalid, w, MaxSlots)
	}
	return nil
}

// CheckWeightFits returns a *WeightError when weight is above the size of a
// limit that is not paused: such a ticket could never be admitted.
func CheckWeightFits(limit string, slots, weight int) error {
	if slots > 0 && weight > slots {
		return &WeightError{Limit: limit, Slots: slots, Weight: weight}
	}
	return nil
}

// WeightError refuses a ticket heavier than one of its limits. It wraps ErrInvalid.
type WeightError struct {
	Limit  string
	Slots  int
	Weight int
}

func (e *WeightError) Error() string {
	return fmt.Sprintf("%v: weight %d is more than the %d slots of limit %q: want a weight of 1..%d", ErrInvalid, e.Weight, e.Slots, e.Limit, e.Slots)
}

// Unwrap makes a WeightError an ErrInvalid.
func (e *WeightError) Unwrap() error { return ErrInvalid }

// CheckSlots returns an error wrapping ErrInvalid for a slot count outside 0..MaxSlots.
func CheckSlots(n int) error {
	if n < 0 || n > MaxSlots {
		return fmt.Errorf("%w: slot count %d: want 0..%d (0 pauses the limit)", ErrInvalid, n, MaxSlots)
	}
	return nil
}

// Add counts one event of the limit's log: its kind, and its Waited or Held
// time in the histograms. Every backend calls it for each event it logs, in
// the step that logs it. Kinds it does not count ("resized", "kept") change nothing.
func (c *Counts) Add(ev Event) {
	switch ev.Kind {
	case "admitted":
		c.Admitted++
		c.Wait.Observe(ev.Waited)
	case string(Released):
		c.Released++
	case string(Cancelled):
		c.Cancelled++
	case string(Busy):
		c.Busy++
	case string(Superseded):
		c.Superseded++
	case "replaced":
		c.Replaced++
	case string(Reaped):
		c.Reaped++
	case string(Lost):
		c.Lost++
	case string(ForceReleased):
		c.ForceReleased++
	}
	if ev.Kind != "admitted" && ev.Held > 0 {
		c.Hold.Observe(ev.Held)
	}
}

// Observe counts one duration (negative ones as 0).
func (h *Histogram) Observe(d time.Duration) {
	if len(h.Buckets) != len(HistogramBounds)+1 {
		h.Buckets = make([]uint64, len(HistogramBounds)+1)
	}
	v := max(d, 0).Seconds()
	i, _ := slices.BinarySearch(HistogramBounds, v)
	h.Buckets[i]++
	h.Count++
	h.Sum += v
}

// Check refuses counts that a store could not have written (hostile or
// corrupt records are exit 69): a bad limit name, or a histogram whose
// buckets do not add up to its count.
func (c *Counts) Check() error {
	if err := CheckLimitName(c.Limit); err != nil {
		return err
	}
	for _, h := range []*Histogram{&c.Wait, &c.Hold} {
		if h.Buckets == nil && h.Count == 0 && h.Sum == 0 {
			continue
		}
		var n uint64
		for _, b := range h.Buckets {
			n += b
		}
		if len(h.Buckets) != len(HistogramBounds)+1 || n != h.Count || !(h.Sum >= 0) {
			return fmt.Errorf("%w: counts of %q: histogram of %d buckets holding %d, count %d, sum %v",
				ErrCorrupt, c.Limit, len(h.Buckets), n, h.Count, h.Sum)
		}
	}
	return nil
}
