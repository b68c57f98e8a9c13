package policy

import (
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

// A SettlePlan is what a settle does, each list in queue order. A backend
// that cannot apply all of Remove in one step applies a prefix and none of
// Admit (the admissions may rest on the removals), then settles again; it
// may apply a prefix of Admit (FIFO holds for any prefix).
type SettlePlan struct {
	Remove []Remove
	Admit  []Admit
	// Line is the quiet waiters (indexes into SettleInput.Tickets) that
	// this settle finds in line and does not admit: the backend ends their
	// quiet, gives them a whole lease from now and wakes them, so that they
	// renew from then on (docs/leases.md rule 17).
	Line []int
}

// Empty reports whether the plan changes nothing.
func (p SettlePlan) Empty() bool { return len(p.Remove) == 0 && len(p.Admit) == 0 && len(p.Line) == 0 }

// count is one limit as PlanSettle goes through its tickets.
type count struct {
	size      int
	held      int // slots held by live holders
	waiting   int // live waiters
	head      int // weight of the oldest live waiter
	ahead     int // slots weighed by the waiters kept so far
	used      map[int]bool
	next      int  // lowest slot index not yet known to be used
	blocked   bool // a waiter was not admitted: nobody behind it is
	contended bool
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
	per := map[string]*count{}
	for name, size := range in.Slots {
		per[name] = &count{size: size}
	}
	// known is the ticket's limits that the input sizes; ok false when none is.
	known := func(t store.Ticket) (cs []*count, all, ok bool) {
		all = true
		for _, name := range t.Names() {
			if c := per[name]; c != nil {
				cs = append(cs, c)
			} else {
				all = false
			}
		}
		return cs, all, len(cs) > 0
	}
	// Who waits for a full limit, counting only tickets whose lease runs.
	for _, q := range in.Tickets {
		cs, _, ok := known(q.Ticket)
		if !ok || q.Expired != "" {
			continue
		}
		w := q.Ticket.Weighs()
		for _, c := range cs {
			if q.Ticket.State == store.Held {
				c.held += w
			} else {
				if c.waiting == 0 {
					c.head = w
				}
				c.waiting++
			}
		}
	}
	for _, c := range per {
		c.contended = c.waiting > 0 && c.held+c.head > c.size
	}
	var plan SettlePlan
	gone := make([]bool, len(in.Tickets))
	for i, q := range in.Tickets {
		cs, _, ok := known(q.Ticket)
		if !ok || q.Fresh {
			continue
		}
		contended, inLine := false, false
		for _, c := range cs {
			if c.contended && (q.Ticket.State == store.Held || c.ahead < c.size) {
				contended, inLine = true, true
			}
		}
		if ev, dead := in.verdict(q, contended, inLine); dead {
			gone[i] = true
			plan.Remove = append(plan.Remove, Remove{Index: i, Evidence: ev})
			continue
		}
		if q.Ticket.State != store.Held {
			for _, c := range cs {
				c.ahead += q.Ticket.Weighs()
			}
		}
	}
	// Admit: the holders that stay keep their slots.
	for _, c := range per {
		c.held, c.used = 0, map[int]bool{}
	}
	for i, q := range in.Tickets {
		if gone[i] || q.Ticket.State != store.Held {
			continue
		}
		for _, name := range q.Ticket.Names() {
			if c := per[name]; c != nil {
				c.held += q.Ticket.Weighs()
				if in.Mutations.Has(mutation.WeightIgnored) { // mutation (test-only): a holder counts as one slot (docs/leases.md H2)
					c.held -= q.Ticket.Weighs() - 1
				}
				for _, ix := range q.Ticket.In(name) {
					c.used[ix] = true
				}
			}
		}
	}
	live := map[string]bool{} // tickets that stay: a replacing ticket waits for those it replaces
	for i, q := range in.Tickets {
		if !gone[i] {
			live[q.Ticket.ID] = true
		}
	}
	for i, q := range in.Tickets {
		if gone[i] || q.Ticket.State == store.Held {
			continue
		}
		cs, all, ok := known(q.Ticket)
		if !ok {
			continue
		}
		w := q.Ticket.Weighs()
		fits := all
		for _, id := range q.Ticket.Replaces {
			fits = fits && (!live[id] || in.Mutations.Has(mutation.ReplaceBeside))
		}
		for _, c := range cs {
			fits = fits && !c.blocked && c.held+w <= c.size
		}
		if in.Mutations.Has(mutation.WeightIgnored) { // mutation (test-only): a waiter asks for one slot (docs/leases.md H2)
			fits = all
			for _, c := range cs {
				fits = fits && !c.blocked && c.held+1 <= c.size
			}
		}
		if !fits && in.Mutations.Has(mutation.BargePastHead) { // mutation (test-only): want of room blocks nobody behind (docs/leases.md H3)
			room := all
			for _, c := range cs {
				room = room && !c.blocked
			}
			if room {
				continue
			}
		}
		if !fits {
			for _, c := range cs {
				c.blocked = true // strict FIFO: nobody behind it in any of its limits
			}
			continue
		}
		a := Admit{Index: i, Indexes: map[string][]int{}}
		for _, name := range q.Ticket.Names() {
			c := per[name]
			ix := make([]int, 0, w)
			for len(ix) < w {
				for c.used[c.next] {
					c.next++
				}
				ix = append(ix, c.next)
				c.used[c.next] = true
			}
			c.held += w
			if in.Mutations.Has(mutation.WeightIgnored) { // mutation (test-only): an admission counts as one slot (docs/leases.md H2)
				c.held -= w - 1
			}
			a.Indexes[name] = ix
		}
		a.Slot = a.Indexes[q.Ticket.Names()[0]][0]
		plan.Admit = append(plan.Admit, a)
		gone[i] = true // for the line below: it waits no more
	}
	plan.Line = in.line(per, gone, known)
	return plan
}

// line finds the quiet waiters in line once the plan is applied: those
// whose weight of waiters ahead, in one of their limits, is under its size.
// gone marks the tickets the plan removes or admits.
func (in SettleInput) line(per map[string]*count, gone []bool, known func(store.Ticket) ([]*count, bool, bool)) []int {
	for _, c := range per {
		c.ahead = 0
	}
	var lined []int
	for i, q := range in.Tickets {
		cs, _, ok := known(q.Ticket)
		if gone[i] || !ok || q.Ticket.State == store.Held {
			continue
		}
		in := false
		for _, c := range cs {
			in = in || c.ahead < c.size
			c.ahead += q.Ticket.Weighs()
		}
		if in && q.Quiet {
			lined = append(lined, i)
		}
	}
	return lined
}

// verdict judges one ticket: expired by the store's clock, or proven dead by
// the judge when it is asked (every ticket with All; else a holder or a
// waiter next in line of a contended limit; an expired one with JudgeExpired).
func (in SettleInput) verdict(q Queued, contended, inLine bool) (string, bool) {
	expired := q.Expired != ""
	ev, gone := q.Expired, expired
	if in.All || (!expired && contended && inLine) || (expired && in.JudgeExpired) {
		ev, gone = Verdict(q, in.Judge, !in.DryRun)
	}
	if gone && ev == q.Expired && in.Keep != nil && in.Keep(q.Ticket) {
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
