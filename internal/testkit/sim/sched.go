package sim

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// Scheduling policies. In a share of the runs (fault "policies") each
// limit gets a policy at the start: an order (FIFO, priority with a short
// aging, fair) and sometimes a rate of a few admissions per few simulated
// seconds; an operator changes one now and then (SetPolicy), and jobs send
// --priority and --share. The other runs stay FIFO-only, draw for draw what
// they were before policies existed, so the catches of the FIFO rules (L3,
// L4) and of the bugs they find stay where they were. The draws come from
// a stream of their own (sim.policyRng).
//
// The rules (the model's, from the admissions it sees and the policies it
// set, on the store's wall clock, which ages priorities and slides rate
// windows):
//
//	S23 a rated limit admits at most N tickets in any window (t-Per, t]
//	    (counted per admission, whatever its weight)
//	L11 priority order: no ticket p is admitted to a priority limit while a
//	    waiter w of that limit that its order puts ahead of p (a higher
//	    effective priority at the step's clock, ties to the older ticket)
//	    still waits
//	L12 aging bound: nor while such a w was created more than
//	    (100 - w's priority + 1) × aging before p (w is then ahead of p,
//	    whatever p's priority)
//	L13 fair order: no ticket p is admitted to a fair limit while a waiter
//	    w that store.Policy.Arrange puts ahead of p there still waits
//
// Why "still waits" is enough, and when a rule judges. The planner places
// the waiters in one order (a waiter goes when it is first, among those
// not placed, in each of its limits; the oldest such first) and a waiter
// not admitted blocks each of its limits for everyone placed after it,
// whether it lacked room, weight, a token of a rate or its replaced
// tickets' exit. So if w is placed before p, p is not admitted to a limit
// they share: a w ahead that did not fit is a violation only because p
// went first. p goes before w in a limit L that puts w first only when no
// waiter is first in all of its limits (the limits disagree) and p is the
// oldest of the heads; then L's head h, at or ahead of w, is not first in
// another of its limits. A rule therefore judges p only where that cannot
// be: when every waiter of the step ahead of p by L's order is first in
// each of its other limits (L's head is then first in all of its limits
// whenever p could go), and L11 and L12 also when every limit of every
// such waiter orders by priority with L's aging (all such limits share one
// order, so the first of them all is first in each of its limits).
// Anything else counts as excused (Stats.OrderExcused).
//
// The step's clock is one instant, so every settle of a step orders by the
// same effective priorities. etcd's planner reads its own clock, up to the
// slack ahead of the step's (mayPrecede): there a waiter counts as ahead
// of p only if it is at every instant of that window, and as first in a
// priority limit only if no other waiter may pass it there. A fair order
// depends on the holders at the settle, which only the settle of a step
// with one writing call shows exactly (its holders are the step's, less
// those it admitted); L13 judges only such steps. A waiter enqueued in a
// step of several writing calls may have come after the settle that
// admitted p: it is not judged.
//
// A wall clock that steps back clears S23's window (a window across the
// step is not defined) and L12's bound for the tickets created before it
// (one created "later" by the clock may be older, and one created ahead of
// the clock has not aged yet). The store counts a start ahead of its clock in its window until
// the clock passes it, so a step back keeps a rated limit closed for as
// long: in the quiescent phase the operator clears such a rate (restore).

const (
	// policyRuns is the share of runs whose limits have policies.
	policyRuns = 0.6
	// policyChange is the chance, per step, of an operator's SetPolicy.
	policyChange = 0.01
)

// agings are the priority limits' agings: short, so that a run sees
// priorities overtaken.
var agings = []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}

// shares are what jobs send as --share ("": the holder's user).
var shares = []string{"", "", "ci", "batch"}

