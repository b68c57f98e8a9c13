package store

// The settle policy, once for every backend: which tickets a settle removes
// and which waiters it admits. A backend reads its state, hands it to
// PlanSettle and applies the plan in the same atomic step (bbolt: the same
// transaction; etcd: one Txn whose compares cover what the plan read).

// A Queued ticket is one ticket as a settle sees it.
type Queued struct {
	// Ticket is the ticket as the judge is shown it. The planner reads its
	// Limit, State and (when held) Slot; the order is the input's.
	Ticket Ticket
	// Expired is the store's verdict by its own clock: why the lease is
	// over ("expired 3s ago", "previous boot"), or "" while it runs.
	Expired string
	// Fresh marks a ticket this very step writes (an Enqueue on etcd): it is
	// not in the store yet, so it is neither judged nor removed, only admitted.
	Fresh bool
}

// SettleInput is what a settle decides on.
type SettleInput struct {
	// Slots is each limit's size, by name. Tickets of a limit not named here
	// are left alone.
	Slots map[string]int
	// Tickets is every ticket of those limits in queue order (fence order),
	// each naming its limit.
	Tickets []Queued
	// Judge proves holders dead; nil judges by expiry only. It is called
	// with act set (it may stop an orphaned job) unless DryRun.
	Judge Judge
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
}

// A Remove is one ticket a settle reaps: Index into SettleInput.Tickets, and why.
type Remove struct {
	Index    int
	Evidence string
}

// An Admit is one waiter a settle admits: Index into SettleInput.Tickets,
// and the slot index it takes.
type Admit struct {
	Index int
	Slot  int
}

// A SettlePlan is what a settle does, each list in queue order. A backend
// that cannot apply all of Remove in one step applies a prefix and none of
// Admit (the admissions may rest on the removals), then settles again; it
// may apply a prefix of Admit (FIFO holds for any prefix).
type SettlePlan struct {
	Remove []Remove
	Admit  []Admit
}

// Empty reports whether the plan changes nothing.
func (p SettlePlan) Empty() bool { return len(p.Remove) == 0 && len(p.Admit) == 0 }

// PlanSettle decides a settle: it removes every expired ticket and every
// ticket the judge proves dead (see SettleInput.All for whom it asks), then
// admits waiters in queue order while a limit has fewer holders than slots,
// each into the lowest free slot index. FIFO is strict: a waiter is never
// passed over, so the first waiter that does not fit stops its limit's
// admissions, and a limit shrunk below its holders admits nobody until they
// are fewer than its slots. Holders are never moved or evicted.
//
// The walk is one pass over the tickets in the input's order, with a count
// per limit, so that a later input naming tickets of several limits in one
// global sequence needs no other shape.
func PlanSettle(in SettleInput) SettlePlan {
	type count struct {
		held, waiting int
		ahead         int // waiters kept so far
		used          map[int]bool
		next          int  // lowest slot index not yet known to be used
		blocked       bool // a waiter did not fit: nobody behind it is admitted
	}
	per := map[string]*count{}
	at := func(limit string) (*count, int, bool) {
		slots, ok := in.Slots[limit]
		if !ok {
			return nil, 0, false
		}
		c := per[limit]
		if c == nil {
			c = &count{used: map[int]bool{}}
			per[limit] = c
		}
		return c, slots, true
	}
	// Who waits for a full limit, counting only tickets whose lease runs.
	for _, q := range in.Tickets {
		c, _, ok := at(q.Ticket.Limit)
		if !ok || q.Expired != "" {
			continue
		}
		if q.Ticket.State == Held {
			c.held++
		} else {
			c.waiting++
		}
	}
	var plan SettlePlan
	gone := make([]bool, len(in.Tickets))
	for i, q := range in.Tickets {
		c, slots, ok := at(q.Ticket.Limit)
		if !ok || q.Fresh {
			continue
		}
		if ev, dead := in.verdict(q, c.waiting > 0 && c.held >= slots, q.Ticket.State == Held || c.ahead < slots); dead {
			gone[i] = true
			plan.Remove = append(plan.Remove, Remove{Index: i, Evidence: ev})
			continue
		}
		if q.Ticket.State != Held {
			c.ahead++
		}
	}
	// Admit: the holders that stay keep their slots.
	for _, c := range per {
		c.held = 0
	}
	for i, q := range in.Tickets {
		if c, _, ok := at(q.Ticket.Limit); ok && !gone[i] && q.Ticket.State == Held {
			c.held++
			c.used[q.Ticket.Slot] = true
		}
	}
	for i, q := range in.Tickets {
		c, slots, ok := at(q.Ticket.Limit)
		if !ok || gone[i] || q.Ticket.State == Held || c.blocked {
			continue
		}
		if c.held >= slots {
			c.blocked = true
			continue
		}
		for c.used[c.next] {
			c.next++
		}
		plan.Admit = append(plan.Admit, Admit{Index: i, Slot: c.next})
		c.used[c.next] = true
		c.held++
	}
	return plan
}

// verdict judges one ticket: expired by the store's clock, or proven dead by
// the judge when it is asked (every ticket with All; else a holder or a
// waiter next in line of a contended limit; an expired one with JudgeExpired).
func (in SettleInput) verdict(q Queued, contended, inLine bool) (string, bool) {
	expired := q.Expired != ""
	if in.All || (!expired && contended && inLine) || (expired && in.JudgeExpired) {
		return Verdict(q, in.Judge, !in.DryRun)
	}
	return q.Expired, expired
}

// Verdict judges one ticket as a settle does when it asks the judge: gone
// when expired or proven dead (judge nil: expiry only), with the evidence
// of both when both hold.
func Verdict(q Queued, judge Judge, act bool) (evidence string, gone bool) {
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
