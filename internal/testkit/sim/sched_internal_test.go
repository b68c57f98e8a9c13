package sim

import (
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// TestFairOrderAcrossAPriorityLimitOnEtcd: a fair limit L1 puts batch's
// waiter w ahead of ci's p (ci holds a slot there); both wait in priority
// limit L0 too, where w is ahead by the step's clock and p catches up 50 ms
// later. etcd's planner reads its own clock, up to the slack ahead: there
// the limits may have disagreed (each puts another first), and p, the
// older, went first: no violation, although on the step's clock alone w is
// first in both limits. Where p cannot catch up in the slack, it is one:
// L13's in L1, and L11's in L0, which the step judges first.
func TestFairOrderAcrossAPriorityLimitOnEtcd(t *testing.T) {
	for _, tc := range []struct {
		name     string
		catchUp  time.Duration // after the step's clock, when p's aging ties it with w in L0
		violates bool
	}{
		{"within the slack", 50 * time.Millisecond, false},
		{"beyond it", 900 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A clock ahead of real time: no lag, the slack is the server's
			// jitter alone.
			s := &sim{be: &Etcd{now: Instant{Boot: "etcd", Mono: proc.Boottime() + time.Hour}}}
			if d := s.slack(); d != etcdJitter {
				t.Fatalf("slack %v, want %v", d, etcdJitter)
			}
			s.m = newModel(s)
			m := s.m
			now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
			m.limits["L0"] = &mLimit{slots: 1, pol: store.Policy{Order: store.ByPriority, Aging: time.Second}}
			m.limits["L1"] = &mLimit{slots: 2, pol: store.Policy{Order: store.Fair}}
			held := &mTicket{id: "h0000000", limits: []string{"L1"}, weight: 1, fence: 1, state: store.Held, share: "ci", created: now.Add(-time.Minute)}
			// p: priority 0, one point of aging a second; two points at now+catchUp.
			p := &mTicket{id: "p0000000", limits: []string{"L0", "L1"}, weight: 1, fence: 2, state: store.Held, share: "ci",
				created: now.Add(tc.catchUp - 2*time.Second)}
			w := &mTicket{id: "w0000000", limits: []string{"L1", "L0"}, weight: 1, fence: 3, state: store.Waiting, share: "batch", prio: 2, created: now}
			for _, x := range []*mTicket{held, p, w} {
				m.live[x.id] = x
			}
			// L1's judgement, as the step's settle saw it (one writing
			// call: its waiters and holders exactly).
			st := &settle{m: m, now: now, exact: true, promoted: []*mTicket{p}, all: m.sorted(), fair: map[string]map[*mTicket]int{}}
			st.waiters = []*mTicket{p, w}
			m.ordered("L1", m.limits["L1"].pol, st.promoted, st)
			switch {
			case tc.violates && (s.viol == nil || s.viol.Rule != "L13"):
				t.Fatalf("admitting p past w, first in both limits: %v, want an L13 violation", s.viol)
			case !tc.violates && s.viol != nil:
				t.Fatalf("admitting p, which L0 may have put first on the planner's clock: %v", s.viol)
			}
			// The whole step: L0 judges first, and where p cannot have
			// caught up there, it is L0's violation (L11).
			s.viol = nil
			m.scheduled([]*mTicket{p}, Instant{Wall: now})
			if want := map[bool]string{true: "L11", false: ""}[tc.violates]; s.viol == nil && want != "" || s.viol != nil && s.viol.Rule != want {
				t.Fatalf("the step: %v, want a violation of %q", s.viol, want)
			}
		})
	}
}