// setPolicies draws whether this run has policies and, if so, each limit's,
// and sets them: the operator creates each limit of a policy and sets it
// before the first job arrives.
func (s *sim) setPolicies() {
	r := s.policyRng
	s.sched = s.cfg.Faults.Has(Policies) && r.Float64() < policyRuns
	if !s.sched || s.viol != nil {
		return
	}
	s.stats.PolicyRuns++
	aging := agings[r.IntN(len(agings))]
	style := r.IntN(3) // every limit by priority (one aging), every one fair, or each its own
	for i := range s.limits {
		l := &s.limits[i]
		var p store.Policy
		switch o := r.IntN(3); {
		case style == 0 || style == 2 && o == 0:
			p.Order, p.Aging = store.ByPriority, aging
			if style == 2 && r.IntN(3) == 0 {
				p.Aging = agings[r.IntN(len(agings))]
			}
		case style == 1 || o == 1:
			p.Order = store.Fair
		}
		if r.Float64() < 0.35 {
			p.Rate = s.drawRate()
		}
		l.pol = p
		if p == (store.Policy{}) {
			continue // created by its first enqueue, as in a FIFO-only run
		}
		if _, err := s.ops.c.SetLimit(s.ctx, l.name, l.slots); err != nil {
			s.fail("setup", "limit set %s: %v", l.name, err)
			return
		}
		ch := store.PolicyChange{Order: &p.Order, Rate: &p.Rate}
		if p.Aging != 0 {
			ch.Aging = &p.Aging
		}
		lim, err := s.ops.c.SetPolicy(s.ctx, l.name, ch)
		if err != nil {
			s.fail("setup", "limit set %s %s: %v", l.name, p, err)
			return
		}
		s.tracef("limit %s: %d slots, %s", l.name, l.slots, lim.Policy)
	}
	s.m.check() // learn the limits and policies
	s.log = s.log[:0]
}

func (s *sim) drawRate() store.Rate {
	r := s.policyRng
	return store.Rate{N: 1 + r.IntN(3), Per: time.Duration(2+r.IntN(7)) * time.Second}
}

// drawPriority is a job's --priority: mostly near the top, where a short
// aging soon reorders them, sometimes anywhere in the range, or 0.
func (s *sim) drawPriority() int {
	r := s.policyRng
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return store.MinPriority + r.IntN(store.MaxPriority-store.MinPriority+1)
	}
	return store.MaxPriority - r.IntN(6)
}

func (s *sim) drawShare() string { return shares[s.policyRng.IntN(len(shares))] }

// changePolicy is an operator's limit set NAME --order/--aging/--rate on a
// limit that exists: one part of its policy changed (an order of FIFO also
// clears the aging; a rate of 0 clears the rate). false if no limit exists.
func (s *sim) changePolicy() bool {
	r := s.policyRng
	var names []string
	for _, l := range s.limits {
		if s.m.limits[l.name] != nil {
			names = append(names, l.name)
		}
	}
	if len(names) == 0 {
		return false
	}
	name := names[r.IntN(len(names))]
	var ch store.PolicyChange
	switch r.IntN(3) {
	case 0:
		o := []store.Order{store.FIFO, store.ByPriority, store.Fair}[r.IntN(3)]
		ch.Order = &o
	case 1:
		a := agings[r.IntN(len(agings))]
		ch.Aging = &a
	default:
		rate := store.Rate{}
		if r.IntN(3) > 0 {
			rate = s.drawRate()
		}
		ch.Rate = &rate
	}
	lim, err := s.ops.c.SetPolicy(s.ctx, name, ch)
	s.stats.PolicyChanges++
	s.tracef("operator sets %s's policy to %s %s", name, lim.Policy, errString(err))
	return true
}

// setPolicy learns an operator's SetPolicy: the policy is the model's
// policy with the change applied, and the answer shows it.
func (m *model) setPolicy(o *op) {
	l := m.limits[o.name]
	if l == nil {
		m.fail("S1", "SetPolicy of %s accepted; the model has no such limit", o.name)
		return
	}
	want := l.pol
	if o.ch.Order != nil {
		want.Order = *o.ch.Order
		if want.Order == store.FIFO || want.Order == "" {
			want.Order, want.Aging = "", 0
		}
	}
	if o.ch.Aging != nil {
		want.Aging = *o.ch.Aging
	}
	if o.ch.Rate != nil {
		want.Rate = *o.ch.Rate
	}
	if o.lim.Policy != want {
		m.fail("S1", "SetPolicy of %s answered policy %s; want %s", o.name, o.lim.Policy, want)
		return
	}
	if want.Rate != l.pol.Rate {
		l.admits = nil // the store's new window keeps at most what the old one counted
	}
	l.pol = want
}

