package store

import (
	"cmp"
	"slices"
)

// AddLimit appends a limit and its tickets to the snapshot in the order
// Snapshot promises: its held tickets, then its waiting ones, each by
// fence. It counts the limit's Held (slots: a ticket counts its weight)
// and Waiting (tickets), replacing l's counts, and numbers the waiters'
// Position from 1, every backend the same way. Each ticket is shown under l
// (Ticket.Under): a ticket of several limits is added under each.
func (s *Snapshot) AddLimit(l Limit, tickets []Ticket) {
	tickets = slices.Clone(tickets)
	slices.SortStableFunc(tickets, func(a, b Ticket) int { return cmp.Compare(a.Fence, b.Fence) })
	l.Held, l.Waiting = 0, 0
	var waiting []Ticket
	for _, t := range tickets {
		t = t.Under(l.Name)
		if t.State == Held {
			l.Held += t.Weighs()
			s.Tickets = append(s.Tickets, t)
			continue
		}
		l.Waiting++
		t.Position = l.Waiting
		waiting = append(waiting, t)
	}
	s.Tickets = append(s.Tickets, waiting...)
	s.Limits = append(s.Limits, l)
}
