package storetest_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// Scheduling policies in the reference store, written by hand rather than
// with store.Policy's helpers or policy.PlanSettle, so that the suite's
// cases check the planner against an independent reading of the rules: a
// limit orders its waiters by ticket (FIFO), by effective priority (its
// priority plus a point per aging waited) or by the slots their share holds
// (fair), ties by ticket; settle walks the waiters in one order that keeps
// each limit's order where the limits agree (the oldest waiter first in all
// of its limits; when none is, the oldest first in one of them), and a rate
// counts the admissions of its window, charged in the settle that admits.

// SetPolicy implements store.Store.
func (s *memStore) SetPolicy(_ context.Context, name string, ch store.PolicyChange) (store.Limit, error) {
	if err := s.closedErr(); err != nil {
		return store.Limit{}, err
	}
	if err := store.CheckLimitName(name); err != nil && !s.lax() {
		return store.Limit{}, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	l := s.d.limits[name]
	if l == nil {
		return store.Limit{}, fmt.Errorf("%w: %s", store.ErrLimitNotFound, name)
	}
	p := l.policy
	if s.is("setpolicy-replaces") {
		p = store.Policy{} // the parts not named are reset, not kept
	}
	if ch.Order != nil {
		p.Order = *ch.Order
		if p.Order == store.FIFO || p.Order == "" {
			p.Order, p.Aging = "", 0
		}
	}
	if ch.Aging != nil {
		p.Aging = *ch.Aging
	}
	if ch.Rate != nil {
		p.Rate = *ch.Rate
	}
	if err := p.Check(); err != nil && !s.lax() && !s.is("policy-unchecked") {
		return store.Limit{}, err
	}
	if p.Rate != l.policy.Rate {
		// The new window counts the admissions of the old one it covers.
		l.starts = s.inWindow(p, l.starts)
		if len(l.starts) > p.Rate.N {
			l.starts = l.starts[len(l.starts)-p.Rate.N:]
		}
	}
	l.policy = p
	if !s.is("setpolicy-no-settle") {
		s.settle(nil, []string{name})
	}
	lim, _ := s.limitView(name)
	return lim, nil
}

// inWindow is the starts p's rate counts now (bug "rate-no-slide": all).
func (s *memStore) inWindow(p store.Policy, starts []time.Time) []time.Time {
	if p.Rate.N == 0 {
		return nil
	}
	if s.is("rate-no-slide") {
		return slices.Clone(starts)
	}
	var out []time.Time
	for _, t := range starts {
		if s.wallNow().Sub(t) < p.Rate.Per {
			out = append(out, t)
		}
	}
	return out
}

// effective is t's priority plus a point per aging it has waited.
func (s *memStore) effective(p store.Policy, t *memTicket) int {
	aging := p.Aging
	if aging == 0 {
		aging = store.DefaultAging
	}
	waited := s.wallNow().Sub(t.t.Created)
	if waited <= 0 || s.is("aging-off") {
		return t.t.Priority
	}
	return t.t.Priority + int(waited/aging)
}

// shareOf is the share t counts against in a fair limit.
func shareOf(t *memTicket) string {
	if t.t.Share != "" {
		return t.t.Share
	}
	return t.t.Holder.User
}

// arrange orders the waiters of limit l (given in fence order, beside its
// holders) as l's policy admits them.
func (s *memStore) arrange(l *memLimit, held, waiting []*memTicket) []*memTicket {
	out := slices.Clone(waiting)
	if l == nil {
		return out
	}
	key := map[*memTicket]int{}
	switch {
	case l.policy.Order == store.ByPriority && !s.is("priority-ignored"):
		for _, t := range out {
			key[t] = -s.effective(l.policy, t)
		}
	case l.policy.Order == store.Fair && !s.is("fair-ignored"):
		slotsOf := func(t *memTicket) int {
			if s.is("fair-counts-tickets") {
				return 1
			}
			return t.w
		}
		holds := map[string]int{}
		for _, t := range held {
			holds[shareOf(t)] += slotsOf(t)
		}
		for _, t := range out { // its share's holders, and its share's waiters ahead of it
			key[t] = holds[shareOf(t)]
			holds[shareOf(t)] += slotsOf(t)
		}
	default:
		return out
	}
	slices.SortStableFunc(out, func(a, b *memTicket) int { return cmp.Compare(key[a], key[b]) })
	return out
}

// queueOf is limit's holders by fence and its waiters in its policy's order.
func (s *memStore) queueOf(limit string) (held, waiting []*memTicket) {
	held, waiting = s.d.inLimit(limit)
	return held, s.arrange(s.d.limits[limit], held, waiting)
}

// ordered reports whether a limit orders its waiters by other than ticket.
func (l *memLimit) ordered() bool {
	return l != nil && l.policy.Order != "" && l.policy.Order != store.FIFO
}

// scheduled is the order settle goes through waiting (in fence order): the
// oldest waiter that is first, among those not yet placed, in each of its
// limits; when there is none (the limits disagree), the oldest that is
// first in one of them (bug "deadlock": nobody, and the rest wait).
func (s *memStore) scheduled(waiting []*memTicket) []*memTicket {
	seqs := map[string][]*memTicket{}
	ordered := false
	for _, t := range waiting {
		for _, n := range t.names {
			if _, done := seqs[n]; done || s.d.limits[n] == nil {
				continue
			}
			ordered = ordered || s.d.limits[n].ordered()
			var held, in []*memTicket
			for _, o := range s.d.tickets {
				if o.in(n) {
					held = append(held, o)
				}
			}
			slices.SortFunc(held, func(a, b *memTicket) int { return cmp.Compare(a.t.Fence, b.t.Fence) })
			for _, o := range waiting {
				if slices.Contains(o.names, n) && !o.in(n) {
					in = append(in, o)
				}
			}
			seqs[n] = s.arrange(s.d.limits[n], held, in)
		}
	}
	if !ordered {
		return waiting
	}
	placed := map[*memTicket]bool{}
	first := func(n string) *memTicket {
		for _, o := range seqs[n] {
			if !placed[o] {
				return o
			}
		}
		return nil
	}
	heads := func(t *memTicket, all bool) bool {
		names := t.names
		if s.is("order-first-limit") {
			names = names[:1]
		}
		some := false
		for _, n := range names {
			if _, ok := seqs[n]; !ok {
				continue
			}
			if first(n) == t {
				some = true
			} else if all {
				return false
			}
		}
		return all || some
	}
	out := make([]*memTicket, 0, len(waiting))
	for len(out) < len(waiting) {
		i := slices.IndexFunc(waiting, func(t *memTicket) bool { return !placed[t] && heads(t, true) })
		if i < 0 && !s.is("deadlock") {
			i = slices.IndexFunc(waiting, func(t *memTicket) bool { return !placed[t] && heads(t, false) })
		}
		if i < 0 {
			break
		}
		placed[waiting[i]] = true
		out = append(out, waiting[i])
	}
	return out
}

// rated is each rated limit's admissions left now and the starts of its window.
func (s *memStore) rated() (tokens map[string]int, starts map[string][]time.Time) {
	tokens, starts = map[string]int{}, map[string][]time.Time{}
	for n, l := range s.d.limits {
		if l.policy.Rate.N == 0 {
			continue
		}
		starts[n] = s.inWindow(l.policy, l.starts)
		tokens[n] = l.policy.Rate.N - len(starts[n])
	}
	if len(tokens) > 0 && s.is("rate-racy") {
		// Decide on a stale read of the starts: the charge is another step.
		s.d.mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
		s.d.mu.Lock()
	}
	return tokens, starts
}

// charge writes the starts of the admissions a settle made, at now.
func (s *memStore) charge(starts map[string][]time.Time, charged map[string]int) {
	if s.is("rate-uncharged") {
		return
	}
	for n, c := range charged {
		l := s.d.limits[n]
		if l == nil || c == 0 {
			continue
		}
		st := slices.Clone(starts[n])
		for range c {
			st = append(st, s.wallNow())
		}
		if len(st) > l.policy.Rate.N {
			st = st[len(st)-l.policy.Rate.N:]
		}
		l.starts = st
	}
}

// limitView is a limit as a snapshot lists it, and its tickets: holders,
// then waiters in its policy's order, numbered, each with its effective
// priority in a priority limit; the starts of its rate's window, and when
// the rate is spent, when the window opens.
func (s *memStore) limitView(n string) (store.Limit, []store.Ticket) {
	l := s.d.limits[n]
	held, waiting := s.queueOf(n)
	if s.is("snapshot-fence-order") {
		_, waiting = s.d.inLimit(n)
	}
	lim := store.Limit{Name: n, Slots: l.slots, Held: slotsHeld(n, held), Waiting: len(waiting), Created: l.created, Policy: l.policy}
	if l.policy.Rate.N > 0 {
		lim.Starts = s.inWindow(l.policy, l.starts)
		if len(lim.Starts) >= l.policy.Rate.N {
			lim.Opens = lim.Starts[len(lim.Starts)-l.policy.Rate.N].Add(l.policy.Rate.Per)
		}
	}
	var out []store.Ticket
	for _, t := range held {
		out = append(out, s.under(t, n))
	}
	for i, t := range waiting {
		v := s.under(t, n)
		v.Position = i + 1
		if l.policy.Order == store.ByPriority {
			e := s.effective(l.policy, t)
			v.Effective = &e
		}
		out = append(out, v)
	}
	return lim, out
}
