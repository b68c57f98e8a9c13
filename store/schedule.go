package store

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// An Order is how a limit orders its waiters (docs/scheduling.md).
type Order string

const (
	// FIFO admits waiters in ticket order; it is the default ("").
	FIFO Order = "fifo"
	// ByPriority admits the waiter of the highest effective priority
	// first: its priority plus one point per Policy.Aging waited, ties in
	// ticket order.
	ByPriority Order = "priority"
	// Fair admits first the waiter whose share (Ticket.ShareKey) holds
	// the fewest slots of the limit, counting its own waiters ahead of it;
	// ties in ticket order.
	Fair Order = "fair"
)

// Bounds of a policy and of a ticket's priority.
const (
	DefaultAging = time.Minute
	MinPriority  = -100
	MaxPriority  = 100
	// MaxRate bounds a rate's admissions per window: the limit's record
	// keeps the start of each admission in the window.
	MaxRate = 1000
	MinPer  = time.Second
	MaxPer  = 7 * 24 * time.Hour
	// MaxShare bounds a share key, in bytes.
	MaxShare = 128
)

// A Rate allows at most N admissions in any window of length Per.
type Rate struct {
	N   int           `json:"n"`
	Per time.Duration `json:"per"`
}

// String is the rate as ParseRate reads it ("10/1m0s").
func (r Rate) String() string {
	if r.N == 0 {
		return "0"
	}
	return strconv.Itoa(r.N) + "/" + r.Per.String()
}

// ParseRate reads N/D (10/1m, 1/1h; "0" is no rate).
func ParseRate(s string) (Rate, error) {
	if s == "0" {
		return Rate{}, nil
	}
	n, d, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, fmt.Errorf("%w: rate %q: want N/DURATION (10/1m) or 0", ErrInvalid, s)
	}
	var r Rate
	var err error
	if r.N, err = strconv.Atoi(n); err != nil {
		return Rate{}, fmt.Errorf("%w: rate %q: want N/DURATION (10/1m) or 0", ErrInvalid, s)
	}
	if r.Per, err = time.ParseDuration(d); err != nil {
		return Rate{}, fmt.Errorf("%w: rate %q: want N/DURATION (10/1m) or 0", ErrInvalid, s)
	}
	return r, r.Check()
}

// Check returns an error wrapping ErrInvalid for a rate out of bounds; the
// zero Rate is no rate.
func (r Rate) Check() error {
	if r == (Rate{}) {
		return nil
	}
	if r.N < 1 || r.N > MaxRate || r.Per < MinPer || r.Per > MaxPer {
		return fmt.Errorf("%w: rate %s: want 1-%d admissions per %s to %s, or 0", ErrInvalid, r, MaxRate, MinPer, MaxPer)
	}
	return nil
}

// A Policy is a limit's scheduling policy. The zero Policy is FIFO with no rate.
type Policy struct {
	Order Order `json:"order,omitempty"`
	// Aging is how long a waiter of a ByPriority limit waits for each point
	// its effective priority gains; 0 means DefaultAging.
	Aging time.Duration `json:"aging,omitempty"`
	Rate  Rate          `json:"rate,omitzero"`
}

// Check returns an error wrapping ErrInvalid for a policy a limit cannot have.
func (p Policy) Check() error {
	switch p.Order {
	case "", FIFO, ByPriority, Fair:
	default:
		return fmt.Errorf("%w: order %q: want fifo, priority or fair", ErrInvalid, p.Order)
	}
	if p.Aging != 0 && (p.Aging < time.Second || p.Aging > MaxPer) {
		return fmt.Errorf("%w: aging %s: want %s to %s", ErrInvalid, p.Aging, time.Second, MaxPer)
	}
	return p.Rate.Check()
}

// IsFIFO reports whether p is the default: ticket order, no rate.
func (p Policy) IsFIFO() bool { return p.Ordered() == FIFO && p.Rate.N == 0 }

// Ordered is p's order, FIFO for "" (the default).
func (p Policy) Ordered() Order {
	if p.Order == "" {
		return FIFO
	}
	return p.Order
}

// AgingOr is the aging in force: Aging, or DefaultAging.
func (p Policy) AgingOr() time.Duration {
	if p.Aging <= 0 {
		return DefaultAging
	}
	return p.Aging
}

// String describes p as limit ls shows it: "fifo", "priority aging 1m0s",
// "fair", each followed by " rate N/D" when rated.
func (p Policy) String() string {
	s := string(p.Ordered())
	if p.Ordered() == ByPriority {
		s += " aging " + p.AgingOr().String()
	}
	if p.Rate.N > 0 {
		s += " rate " + p.Rate.String()
	}
	return s
}

// A PolicyChange says which parts of a limit's policy to set; nil leaves a
// part as it is. Order FIFO also clears Aging; a zero Rate clears the rate.
type PolicyChange struct {
	Order *Order
	Aging *time.Duration
	Rate  *Rate
}

// Apply is p changed by ch.
func (p Policy) Apply(ch PolicyChange) Policy {
	if ch.Order != nil {
		p.Order = *ch.Order
		if p.Order == FIFO || p.Order == "" {
			p.Order, p.Aging = "", 0
		}
	}
	if ch.Aging != nil {
		p.Aging = *ch.Aging
	}
	if ch.Rate != nil {
		p.Rate = *ch.Rate
	}
	return p
}