// wallBack: the wall clock stepped back.
func (m *model) wallBack() {
	for _, l := range m.limits {
		l.admits = nil
	}
}

// plain reports whether every limit of t is FIFO without a rate.
func (m *model) plain(t *mTicket) bool {
	for _, name := range t.limits {
		if l := m.limits[name]; l != nil && !l.pol.IsFIFO() {
			return false
		}
	}
	return true
}

// effective is t's effective priority at now under aging: its priority
// plus one point per aging since it was created.
func effective(t *mTicket, now time.Time, aging time.Duration) int {
	if d := now.Sub(t.created); d > 0 {
		return t.prio + int(d/aging)
	}
	return t.prio
}

// shown checks what a snapshot's view v of t shows of its scheduling: its
// creation where its enqueue made it (as stored; PostgreSQL keeps
// microseconds), and under a priority limit, while it waits, its effective
// priority at the snapshot's clock.
func (m *model) shown(v store.Ticket, t *mTicket, now time.Time) bool {
	if d := v.Created.Sub(t.created); d > time.Microsecond+m.s.slack() || d < -time.Microsecond {
		m.fail("S8", "ticket %s was created at %v, the store says %v", short(t.id), t.created, v.Created)
		return false
	}
	t.created = v.Created
	l := m.limits[v.Limit]
	if l == nil || v.State == store.Held || l.pol.Ordered() != store.ByPriority {
		return true
	}
	if want := effective(t, now, l.pol.AgingOr()); v.Effective == nil || *v.Effective != want {
		got := "none"
		if v.Effective != nil {
			got = fmt.Sprint(*v.Effective)
		}
		m.fail("L11", "ticket %s (priority %d, waited %v) waits in %s with effective priority %s; aging %v makes it %d",
			short(t.id), t.prio, now.Sub(t.created), v.Limit, got, l.pol.AgingOr(), want)
		return false
	}
	return true
}

// A settle is what the model knows of the settles of a step that admitted
// tickets: their waiters (in ticket order) and, when exact, their holders.
// With one writing call in the step there was one settle, and it saw
// exactly the holders after the step less those it admitted, and the
// waiters after the step and those it admitted. With several, the waiters
// are a superset (every ticket that waited before the step or was enqueued
// in it) and the holders unknown.
type settle struct {
	m        *model
	now      time.Time
	exact    bool
	waiters  []*mTicket
	promoted []*mTicket
	all      []*mTicket // the live tickets after the step, in ticket order
	fair     map[string]map[*mTicket]int
}

// scheduled checks this step's admissions against the limits' policies
// (S23, L11-L13); promoted is the step's admissions, in ticket order.
func (m *model) scheduled(promoted []*mTicket, now Instant) {
	if len(promoted) == 0 {
		return
	}
	writes := 0
	for _, o := range m.s.log {
		switch o.kind {
		case "get", "snapshot", "scan", "setchild":
		default:
			writes++
		}
	}
	st := &settle{m: m, now: now.Wall, exact: writes <= 1, promoted: promoted, all: m.sorted(), fair: map[string]map[*mTicket]int{}}
	if st.exact {
		for _, t := range st.all {
			if t.state != store.Held || slices.Contains(promoted, t) {
				st.waiters = append(st.waiters, t)
			}
		}
	} else {
		for _, t := range m.waiters {
			st.waiters = append(st.waiters, t)
		}
		slices.SortFunc(st.waiters, func(a, b *mTicket) int { return cmp.Compare(a.fence, b.fence) })
	}
	for _, name := range sortedKeys(m.limitNames()) {
		l := m.limits[name]
		var ps []*mTicket
		for _, p := range promoted {
			if p.names(name) {
				ps = append(ps, p)
			}
		}
		if len(ps) == 0 {
			continue
		}
		if l.pol.Rate.N > 0 {
			m.s.stats.RatedAdmits += len(ps)
			m.rated(name, l, len(ps), now)
		}
		if o := l.pol.Ordered(); o != store.FIFO {
			m.s.stats.OrderedAdmits += len(ps)
			if o == store.ByPriority || st.exact {
				m.ordered(name, l.pol, ps, st)
			}
		}
		if m.s.viol != nil {
			return
		}
	}
}

