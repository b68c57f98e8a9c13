package storetest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/slotctl/slotctl/store"
)

// Resize implements store.Store (docs/leases.md §2.1 item 12), written by
// hand rather than with policy.PlanResize, so that the reference checks the
// planner: a shrink keeps the lowest indexes and settles; a growth takes the
// lowest free indexes, as many as every one of its limits has free (an
// expired holder's are not: only its removal frees them), and none while a
// ticket whose lease runs waits in one of them; it removes nobody.
func (s *memStore) Resize(_ context.Context, tk store.Ticket, weight int) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	if (weight < 1 || weight > store.MaxSlots) && !s.lax() {
		return store.Ticket{}, fmt.Errorf("%w: weight %d", store.ErrInvalid, weight)
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	if t == nil {
		if err := s.superseded(tk.ID); err != nil {
			return store.Ticket{}, fmt.Errorf("%w: %w", store.ErrLost, err)
		}
		return store.Ticket{}, fmt.Errorf("%w: %s is gone", store.ErrLost, tk.ID)
	}
	if t.t.Fence != tk.Fence && !s.is("resize-no-fence-check") {
		return store.Ticket{}, fmt.Errorf("%w: %s has another fence", store.ErrLost, tk.ID)
	}
	if t.deadline <= s.now() && !s.is("resize-expired") {
		return store.Ticket{}, fmt.Errorf("%w: %s expired", store.ErrLost, tk.ID)
	}
	if !t.held() {
		if !s.is("resize-waiting") {
			return store.Ticket{}, fmt.Errorf("%w: %s is waiting", store.ErrInvalid, tk.ID)
		}
		t.w = weight // "only the weight it asks for"
		return s.view(t), nil
	}
	switch {
	case weight < t.w:
		for n, ix := range t.ix {
			keep := ix[:weight]
			if s.is("resize-frees-lowest") {
				keep = ix[len(ix)-weight:]
			}
			if l := s.d.limits[n]; l != nil {
				l.used -= len(ix) - weight
			}
			t.ix[n] = slices.Clone(keep)
		}
		s.resized(t, weight)
		if !s.is("resize-shrink-no-settle") {
			s.settle(nil, t.names)
		}
	case weight > t.w:
		room := weight - t.w
		for i, n := range t.names {
			if i > 0 && s.is("resize-first-limit-only") {
				break
			}
			l := s.d.limits[n]
			held, waiting := s.d.inLimit(n)
			live := slices.ContainsFunc(waiting, func(w *memTicket) bool { return w.deadline > s.now() })
			if l == nil || live && !s.is("resize-past-waiter") {
				room = 0
				break
			}
			free := l.slots - l.leak - slotsHeld(n, held)
			if s.is("resize-over-size") {
				free = room
			}
			room = min(room, max(free, 0))
		}
		if s.is("resize-all-or-nothing") && room < weight-t.w {
			room = 0
		}
		if room == 0 {
			break
		}
		for _, n := range t.names {
			used := map[int]bool{}
			held, _ := s.d.inLimit(n)
			for _, o := range held {
				for _, i := range o.ix[n] {
					used[i] = true
				}
			}
			ix := t.ix[n]
			for i := 0; len(ix) < t.w+room; i++ {
				j := i
				if s.is("resize-highest-free") {
					j = s.d.limits[n].slots - 1 - i
				}
				if !used[j] {
					ix = append(ix, j)
				}
			}
			slices.Sort(ix)
			t.ix[n] = ix
			if l := s.d.limits[n]; l != nil {
				l.used += room
			}
		}
		s.resized(t, t.w+room)
		if s.is("resize-growth-outlives-ticket") {
			grown.Lock()
			grown.by[t] += room
			grown.Unlock()
		}
	}
	return s.view(t), nil
}

// grown is what bug "resize-growth-outlives-ticket" remembers: the slots
// each ticket took by growing, kept apart from it (extra slots held as
// something beside the ticket), so that its removal leaves them taken.
var grown = struct {
	sync.Mutex
	by map[*memTicket]int
}{by: map[*memTicket]int{}}

// removedResized is called by remove: with bug
// "resize-growth-outlives-ticket" the slots t took by growing stay taken by
// nobody once it is gone.
func (s *memStore) removedResized(t *memTicket) {
	if !s.is("resize-growth-outlives-ticket") {
		return
	}
	grown.Lock()
	n := grown.by[t]
	delete(grown.by, t)
	grown.Unlock()
	for name := range t.ix {
		if l := s.d.limits[name]; l != nil {
			l.leak += n
		}
	}
}

// resized gives held ticket t weight w (its indexes already w in each
// limit) and logs the change in each of its limits.
func (s *memStore) resized(t *memTicket, w int) {
	t.w = w
	t.t.Slot = t.ix[t.names[0]][0]
	if !s.is("resize-no-event") {
		s.event(store.Resized, t, "")
	}
}

func init() {
	// Each bug of a resize, and the cases that must catch it.
	for bug, cases := range map[string][]string{
		"resize-past-waiter":            {"ResizeGrowBlockedByWaiter"},
		"resize-shrink-no-settle":       {"ResizeShrinkPromotes"},
		"resize-over-size":              {"ResizeCappedBySize", "ResizeGrowPartial"},
		"resize-all-or-nothing":         {"ResizeGrowPartial", "ResizeCappedBySize"},
		"resize-first-limit-only":       {"ResizeGrowPartial"},
		"resize-highest-free":           {"ResizeGrowPartial"},
		"resize-frees-lowest":           {"ResizeShrinkPromotes"},
		"resize-no-fence-check":         {"ResizeRefused"},
		"resize-expired":                {"ResizeRefused"},
		"resize-waiting":                {"ResizeRefused"},
		"resize-no-event":               {"ResizeEvents"},
		"resize-growth-outlives-ticket": {"ResizeRemovalFreesAll"},
	} {
		mutants[bug] = cases
	}
}
