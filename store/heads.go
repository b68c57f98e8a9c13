package store

import "context"

// A HeadReader reads less than a Snapshot, at a cost that does not grow
// with the queue: each limit's counts and the tickets at its head. It is
// what a waiting run's status line reads every time it is drawn, and what
// the metrics read; a queue of thousands, each waiter reading the whole
// queue, would cost the store the square of the queue.
type HeadReader interface {
	// Heads returns the named limits (all when none) with their Held and
	// Waiting counts, and of their tickets the held ones and the first
	// waiting one (Position 1), ordered as Snapshot orders them.
	// Remaining may be left zero: reading each lease may cost a request.
	// The limits may be read at different revisions.
	Heads(ctx context.Context, limits ...string) (Snapshot, error)
}

// Heads reads the heads of st's limits: with st's HeadReader when it has
// one, else from a Snapshot (Snapshot.Heads).
func Heads(ctx context.Context, st Store, limits ...string) (Snapshot, error) {
	if h, ok := st.(HeadReader); ok {
		return h.Heads(ctx, limits...)
	}
	snap, err := st.Snapshot(ctx, limits...)
	if err != nil {
		return Snapshot{}, err
	}
	return snap.Heads(), nil
}

// Heads is s cut to what HeadReader.Heads returns: each limit's held
// tickets and its first waiter; the limits' counts stay.
func (s Snapshot) Heads() Snapshot {
	out := Snapshot{Now: s.Now, Limits: s.Limits, Tickets: []Ticket{}}
	for _, t := range s.Tickets {
		if t.State == Held || t.Position == 1 {
			out.Tickets = append(out.Tickets, t)
		}
	}
	return out
}
