package policy

import (
	"slices"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// The settle policy, once for every backend: which tickets a settle removes
// and which waiters it admits. A backend reads its state, hands it to
// PlanSettle and applies the plan in the same atomic step (bbolt: the same
// transaction; etcd: one Txn whose compares cover what the plan read).

// A Queued ticket is one ticket as a settle sees it: each ticket once,
// however many limits it names.
type Queued struct {
	// Ticket is the ticket as the judge is shown it. The planner reads its
	// Names, Weighs, State and (when held) its indexes (In); the order is
	// the input's.
	Ticket store.Ticket
	// Expired is the store's verdict by its own clock: why the lease is
	// over ("expired 3s ago", "previous boot"), or "" while it runs.
	Expired string
	// Fresh marks a ticket this very step writes (an Enqueue on etcd): it is
	// not in the store yet, so it is neither judged nor removed, only admitted.
	Fresh bool
	// Quiet marks a waiting ticket that renews nothing until it comes into
	// line (store.Ticket.Quiet): the backend passes it unexpired, and the plan
	// lists it in Line once it is in line.
	Quiet bool
}

// SettleInput is what a settle decides on.
type SettleInput struct {
	// Slots is each limit's size, by name. A ticket none of whose limits
	// is named here is left alone; one that names a limit missing here is
	// never admitted, and blocks the tickets behind it in the others. A
	// backend therefore passes every limit of every ticket it passes.
	Slots map[string]int
	// Policies is each limit's scheduling policy, by name; a limit missing
	// here is FIFO with no rate. Starts is when each rated limit's
	// admissions were made (LimitRec.Starts), and Now the step's reading of
	// the store's clock that ages priorities and slides rate windows.
	Policies map[string]store.Policy
	Starts   map[string][]time.Time
	Now      time.Time
	// Tickets is every ticket of those limits, each once, in queue order
	// (fence order: one sequence across all limits).
	Tickets []Queued
	// Judge proves holders dead; nil judges by expiry only. It is called
	// with act set (it may stop an orphaned job) unless DryRun.
	Judge store.Judge
	// DryRun asks the judge without act: the plan is only a list of what a
	// settle would remove (a dry-run reap, with All).
	DryRun bool
	// All judges every live ticket (reap). Otherwise only where somebody
	// waits for a full limit, and then only its holders and the waiters next
	// in line: a dead ticket further back blocks nobody, and its TTL or a
	// reap will take it. That keeps an uncontended admission free of
	// process probes.
	All bool
	// JudgeExpired also shows an expired ticket to the judge (always with
	// All): its removal frees its slot, so a job its dead supervisor left
	// running must be stopped before somebody is admitted beside it.
	JudgeExpired bool
	// Keep, if set, vouches for an expired ticket that the judge did not
	// prove dead: a ticket it keeps is not removed. A host-local store keeps
	// a ticket whose job provably still runs after its supervisor died (an
	// orphan that only a reap with its owner's authority may stop): freeing
	// its slot would admit a job beside it.
	Keep func(store.Ticket) bool
	// Mutations is test-only (internal/mutation): planner bugs that the
	// simulation must catch. Nil in every real settle.
	Mutations mutation.Set
}

// A Remove is one ticket a settle reaps: Index into SettleInput.Tickets, and why.
type Remove struct {
	Index    int
	Evidence string
}

// An Admit is one waiter a settle admits: Index into SettleInput.Tickets,
// and the slot indexes it takes in each of its limits (Weighs of them, the
// lowest free ones, ascending). Slot is the lowest it takes in its first limit.
type Admit struct {
	Index   int
	Slot    int
	Indexes map[string][]int
}

// A SettlePlan is what a settle does: Remove, Line and Wake in input
// order, Admit in the order the waiters were admitted (the input's when
// every limit is FIFO). A backend that cannot apply all of Remove in one
// step applies a prefix and none of Admit (the admissions may rest on the
// removals), then settles again; it may apply a prefix of Admit (each
// limit's order holds for any prefix), and then charges the rate for that
// prefix only, not Starts.
type SettlePlan struct {
	Remove []Remove
	Admit  []Admit
	// Line is the quiet waiters (indexes into SettleInput.Tickets) that
	// this settle finds in line and does not admit: the backend ends their
	// quiet, gives them a whole lease from now and wakes them, so that they
	// renew from then on (docs/leases.md rule 17).
	Line []int
	// Starts is, for each rated limit this plan admits to, its new
	// LimitRec.Starts: the backend writes them in the same step (the rate
	// is charged where the admission is made, so no two steps spend one
	// token).
	Starts map[string][]time.Time
	// Wake is the waiters (indexes into SettleInput.Tickets) that this plan
	// leaves first in a limit whose rate it spent: the backend rings them,
	// so that they wait for the window to open rather than for a renewal.
	Wake []int
}

// Empty reports whether the plan changes nothing.
func (p SettlePlan) Empty() bool { return len(p.Remove) == 0 && len(p.Admit) == 0 && len(p.Line) == 0 }

// count is one limit as PlanSettle goes through its tickets.
type count struct {
	size      int
	held      int // slots held: by live holders (census), then by those that stay and the admitted
	waiting   int // live waiters
	head      int // weight of the oldest live waiter
	ahead     int // slots weighed by the waiters kept so far
	used      map[int]bool
	next      int  // lowest slot index not yet known to be used
	blocked   bool // a waiter was not admitted: nobody behind it is
	contended bool // somebody waits and the oldest waiter does not fit beside the live holders
	tokens    int  // admissions the rate still allows; -1 without a rate
	charged   int  // admissions this plan makes
}

// A settling is one PlanSettle under way. PlanSettle goes through the
// queue once per phase (census, judge, seatHolders, admit, line), each
// phase a method, and what one phase hands the next lives here: each sized
// limit's count, which tickets the plan removes or admits (gone), and the
// plan so far.
type settling struct {
	in   SettleInput
	per  map[string]*count
	gone []bool
	plan SettlePlan
	// order is the tickets' indexes in the order the phases go through
	// them: the input's (fence) order when every limit is FIFO, else as the
	// limits' policies order their waiters (arrange).
	order []int
	fifo  bool
	lims  []known
}

// PlanSettle decides a settle: it removes every expired ticket and every
// ticket the judge proves dead (see SettleInput.All for whom it asks), then
// admits waiters in queue order (docs/leases.md §2.1 item 9). A waiter is
// admitted to all of its limits at once, when no older ticket still waits
// in any of them and each has Weighs free slots; it takes the lowest free
// indexes of each. FIFO is strict across limits: a waiter that is not
// admitted blocks everyone behind it in every one of its limits, so a heavy
// head is not overtaken by lighter tickets, and since the oldest waiter is
// only ever blocked by holders, no set of tickets can deadlock. A limit
// shrunk below its held slots admits nobody until they are fewer than its
// slots. A ticket that replaces others (store.Ticket.Replaces) is not admitted
// while one of them is still live, and blocks its limits meanwhile, as a
// ticket that does not fit (docs/leases.md §2.1 item 10). Holders are never
// moved or evicted.
func PlanSettle(in SettleInput) SettlePlan {
	s := &settling{in: in, per: map[string]*count{}, gone: make([]bool, len(in.Tickets)), fifo: true}
	for name, size := range in.Slots {
		pol := in.Policies[name]
		s.per[name] = &count{size: size, tokens: pol.Tokens(in.Starts[name], in.Now)}
		s.fifo = s.fifo && pol.IsFIFO()
	}
	s.knowAll()
	s.census()
	s.order = s.arrange()
	s.contend()
	s.judge()
	s.seatHolders()
	if s.reorder() {
		s.order = s.arrange() // a fair share's holdings changed with the removals
	}
	s.admit()
	s.plan.Line = s.line()
	s.charge()
	slices.SortFunc(s.plan.Remove, func(a, b Remove) int { return a.Index - b.Index })
	return s.plan
}

// known is the counts of ticket i's limits that the input sizes; all is
// false when it names a limit the input does not size (it is then never
// admitted), ok is false when it sizes none (it is then left alone). Every
// phase asks it of every ticket: it is worked out once.
func (s *settling) known(i int) (cs []*count, all, ok bool) {
	k := &s.lims[i]
	return k.cs, k.all, len(k.cs) > 0
}

// knowAll works out known for every ticket.
func (s *settling) knowAll() {
	s.lims = make([]known, len(s.in.Tickets))
	for i, q := range s.in.Tickets {
		k := &s.lims[i]
		k.all = true
		for _, name := range q.Ticket.Names() {
			if c := s.per[name]; c != nil {
				k.cs = append(k.cs, c)
			} else {
				k.all = false
			}
		}
	}
}

// known is one ticket's counts (settling.known).
type known struct {
	cs  []*count
	all bool
}

// census counts, before anything is judged, who waits for a full limit:
// in each limit the slots its live holders hold and its live waiters.
// Tickets whose lease is over do not count; a Fresh one does.
func (s *settling) census() {
	for i, q := range s.in.Tickets {
		cs, _, ok := s.known(i)
		if !ok || q.Expired != "" {
			continue
		}
		for _, c := range cs {
			if q.Ticket.State == store.Held {
				c.held += q.Ticket.Weighs()
			} else {
				c.waiting++
			}
		}
	}
}

// contend decides which limits are contended: somebody waits and the first
// live waiter in the limit's order does not fit beside the live holders.
// Only a contended limit has tickets whose lease runs shown to the judge
// (unless SettleInput.All).
func (s *settling) contend() {
	headed := map[*count]bool{}
	for _, i := range s.order {
		q := s.in.Tickets[i]
		cs, _, ok := s.known(i)
		if !ok || q.Expired != "" || q.Ticket.State == store.Held {
			continue
		}
		for _, c := range cs {
			if !headed[c] {
				headed[c], c.head = true, q.Ticket.Weighs()
			}
		}
	}
	for _, c := range s.per {
		c.contended = c.waiting > 0 && c.held+c.head > c.size
	}
}

// judge decides the removals, in queue order and before any admission (the
// admissions rest on them): each ticket but a Fresh one gets its verdict.
// A waiter that stays adds its weight to the waiters ahead in each of its
// limits, so that the ones behind it know whether they are next in line,
// which is when a contended limit needs them judged (inContention).
func (s *settling) judge() {
	for _, i := range s.order {
		q := s.in.Tickets[i]
		cs, _, ok := s.known(i)
		if !ok || q.Fresh {
			continue
		}
		if ev, dead := s.in.verdict(q, inContention(q, cs)); dead {
			s.gone[i] = true
			s.plan.Remove = append(s.plan.Remove, Remove{Index: i, Evidence: ev})
			continue
		}
		if q.Ticket.State != store.Held {
			for _, c := range cs {
				c.ahead += q.Ticket.Weighs()
			}
		}
	}
}

// inContention reports whether a contended limit needs q judged although its
// lease runs: q holds slots of one, or waits in one with fewer slots of
// waiters ahead of it than the limit has. A dead ticket further back blocks
// nobody, and its TTL or a reap will take it.
func inContention(q Queued, cs []*count) bool {
	for _, c := range cs {
		if c.contended && (q.Ticket.State == store.Held || c.ahead < c.size) {
			return true
		}
	}
	return false
}

// seatHolders starts each limit's held slots over from the holders that
// stay, once the removals are known: their weight and their indexes, which
// no admission may take. The census counted the holders whose lease runs;
// the judge may have removed some, and kept an expired one (Keep) that
// still holds its slots.
func (s *settling) seatHolders() {
	for _, c := range s.per {
		c.held, c.used = 0, map[int]bool{}
	}
	for i, q := range s.in.Tickets {
		if s.gone[i] || q.Ticket.State != store.Held {
			continue
		}
		for _, name := range q.Ticket.Names() {
			if c := s.per[name]; c != nil {
				c.held += q.Ticket.Weighs()
				if s.in.Mutations.Has(mutation.WeightIgnored) { // mutation (test-only): a holder counts as one slot (docs/leases.md H2)
					c.held -= q.Ticket.Weighs() - 1
				}
				for _, ix := range q.Ticket.In(name) {
					c.used[ix] = true
				}
			}
		}
	}
}

// admit decides the admissions: the waiters that stay, in queue order, each
// admitted to all of its limits at once (take) when it fits, and otherwise
// blocking every one of its limits for everyone behind it (strict FIFO
// across limits: a heavy head is not overtaken by lighter tickets).
func (s *settling) admit() {
	live := s.live()
	for _, i := range s.order {
		q := s.in.Tickets[i]
		if s.gone[i] || q.Ticket.State == store.Held {
			continue
		}
		cs, all, ok := s.known(i)
		if !ok {
			continue
		}
		if !s.fits(q, cs, all, live) {
			if s.in.Mutations.Has(mutation.BargePastHead) && all && !blocked(cs) { // mutation (test-only): want of room blocks nobody behind (docs/leases.md H3)
				continue
			}
			for _, c := range cs {
				c.blocked = true // strict FIFO: nobody behind it in any of its limits
			}
			continue
		}
		s.plan.Admit = append(s.plan.Admit, s.take(i, q))
		s.gone[i] = true // for the line below: it waits no more
	}
}

// live is the ids of the tickets that the plan does not remove, read before
// any admission: a ticket that replaces one of them waits until it is gone.
func (s *settling) live() map[string]bool {
	live := map[string]bool{}
	for i, q := range s.in.Tickets {
		if !s.gone[i] {
			live[q.Ticket.ID] = true
		}
	}
	return live
}

// fits reports whether the waiter q, of limits cs (all: every one of its
// limits sized), may be admitted now: no older waiter blocks any of its
// limits, each has room for its weight beside what is held, and no ticket
// it replaces is live (docs/leases.md §2.1 item 10).
func (s *settling) fits(q Queued, cs []*count, all bool, live map[string]bool) bool {
	if s.in.Mutations.Has(mutation.WeightIgnored) { // mutation (test-only): a waiter asks for one slot (docs/leases.md H2)
		return all && room(cs, 1)
	}
	if !all || !room(cs, q.Ticket.Weighs()) {
		return false
	}
	for _, id := range q.Ticket.Replaces {
		if live[id] && !s.in.Mutations.Has(mutation.ReplaceBeside) { // mutation (test-only): admitted beside the ticket it replaces (docs/leases.md R1)
			return false
		}
	}
	return true
}

// room reports whether each of cs has n slots free, an admission its rate
// allows, and no waiter ahead blocking it.
func room(cs []*count, n int) bool {
	for _, c := range cs {
		if c.blocked || c.held+n > c.size || c.tokens == 0 {
			return false
		}
	}
	return true
}

// blocked reports whether an older waiter blocks one of cs.
func blocked(cs []*count) bool {
	for _, c := range cs {
		if c.blocked {
			return true
		}
	}
	return false
}

// take admits the waiter q, Index i, that fits: in each of its limits the
// lowest Weighs indexes nobody uses, held from now on, so that the waiters
// behind it fit beside it or not at all.
func (s *settling) take(i int, q Queued) Admit {
	w := q.Ticket.Weighs()
	a := Admit{Index: i, Indexes: map[string][]int{}}
	for _, name := range q.Ticket.Names() {
		c := s.per[name]
		a.Indexes[name] = c.lowest(w)
		c.held += w
		if c.tokens > 0 {
			c.tokens--
			c.charged++
		}
		if s.in.Mutations.Has(mutation.WeightIgnored) { // mutation (test-only): an admission counts as one slot (docs/leases.md H2)
			c.held -= w - 1
		}
	}
	a.Slot = a.Indexes[q.Ticket.Names()[0]][0]
	return a
}

// lowest takes the n lowest slot indexes of c that nobody uses, ascending.
func (c *count) lowest(n int) []int {
	ix := make([]int, 0, n)
	for len(ix) < n {
		for c.used[c.next] {
			c.next++
		}
		ix = append(ix, c.next)
		c.used[c.next] = true
	}
	return ix
}

// line finds the quiet waiters in line once the plan is applied: those
// whose weight of waiters ahead, in one of their limits, is under its size.
// It runs last, when gone marks every ticket the plan removes or admits.
func (s *settling) line() []int {
	for _, c := range s.per {
		c.ahead = 0
	}
	var lined []int
	for _, i := range s.order {
		q := s.in.Tickets[i]
		cs, _, ok := s.known(i)
		if s.gone[i] || !ok || q.Ticket.State == store.Held {
			continue
		}
		inLine := false
		for _, c := range cs {
			inLine = inLine || c.ahead < c.size
			c.ahead += q.Ticket.Weighs()
		}
		if inLine && q.Quiet {
			lined = append(lined, i)
		}
	}
	slices.Sort(lined)
	return lined
}

// verdict judges one ticket: expired by the store's clock, or proven dead by
// the judge when it is asked (every ticket with All; else one whose lease
// runs where a contended limit needs it judged, see inContention; an expired
// one with JudgeExpired).
func (in SettleInput) verdict(q Queued, contended bool) (string, bool) {
	expired := q.Expired != ""
	ev, gone := q.Expired, expired
	if in.All || (!expired && contended) || (expired && in.JudgeExpired) {
		ev, gone = Verdict(q, in.Judge, !in.DryRun)
	}
	lateIsDeath := q.Ticket.State == store.Waiting && in.Mutations.Has(mutation.LateRenewalDeath) // mutation (test-only): an expired waiter is not kept
	if gone && ev == q.Expired && in.Keep != nil && !lateIsDeath && in.Keep(q.Ticket) {
		return "", false // expired only, and its job runs on
	}
	return ev, gone
}

// Verdict judges one ticket as a settle does when it asks the judge: gone
// when expired or proven dead (judge nil: expiry only), with the evidence
// of both when both hold.
func Verdict(q Queued, judge store.Judge, act bool) (evidence string, gone bool) {
	if judge != nil {
		if ev, dead := judge(q.Ticket, act); dead {
			if q.Expired != "" && q.Expired != ev {
				ev = q.Expired + "; " + ev
			}
			return ev, true
		}
	}
	return q.Expired, q.Expired != ""
}
