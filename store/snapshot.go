package store

import (
	"cmp"
	"slices"
)

// AddLimit appends a limit and its tickets to the snapshot in the order
// Snapshot promises: its held tickets by fence, then its waiting ones in
// the order its policy admits them (Policy.Arrange at s.Now). It counts the
// limit's Held (slots: a ticket counts its weight) and Waiting (tickets),
// replacing l's counts, numbers the waiters' Position from 1, sets each
// waiter's Effective priority in a ByPriority limit and the limit's Opens
// when its rate is spent, every backend the same way. Each ticket is shown
// under l (Ticket.Under): a ticket of several limits is added under each.
// Set s.Now first.
func (s *Snapshot) AddLimit(l Limit, tickets []Ticket) {
	// The caller's tickets are read, not reordered or changed: each is
	// copied once, into s (a store's Snapshot of thousands copies a lot).
	byFence := func(a, b Ticket) int { return cmp.Compare(a.Fence, b.Fence) }
	if !slices.IsSortedFunc(tickets, byFence) { // a backend reads them in fence order
		tickets = slices.Clone(tickets)
		slices.SortStableFunc(tickets, byFence)
	}
	l.Held, l.Waiting = 0, 0
	s.Tickets = slices.Grow(s.Tickets, len(tickets))
	var held, waiting []*Ticket // Arrange reads what Under leaves alone
	for i := range tickets {
		t := &tickets[i]
		if t.State == Held {
			l.Held += t.Weighs()
			held = append(held, t)
			s.Tickets = append(s.Tickets, t.Under(l.Name))
			continue
		}
		waiting = append(waiting, t)
	}
	for _, i := range l.Policy.Arrange(held, waiting, s.Now) {
		s.Tickets = append(s.Tickets, waiting[i].Under(l.Name))
		t := &s.Tickets[len(s.Tickets)-1]
		l.Waiting++
		t.Position = l.Waiting
		if l.Policy.Order == ByPriority {
			e := l.Policy.Effective(*t, s.Now)
			t.Effective = &e
		}
	}
	l.Starts = l.Policy.InWindow(l.Starts, s.Now)
	if l.Policy.Tokens(l.Starts, s.Now) == 0 {
		l.Opens = l.Policy.Opens(l.Starts, s.Now, 1)
	}
	s.Limits = append(s.Limits, l)
}
