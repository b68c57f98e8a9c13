package store

import (
	"cmp"
	"slices"
)

// AddLimit appends a limit and its tickets to the snapshot in the order
// Snapshot promises: its held tickets, then its waiting ones, each by
// fence. It counts the limit's Held and Waiting (l's counts are replaced)
// and numbers the waiters' Position from 1, every backend the same way.
func (s *Snapshot) AddLimit(l Limit, tickets []Ticket) {
	tickets = slices.Clone(tickets)
	slices.SortStableFunc(tickets, func(a, b Ticket) int { return cmp.Compare(a.Fence, b.Fence) })
	l.Held, l.Waiting = 0, 0
	var waiting []Ticket
	for _, t := range tickets {
		if t.State == Held {
			l.Held++
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
