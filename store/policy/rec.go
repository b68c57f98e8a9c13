package policy

import (
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// An Instant is a reading of the store's clock. Boot names the clock: two
// readings compare only within one boot. Mono orders readings within it and
// measures leases; Wall is for display and events.
type Instant struct {
	Boot string
	Mono time.Duration
	Wall time.Time
}

// A Rec is one ticket as a backend stores it: every field a Ticket shows,
// and its lease as a deadline on the store's clock.
type Rec struct {
	ID    string      `json:"id"`
	Limit string      `json:"limit"` // the first of Limits
	State store.State `json:"state"`
	// Limits and Weight are set for a ticket of several limits or of a
	// weight above 1; a ticket of one limit and weight 1 leaves both unset
	// and holds Slot.
	Limits  []string         `json:"limits,omitempty"`
	Weight  int              `json:"weight,omitempty"`
	Fence   uint64           `json:"fence"`
	Slot    int              `json:"slot"`
	Indexes map[string][]int `json:"indexes,omitempty"` // iff held and Limits set: Weight ascending indexes in each limit
	TTL     time.Duration    `json:"ttl_ns"`
	// The lease runs out at DeadlineMono of boot DeadlineBoot.
	DeadlineBoot string        `json:"deadline_boot"`
	DeadlineMono time.Duration `json:"deadline_mono_ns"`
	// Quiet: a waiter of a host-local store that renews nothing until it
	// comes into line (store.Ticket.Quiet).
	Quiet    bool         `json:"quiet,omitempty"`
	Created  time.Time    `json:"created"`
	Admitted time.Time    `json:"admitted,omitzero"`
	Renewed  time.Time    `json:"renewed,omitzero"`
	Holder   store.Holder `json:"holder"`
	// BellUID is the user whose bell directory holds the ticket's bell
	// (a host-local store's wake-ups); nil elsewhere.
	BellUID  *uint32          `json:"bell_uid,omitempty"`
	Key      string           `json:"key,omitempty"`
	Stop     *store.Successor `json:"stop,omitempty"`     // a held ticket a newer run asked to stop
	Replaces []string         `json:"replaces,omitempty"` // the held tickets this one waits to be gone
	// Priority and Share order it in limits whose policy asks for them.
	Priority int    `json:"priority,omitempty"`
	Share    string `json:"share,omitempty"`
	// Superseding marks a ticket whose supersede did not fit in its
	// enqueue's step (a bounded backend's, Bounded): every settle carries
	// it on (carryOn) until nothing of it is left.
	Superseding bool `json:"superseding,omitempty"`
}

// A LimitRec is one limit as a backend stores it.
type LimitRec struct {
	Slots   int          `json:"slots"`
	Created time.Time    `json:"created"`
	Policy  store.Policy `json:"policy,omitzero"`
	// Starts is when the admissions that count against the policy's rate
	// were made, by the store's wall clock, oldest first (at most Rate.N):
	// the step that admits writes them.
	Starts []time.Time `json:"starts,omitempty"`
}

// A Tomb remembers a removed ticket id: why it went, when (by the store's
// clock, so that a backend can prune old ones) and, if superseded, by whom.
type Tomb struct {
	Reason store.Reason     `json:"reason"`
	Wall   time.Time        `json:"wall"`
	Boot   string           `json:"boot"`
	Mono   time.Duration    `json:"mono_ns"`
	By     *store.Successor `json:"by,omitempty"`
}

// MaxReplaces bounds the held tickets one --replace may stop.
const MaxReplaces = 256

// MaxHost bounds a successor's host name: a supersede or replace refuses a
// request whose host is longer or not printable, so that it never writes a
// successor its reader would refuse.
const MaxHost = 255

// View is the ticket as a caller sees it at now, under its first limit;
// position is its 1-based place among that limit's waiters.
func (r *Rec) View(now Instant, position int) store.Ticket {
	t := store.Ticket{ID: r.ID, Limit: r.Limit, State: r.State, Fence: r.Fence, Slot: r.Slot,
		TTL: r.TTL, Holder: r.Holder, Created: r.Created, Admitted: r.Admitted, Renewed: r.Renewed,
		Key: r.Key, Replaces: slices.Clip(r.Replaces), Priority: r.Priority, Share: r.Share}
	if r.Stop != nil {
		stop := *r.Stop
		t.Stop = &stop
	}
	if len(r.Limits) > 1 {
		t.Limits = r.Limits
	}
	if r.Weight > 1 {
		t.Weight = r.Weight
	}
	if r.State == store.Waiting {
		t.Slot, t.Position, t.Quiet = -1, position, r.Quiet
	} else if t.Multi() {
		t.Indexes = r.Indexes
	}
	if r.DeadlineBoot == now.Boot {
		t.Remaining = r.DeadlineMono - now.Mono
	}
	return t
}

// Names is the ticket's limits: Limits, or Limit alone.
func (r *Rec) Names() []string {
	if len(r.Limits) == 0 {
		return []string{r.Limit}
	}
	return r.Limits
}

// Weighs is how many slots it takes in each limit.
func (r *Rec) Weighs() int { return max(r.Weight, 1) }

// In is its slot indexes in limit while held.
func (r *Rec) In(limit string) []int {
	if r.State != store.Held {
		return nil
	}
	if ix, ok := r.Indexes[limit]; ok {
		return ix
	}
	if r.Indexes == nil && limit == r.Limit && r.Slot >= 0 {
		return []int{r.Slot}
	}
	return nil
}

// Has reports whether the ticket names limit.
func (r *Rec) Has(limit string) bool { return slices.Contains(r.Names(), limit) }

// Compact drops what a ticket of one limit and weight 1 leaves unset, and
// indexes of a ticket not held: the form Check accepts and backends store.
func (r *Rec) Compact() {
	if len(r.Limits) <= 1 && r.Weighs() == 1 {
		r.Limits, r.Weight, r.Indexes = nil, 0, nil
	} else if r.State != store.Held {
		r.Indexes = nil
	}
}

// Check refuses a record a request could not have written: a backend calls
// it on every ticket it reads back, since whoever shares the store may have
// written it.
func (r *Rec) Check() error {
	if err := store.CheckID(r.ID); err != nil {
		return err
	}
	if err := store.CheckLimitName(r.Limit); err != nil {
		return err
	}
	if r.Limits != nil || r.Weight != 0 || r.Indexes != nil {
		if err := r.checkLimits(); err != nil {
			return err
		}
	}
	switch {
	case r.State != store.Held && r.State != store.Waiting:
		return fmt.Errorf("state %q", r.State)
	case r.Fence == 0:
		return fmt.Errorf("fence 0")
	case r.State == store.Held && (r.Slot < 0 || r.Slot >= store.MaxSlots):
		return fmt.Errorf("slot %d of a held ticket: want 0..%d", r.Slot, store.MaxSlots-1)
	case r.State == store.Waiting && r.Slot != -1:
		return fmt.Errorf("slot %d of a waiting ticket: want -1", r.Slot)
	case r.Holder.Pid < 0 || r.Holder.Pgid < 0:
		return fmt.Errorf("holder pid %d, group %d: want no negative pid", r.Holder.Pid, r.Holder.Pgid)
	}
	if err := store.CheckStoredHolder(r.Holder); err != nil {
		return err
	}
	if err := store.CheckTicketSlots(len(r.Names()), r.Weighs()); err != nil {
		return err
	}
	if err := r.checkKeyed(); err != nil {
		return err
	}
	return store.CheckTTL(r.TTL)
}

// checkKeyed checks a key and a URL a request could carry, a stop request
// only on a held ticket naming a successor, and at most MaxReplaces
// distinct ticket ids (never its own) in Replaces.
func (r *Rec) checkKeyed() error {
	if err := store.CheckKey(r.Key); err != nil {
		return err
	}
	if err := store.CheckPriority(r.Priority); err != nil {
		return err
	}
	if err := store.CheckShare(r.Share); err != nil {
		return err
	}
	if err := store.CheckURL(r.Holder.URL); err != nil {
		return err
	}
	if r.Stop != nil {
		if r.State != store.Held {
			return fmt.Errorf("a stop request on a ticket that is not held")
		}
		if err := CheckSuccessor(*r.Stop); err != nil {
			return err
		}
	}
	if r.Replaces != nil && len(r.Replaces) == 0 || len(r.Replaces) > MaxReplaces {
		return fmt.Errorf("%d replaced tickets: want 1..%d", len(r.Replaces), MaxReplaces)
	}
	for i, id := range r.Replaces {
		if err := store.CheckID(id); err != nil {
			return err
		}
		if id == r.ID || slices.Contains(r.Replaces[:i], id) {
			return fmt.Errorf("ticket %s replaces %s twice or itself", r.ID, id)
		}
	}
	return nil
}

// checkLimits checks the limits a request could name (the first one Limit),
// a weight of 1..MaxSlots, and, iff held, exactly Weight ascending distinct
// indexes below MaxSlots in each limit and no other, Slot the lowest in the
// first.
func (r *Rec) checkLimits() error {
	if err := store.CheckLimits(r.Limits); err != nil {
		return err
	}
	if r.Limits[0] != r.Limit {
		return fmt.Errorf("limit %q is not the first of limits %q", r.Limit, r.Limits)
	}
	if r.Weight < 1 || r.Weight > store.MaxSlots {
		return fmt.Errorf("weight %d: want 1..%d", r.Weight, store.MaxSlots)
	}
	if len(r.Limits) == 1 && r.Weight == 1 {
		return fmt.Errorf("limits and weight of a ticket of one limit and weight 1: want neither")
	}
	if r.State != store.Held {
		if r.Indexes != nil {
			return fmt.Errorf("slot indexes of a ticket that is not held")
		}
		return nil
	}
	if len(r.Indexes) != len(r.Limits) {
		return fmt.Errorf("slot indexes in %d limits of a held ticket of %d", len(r.Indexes), len(r.Limits))
	}
	for _, name := range r.Limits {
		ix, ok := r.Indexes[name]
		if !ok {
			return fmt.Errorf("no slot indexes in limit %q of a held ticket", name)
		}
		if len(ix) != r.Weight {
			return fmt.Errorf("%d slot indexes in limit %q of a ticket of weight %d", len(ix), name, r.Weight)
		}
		for i, n := range ix {
			if n < 0 || n >= store.MaxSlots || i > 0 && n <= ix[i-1] {
				return fmt.Errorf("slot indexes %v in limit %q: want ascending distinct indexes of 0..%d", ix, name, store.MaxSlots-1)
			}
		}
	}
	if r.Slot != r.Indexes[r.Limit][0] {
		return fmt.Errorf("slot %d of a ticket whose lowest index in %q is %d", r.Slot, r.Limit, r.Indexes[r.Limit][0])
	}
	return nil
}

// Check refuses a tombstone naming a successor it could not have.
func (t *Tomb) Check() error {
	if t.By == nil {
		return nil
	}
	if t.Reason != store.Superseded {
		return fmt.Errorf("a successor in a tombstone of a ticket %s", t.Reason)
	}
	return CheckSuccessor(*t.By)
}

// Check refuses a limit of a size a request could not set.
func (l *LimitRec) Check() error {
	if err := store.CheckSlots(l.Slots); err != nil {
		return err
	}
	if err := l.Policy.Check(); err != nil {
		return err
	}
	if len(l.Starts) > max(l.Policy.Rate.N, 0) {
		return fmt.Errorf("%d rate starts: want at most %d", len(l.Starts), l.Policy.Rate.N)
	}
	return nil
}

// CheckSuccessor checks a successor as the enqueue that made it checked its
// request: a ticket id, a printable host, a pid, a URL.
func CheckSuccessor(s store.Successor) error {
	if err := store.CheckID(s.Ticket); err != nil {
		return err
	}
	if len(s.Host) > MaxHost || !store.IsPrintable(s.Host) {
		return fmt.Errorf("successor host %q: want at most %d printable characters", s.Host, MaxHost)
	}
	if s.Pid < 0 {
		return fmt.Errorf("successor pid %d: want no negative pid", s.Pid)
	}
	return store.CheckURL(s.URL)
}

// CheckEvent refuses an event a step could not have logged.
func CheckEvent(e store.Event) error {
	if err := store.CheckID(e.Ticket); err != nil {
		return err
	}
	if err := store.CheckLimitName(e.Limit); err != nil {
		return err
	}
	if e.By != "" {
		if err := store.CheckID(e.By); err != nil {
			return err
		}
	}
	if err := store.CheckEventText(e); err != nil {
		return err
	}
	if e.Waited < 0 || e.Held < 0 {
		return fmt.Errorf("event waited %v, held %v: want neither negative", e.Waited, e.Held)
	}
	if e.Limits != nil {
		if err := store.CheckLimits(e.Limits); err != nil {
			return err
		}
		if len(e.Limits) < 2 || !slices.Contains(e.Limits, e.Limit) {
			return fmt.Errorf("event of limit %q naming limits %q", e.Limit, e.Limits)
		}
	}
	if e.Weight < 0 || e.Weight == 1 || e.Weight > store.MaxSlots {
		return fmt.Errorf("event weight %d: want none or 2..%d", e.Weight, store.MaxSlots)
	}
	if len(e.Indexes) > e.Weight {
		return fmt.Errorf("%d slot indexes in an event of weight %d", len(e.Indexes), e.Weight)
	}
	for _, n := range e.Indexes {
		if n < 0 || n >= store.MaxSlots {
			return fmt.Errorf("event slot index %d: want 0..%d", n, store.MaxSlots-1)
		}
	}
	return nil
}