func (m *model) limitNames() map[string]bool {
	out := make(map[string]bool, len(m.limits))
	for name := range m.limits {
		out[name] = true
	}
	return out
}

// rated checks S23 after n admissions to limit name at now: the model's
// admissions in the window that ends now are at most the rate's N. The
// wall clock runs forward between the admissions kept (a step back clears
// them), so the windows that end at an admission are all there are to check.
func (m *model) rated(name string, l *mLimit, n int, now Instant) {
	for range n {
		l.admits = append(l.admits, now.Wall)
	}
	from := now.Wall.Add(-l.pol.Rate.Per + m.s.slack()) // the store may have read its clock that much later
	i := 0
	for i < len(l.admits) && !l.admits[i].After(from) {
		i++
	}
	l.admits = l.admits[i:] // out of every later window too
	if len(l.admits) > l.pol.Rate.N {
		m.fail("S23", "limit %s (rate %s) admitted %d tickets in the %v up to now, the last %d this step%s",
			name, l.pol.Rate, len(l.admits), l.pol.Rate.Per, n, m.stepCalls())
	}
}

// ahead is limit name's order of its waiters at the settle: whether a goes
// before b. nil where the model cannot tell (a fair limit's holders at a
// settle that is not exact).
func (st *settle) ahead(name string) func(a, b *mTicket) bool {
	l := st.m.limits[name]
	switch {
	case l == nil:
		return nil
	case l.pol.Ordered() == store.ByPriority:
		aging := l.pol.AgingOr()
		return func(a, b *mTicket) bool {
			ea, eb := effective(a, st.now, aging), effective(b, st.now, aging)
			return ea > eb || ea == eb && a.fence < b.fence
		}
	case l.pol.Ordered() == store.Fair:
		key := st.fairKeys(name)
		if key == nil {
			return nil
		}
		return func(a, b *mTicket) bool { return key[a] < key[b] || key[a] == key[b] && a.fence < b.fence }
	}
	return func(a, b *mTicket) bool { return a.fence < b.fence }
}

// fairKeys is store.Policy.Arrange's key of each waiter of fair limit name
// at an exact settle: the slots its share holds there plus the weight of
// its share's waiters ahead of it in ticket order.
func (st *settle) fairKeys(name string) map[*mTicket]int {
	if !st.exact {
		return nil
	}
	if k := st.fair[name]; k != nil {
		return k
	}
	load := map[string]int{}
	for _, t := range st.all {
		if t.state == store.Held && t.names(name) && !slices.Contains(st.promoted, t) {
			load[t.share] += t.weight
		}
	}
	key := map[*mTicket]int{}
	for _, t := range st.waiters {
		if t.names(name) {
			key[t] = load[t.share]
			load[t.share] += t.weight
		}
	}
	st.fair[name] = key
	return key
}

// first reports whether u is surely first, by limit name's order, among
// the settle's waiters of name: in a priority limit, at every instant the
// planner's clock may have read (mayPrecede), since aging may have put
// another waiter ahead of u by then.
func (st *settle) first(u *mTicket, name string) bool {
	ahead := st.ahead(name)
	if ahead == nil {
		return false
	}
	pol := st.m.limits[name].pol
	for _, t := range st.waiters {
		if t == u || !t.names(name) {
			continue
		}
		if ahead(t, u) || pol.Ordered() == store.ByPriority && st.m.mayPrecede(t, u, st.now, pol.AgingOr()) {
			return false
		}
	}
	return true
}

