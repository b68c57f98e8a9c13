package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/slotctl/slotctl/store"
)

// Heads (store.Heads) is the Snapshot cut to its heads: each limit's counts,
// its held tickets and its first waiter, whichever backend answers it —
// with tickets of several limits and weights, a first waiter that is not
// the oldest ticket, and more holders than a backend may read at once.
func testHeads(s *suite) {
	multi := func(name string, weight int, limits ...string) store.Ticket {
		s.Helper()
		r := s.req(name, "", 2)
		r.Limits, r.Weight = limits, weight
		return s.enqReq(r)
	}
	s.enq("A1", "a", 2)
	a2 := s.enq("A2", "a", 2)
	multi("AB1", 2, "a", "b") // waits in a (weight 2, one slot left)
	s.enq("A3", "a", 2)
	s.enq("B1", "b", 2) // held in b beside nobody: AB1 waits in a only
	s.setLimit("c", 1)
	for i := range 40 {
		s.enq(fmt.Sprintf("D%d", i), "d", 40)
	}
	s.enq("D40", "d", 40)
	s.enq("D41", "d", 40)

	check := func(when string, limits ...string) {
		s.Helper()
		// The two reads must not straddle a lease's end.
		s.keepAll()
		full, err := s.st.Snapshot(s.ctx, limits...) // not s.snap: its checks hold for FIFO limits only
		if err != nil {
			s.Fatalf("%s: Snapshot(%q): %v", when, limits, err)
		}
		want := full.Heads()
		got, err := store.Heads(s.ctx, s.st, limits...)
		if err != nil {
			s.Fatalf("%s: Heads(%q): %v", when, limits, err)
		}
		if !reflect.DeepEqual(got.Limits, want.Limits) {
			s.Errorf("%s: Heads(%q) limits %+v, want Snapshot's %+v", when, limits, got.Limits, want.Limits)
		}
		strip := func(ts []store.Ticket) []store.Ticket {
			out := []store.Ticket{}
			for _, t := range ts {
				t.Remaining = 0 // Heads may leave it unread
				out = append(out, t)
			}
			return out
		}
		if g, w := strip(got.Tickets), strip(want.Tickets); !reflect.DeepEqual(g, w) {
			s.Errorf("%s: Heads(%q) tickets\n%s\nwant Snapshot's heads\n%s", when, limits, s.listed(g), s.listed(w))
		}
	}
	check("queued")
	check("queued", "a")
	check("queued", "b", "c")
	check("queued", "d")
	s.release(a2, true) // AB1 is admitted in both limits
	check("A2 released")
	check("A2 released", "a", "b")

	// Orders whose first waiter is not the oldest (priority, fair), and a
	// FIFO limit with a rate: the heads are still Snapshot's.
	s.setLimit("p", 1)
	s.enq("P0", "p", 1)
	s.enqP("P1", lims("p"), 1, 1, 0, "")
	s.enqP("P2", lims("p"), 1, 1, 7, "")
	s.enqP("P3", lims("p"), 1, 1, 3, "")
	s.setPolicy("p", store.PolicyChange{Order: ordP(store.ByPriority)}, store.Policy{Order: store.ByPriority})
	s.setLimit("f", 2)
	s.enqP("F0", lims("f"), 1, 2, 0, "u1")
	s.enqP("F1", lims("f"), 1, 2, 0, "u1")
	s.enqP("F2", lims("f"), 1, 2, 0, "u1")
	s.enqP("F3", lims("f"), 1, 2, 0, "u2")
	s.setPolicy("f", store.PolicyChange{Order: ordP(store.Fair)}, store.Policy{Order: store.Fair})
	s.setLimit("r", 1)
	s.enq("R0", "r", 1)
	s.enq("R1", "r", 1)
	s.enq("R2", "r", 1)
	s.setPolicy("r", store.PolicyChange{Rate: rateP(1, time.Hour)}, store.Policy{Rate: store.Rate{N: 1, Per: time.Hour}})
	check("policies")
	check("policies", "p", "f", "r")

	// A limit that does not exist: as Snapshot answers.
	_, want := s.st.Snapshot(s.ctx, "a", "nope")
	if _, err := store.Heads(s.ctx, s.st, "a", "nope"); errors.Is(err, store.ErrLimitNotFound) != errors.Is(want, store.ErrLimitNotFound) {
		s.Errorf("Heads of a limit that does not exist: %v; Snapshot's: %v", err, want)
	}
}

// keepAll renews every ticket in the store: on a store in real time a
// case's steps may take most of a TTL (under the race detector, on a
// loaded machine), and what it compares must not change by expiry.
func (s *suite) keepAll() {
	s.Helper()
	sn, err := s.st.Snapshot(s.ctx)
	if err != nil {
		s.Fatalf("Snapshot: %v", err)
	}
	for _, t := range sn.Tickets {
		if _, err := s.st.Renew(s.ctx, t, s.h.TTL); err != nil {
			s.Fatalf("Renew %s: %v", s.who(t.ID), err)
		}
	}
}

// listed is one line per ticket: its name, limit, state and place.
func (s *suite) listed(ts []store.Ticket) string {
	out := ""
	for _, t := range ts {
		out += fmt.Sprintf("  %s in %s: %s, position %d, limits %q, weight %d\n", s.who(t.ID), t.Limit, t.State, t.Position, t.Limits, t.Weight)
	}
	return out
}