// CheckPriority returns an error wrapping ErrInvalid for a priority out of
// MinPriority..MaxPriority.
func CheckPriority(p int) error {
	if p < MinPriority || p > MaxPriority {
		return fmt.Errorf("%w: priority %d: want %d to %d", ErrInvalid, p, MinPriority, MaxPriority)
	}
	return nil
}

// CheckShare returns an error wrapping ErrInvalid for a share key that is
// too long or not printable; "" is the holder's user.
func CheckShare(s string) error {
	if len(s) > MaxShare || !IsPrintable(s) {
		return fmt.Errorf("%w: share %q: want 1-%d printable characters", ErrInvalid, s, MaxShare)
	}
	return nil
}

// ShareKey is the share a ticket counts against in a Fair limit: its
// Share, else its holder's user.
func (t Ticket) ShareKey() string {
	if t.Share != "" {
		return t.Share
	}
	return t.Holder.User
}

// Effective is t's effective priority at now under p: its Priority plus
// one point per p.AgingOr() since it was created.
func (p Policy) Effective(t Ticket, now time.Time) int {
	return p.effective(t.Priority, t.Created, now)
}

func (p Policy) effective(priority int, created, now time.Time) int {
	waited := now.Sub(created)
	if waited <= 0 {
		return priority
	}
	// Ten years of waiting at most: the points fit Arrange's keys.
	return priority + int(min(waited, 10*365*24*time.Hour)/p.AgingOr())
}

// InWindow is the starts of admissions that count against p's rate at now:
// those less than Per ago, in the order given (oldest first).
func (p Policy) InWindow(starts []time.Time, now time.Time) []time.Time {
	if p.Rate.N == 0 {
		return nil
	}
	from := now.Add(-p.Rate.Per)
	i := 0
	for i < len(starts) && !starts[i].After(from) {
		i++
	}
	return starts[i:]
}

// Tokens is how many admissions p's rate allows at now, given the starts of
// the admissions before (oldest first); -1 when p has no rate.
func (p Policy) Tokens(starts []time.Time, now time.Time) int {
	if p.Rate.N == 0 {
		return -1
	}
	return max(p.Rate.N-len(p.InWindow(starts, now)), 0)
}

// Opens is when the k-th admission from now (1-based) may happen by p's
// rate, given the starts before (oldest first): now while tokens last,
// else when enough of the window's starts have aged out, a whole window
// per Rate.N admissions beyond those. The zero time when p has no rate.
func (p Policy) Opens(starts []time.Time, now time.Time, k int) time.Time {
	if p.Rate.N == 0 {
		return time.Time{}
	}
	in := p.InWindow(starts, now)
	free := p.Rate.N - len(in)
	// Admission i (0-based, i < Rate.N) is at now while tokens are free,
	// then as each start of the window ages out; each admission frees its
	// own token a window later.
	i, laps := (k-1)%p.Rate.N, (k-1)/p.Rate.N
	first := now
	if i >= free {
		first = in[i-free].Add(p.Rate.Per)
	}
	return first.Add(time.Duration(laps) * p.Rate.Per)
}

// Charge is starts after n admissions at now: the starts still in p's
// window, then now n times, at most Rate.N kept. starts is not changed.
func (p Policy) Charge(starts []time.Time, now time.Time, n int) []time.Time {
	if p.Rate.N == 0 {
		return nil
	}
	out := slices.Clone(p.InWindow(starts, now))
	for range n {
		out = append(out, now)
	}
	if len(out) > p.Rate.N {
		out = out[len(out)-p.Rate.N:]
	}
	return out
}

// Arrange orders the waiting tickets of one limit as p admits them, and
// returns their indexes in waiting in that order. held is the limit's held
// tickets (a Fair limit counts their slots by share) and waiting its
// waiting ones in ticket (fence) order; now is the store's clock.
//
// FIFO keeps ticket order. ByPriority sorts by effective priority, highest
// first, then ticket order. Fair sorts by the slots the ticket's share
// holds plus the weight of its share's waiters ahead of it, fewest first,
// then ticket order: one share's hundred waiters take turns with another's
// one, which is what "the share holding the fewest slots goes first" gives
// when waiters are admitted one at a time.
func (p Policy) Arrange(held, waiting []*Ticket, now time.Time) []int {
	ix := make([]int, len(waiting))
	for i := range ix {
		ix[i] = i
	}
	// Each waiter's sort key, its index in the low bits: one sort of
	// integers, ties in ticket order.
	var keys []int64
	switch p.Ordered() {
	case ByPriority:
		keys = make([]int64, len(waiting))
		for i, t := range waiting {
			keys[i] = -int64(p.effective(t.Priority, t.Created, now))<<32 | int64(i)
		}
	case Fair:
		load := map[string]*int{} // by share: one lookup a ticket
		at := func(t *Ticket) *int {
			n := load[t.ShareKey()]
			if n == nil {
				n = new(int)
				load[t.ShareKey()] = n
			}
			return n
		}
		for _, t := range held {
			*at(t) += t.Weighs()
		}
		keys = make([]int64, len(waiting))
		for i, t := range waiting {
			n := at(t)
			keys[i] = int64(*n)<<32 | int64(i)
			*n += t.Weighs()
		}
	default:
		return ix
	}
	slices.Sort(keys)
	for k, key := range keys {
		ix[k] = int(key & (1<<32 - 1))
	}
	return ix
}