// excused reports whether the planner may have placed p before the
// waiters that limit name's order (ahead) puts first, the limits
// disagreeing (see the top of this file). It may not if every waiter ahead
// of p in name is first in each of its other limits (name's head is then
// first in all of its limits whenever p could go), or if name orders by
// priority with an aging that every limit of every waiter ahead of p by
// that order has too (the first of those is first in all of its limits).
func (st *settle) excused(p *mTicket, name string, ahead func(a, b *mTicket) bool) bool {
	heads, class := true, true
	pol := st.m.limits[name].pol
	for _, u := range st.waiters {
		if u == p || !ahead(u, p) {
			continue
		}
		for _, other := range u.limits {
			l := st.m.limits[other]
			if class && (l == nil || l.pol.Ordered() != store.ByPriority || pol.Ordered() != store.ByPriority || l.pol.AgingOr() != pol.AgingOr()) {
				class = false
			}
			if heads && u.names(name) && other != name && !st.first(u, other) {
				heads = false
			}
		}
		if !heads && !class {
			return true
		}
	}
	return false
}

// ordered checks L11 and L12 (a priority limit) or L13 (a fair one) for
// the admissions ps to limit name: no waiter that its order puts ahead of
// an admitted ticket still waits, unless the limits may have disagreed.
// A waiter enqueued in a step of several writing calls may have come after
// the settle that admitted: it is not judged.
func (m *model) ordered(name string, pol store.Policy, ps []*mTicket, st *settle) {
	ahead := st.ahead(name)
	for _, p := range ps {
		var passed []*mTicket
		for _, w := range st.all {
			if w.state != store.Held && w.names(name) && ahead(w, p) && (st.exact || !m.fresh[w.id]) &&
				(pol.Ordered() != store.ByPriority || !m.mayPrecede(p, w, st.now, pol.AgingOr())) {
				passed = append(passed, w)
			}
		}
		if len(passed) == 0 {
			continue
		}
		if st.excused(p, name, ahead) {
			m.s.stats.OrderExcused++
			continue
		}
		m.s.stats.OrderJudged++
		w := passed[0]
		if pol.Ordered() == store.Fair {
			key := st.fairKeys(name)
			m.fail("L13", "fair limit %s admitted %s (fence %d, share %q, %d slots of its share held or ahead, limits %v) before waiting %s (fence %d, share %q, %d, limits %v)%s",
				name, short(p.id), p.fence, p.share, key[p], p.limits, short(w.id), w.fence, w.share, key[w], w.limits, m.stepCalls())
			return
		}
		aging := pol.AgingOr()
		for _, w := range passed {
			if w.epoch == m.s.wallBacks && p.epoch == m.s.wallBacks && p.created.Sub(w.created) > time.Duration(store.MaxPriority-w.prio+1)*aging {
				m.fail("L12", "limit %s (priority, aging %v) admitted %s (priority %d, effective %d) created %v after waiting %s (priority %d, effective %d): more than (100-%d+1)×aging%s",
					name, aging, short(p.id), p.prio, effective(p, st.now, aging), p.created.Sub(w.created), short(w.id), w.prio, effective(w, st.now, aging), w.prio, m.stepCalls())
				return
			}
		}
		m.fail("L11", "limit %s (priority, aging %v) admitted %s (fence %d, priority %d, effective %d, limits %v) before waiting %s (fence %d, priority %d, effective %d, limits %v, weight %d)%s",
			name, aging, short(p.id), p.fence, p.prio, effective(p, st.now, aging), p.limits, short(w.id), w.fence, w.prio, effective(w, st.now, aging), w.limits, w.weight, m.stepCalls())
		return
	}
}

// scheduling reports whether some limit has a policy other than FIFO
// without a rate.
func (m *model) scheduling() bool {
	for _, l := range m.limits {
		if !l.pol.IsFIFO() {
			return true
		}
	}
	return false
}
