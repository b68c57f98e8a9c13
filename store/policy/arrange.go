package policy

import (
	"container/heap"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// arrange is the order the settle's phases go through the tickets: first
// every ticket that does not wait, in input order, then the waiters in one
// order that agrees with the order of each of their limits (store.Policy.
// Arrange). A waiter comes next when it is first, among those not yet
// placed, in every one of its limits; of several such, the oldest ticket.
// Limits of different orders can disagree (a fair limit puts A before B, a
// priority limit B before A): then no waiter is first in all of its
// limits, and the oldest ticket first in one of them goes next. Any order
// keeps the settle free of deadlock, since a waiter is blocked only by one
// placed before it; this one keeps each limit's own order wherever the
// limits agree, and ticket order where all of them are FIFO.
func (s *settling) arrange() []int {
	n := len(s.in.Tickets)
	if s.fifo {
		if s.order == nil {
			s.order = make([]int, n)
			for i := range s.order {
				s.order[i] = i
			}
		}
		return s.order
	}
	seqs := s.sequences()
	out := make([]int, 0, n)
	for i, q := range s.in.Tickets {
		if !s.waits(i, q) {
			out = append(out, i)
		}
	}
	if len(seqs) == 1 && len(out)+len(seqs[0]) == n {
		return append(out, seqs[0]...) // one limit: its own order
	}
	m := merger{seqs: seqs, need: make([]int, n), at: make([]int, n), done: make([]bool, n)}
	return m.merge(out)
}

// reorder reports whether the removals the judge decided may change the
// order: a removed holder changes a fair limit's holdings. Removed waiters
// only leave their places, which the phases skip.
func (s *settling) reorder() bool {
	if s.fifo || len(s.plan.Remove) == 0 {
		return false
	}
	for name := range s.per {
		if s.in.Policies[name].Ordered() == store.Fair {
			return true
		}
	}
	return false
}

// waits reports whether ticket i is a waiter the order places by its
// limits: waiting, not removed, and of at least one sized limit.
func (s *settling) waits(i int, q Queued) bool {
	_, _, ok := s.known(i)
	return ok && q.Ticket.State != store.Held && !s.gone[i]
}

// sequences is each sized limit's waiters in the order its policy admits
// them (store.Policy.Arrange), the holdings of a fair limit counted from
// the holders the settle keeps so far.
func (s *settling) sequences() [][]int {
	type queue struct {
		name          string
		held, waiting []*store.Ticket
		idx           []int
	}
	qs := make(map[*count]*queue, len(s.per))
	for name, c := range s.per {
		qs[c] = &queue{name: name}
	}
	firstOnly := s.in.Mutations.Has(mutation.OrderFirstLimit)
	for i := range s.in.Tickets {
		q := &s.in.Tickets[i]
		cs, _, ok := s.known(i)
		if s.gone[i] || !ok {
			continue
		}
		held := q.Ticket.State == store.Held
		for _, c := range cs {
			if !held && firstOnly && c != s.per[q.Ticket.Names()[0]] { // mutation (test-only): only a waiter's first limit orders it (P1)
				continue
			}
			l := qs[c]
			if held {
				l.held = append(l.held, &q.Ticket)
			} else {
				l.waiting, l.idx = append(l.waiting, &q.Ticket), append(l.idx, i)
			}
		}
	}
	ls := make([]*queue, 0, len(qs))
	for _, l := range qs {
		if len(l.waiting) > 0 {
			ls = append(ls, l)
		}
	}
	slices.SortFunc(ls, func(a, b *queue) int { return strings.Compare(a.name, b.name) }) // the sequences' order decides nothing; keep it stable anyway
	seqs := make([][]int, 0, len(ls))
	for _, l := range ls {
		pol := s.in.Policies[l.name]
		if s.in.Mutations.Has(mutation.AgingOff) { // mutation (test-only): priority without aging (P3)
			pol.Aging = math.MaxInt64
		}
		seq := make([]int, len(l.idx))
		for k, j := range pol.Arrange(l.held, l.waiting, s.in.Now) {
			seq[k] = l.idx[j]
		}
		seqs = append(seqs, seq)
	}
	return seqs
}

// A merger places waiters from the limits' sequences (arrange): a waiter
// is ready once it is first, among the waiters not yet placed, in each
// sequence it is in (need of them; at counts those); ready ones go oldest
// first (a heap of input indexes, the input being in ticket order).
type merger struct {
	seqs   [][]int
	need   []int
	at     []int
	next   []int // each sequence's first waiter not yet placed
	headed []int // the place in each sequence whose waiter at counted; -1 none
	done   []bool
	ready  indexHeap
}

func (m *merger) merge(out []int) []int {
	// The sequences each waiter is in, flat: in[from[i]:from[i+1]].
	from := make([]int, len(m.need)+1)
	for _, seq := range m.seqs {
		for _, i := range seq {
			m.need[i]++
		}
	}
	waiters := 0
	for i, n := range m.need {
		from[i+1] = from[i] + n
		if n > 0 {
			waiters++
		}
	}
	in, fill := make([]int, from[len(m.need)]), slices.Clone(from[:len(m.need)])
	m.next, m.headed = make([]int, len(m.seqs)), make([]int, len(m.seqs))
	for si, seq := range m.seqs {
		for _, i := range seq {
			in[fill[i]] = si
			fill[i]++
		}
		m.headed[si] = -1
	}
	for si := range m.seqs {
		m.advance(si)
	}
	for range waiters {
		i := m.pick()
		m.done[i] = true
		out = append(out, i)
		for _, si := range in[from[i]:from[i+1]] {
			m.advance(si)
		}
	}
	return out
}

// advance moves sequence si past its placed waiters; a waiter first in it
// for the first time counts one more sequence it heads, and is ready when
// it heads all of its own.
func (m *merger) advance(si int) {
	seq, k := m.seqs[si], m.next[si]
	for k < len(seq) && m.done[seq[k]] {
		k++
	}
	m.next[si] = k
	if k == len(seq) || m.headed[si] == k {
		return
	}
	m.headed[si] = k
	i := seq[k]
	if m.at[i]++; m.at[i] == m.need[i] {
		heap.Push(&m.ready, i)
	}
}

// pick is the next waiter to place: the oldest ready one, else (the limits
// disagree) the oldest that is first in one of its sequences.
func (m *merger) pick() int {
	for m.ready.Len() > 0 {
		if i := heap.Pop(&m.ready).(int); !m.done[i] {
			return i
		}
	}
	best := -1
	for si, seq := range m.seqs {
		if k := m.next[si]; k < len(seq) && (best < 0 || seq[k] < best) {
			best = seq[k]
		}
	}
	return best
}

// indexHeap is a min-heap of ticket indexes.
type indexHeap []int

func (h indexHeap) Len() int           { return len(h) }
func (h indexHeap) Less(a, b int) bool { return h[a] < h[b] }
func (h indexHeap) Swap(a, b int)      { h[a], h[b] = h[b], h[a] }
func (h *indexHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *indexHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// charge is the plan's new starts of each rated limit it admits to, and
// the waiters left first in each of those whose rate it spent (Wake).
func (s *settling) charge() {
	spent := map[*count]bool{}
	for name, c := range s.per {
		if c.charged == 0 {
			continue
		}
		if s.plan.Starts == nil {
			s.plan.Starts = map[string][]time.Time{}
		}
		s.plan.Starts[name] = s.in.Policies[name].Charge(s.in.Starts[name], s.in.Now, c.charged)
		spent[c] = c.tokens == 0
	}
	if len(spent) == 0 {
		return
	}
	for _, i := range s.order {
		cs, _, ok := s.known(i)
		if !ok || s.gone[i] || s.in.Tickets[i].Ticket.State == store.Held {
			continue
		}
		woken := false
		for _, c := range cs {
			if spent[c] && !woken {
				s.plan.Wake, woken = append(s.plan.Wake, i), true
			}
			delete(spent, c) // first waiter of c found
		}
		if len(spent) == 0 {
			break
		}
	}
	slices.Sort(s.plan.Wake)
}
