package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// Room in one transaction: etcd refuses more than 128 compares or
// operations (--max-txn-ops); a plan that needs more commits what fits and
// settles again.
const maxPlanOps = 100

// expiredEvidence is what a reap says of a ticket whose lease the server expired.
const expiredEvidence = "lease expired (the etcd server revoked it)"

// plan is one transaction being built from a state read at one revision:
// compares for everything the decision rests on, and at most one write per
// key (a later write of a key replaces an earlier one; etcd refuses a
// transaction that writes a key twice).
type plan struct {
	s    *Store
	st   *lstate
	now  time.Time
	cmps []clientv3.Cmp
	keys []string           // write order
	w    map[string]writeOp // key -> its one write

	events   int
	needDay  bool
	limitCmp map[string]bool // limits whose size is compared already
	charged  map[string]bool // rated limits whose record the plan rewrites with new starts
	orderCmp map[string]bool // limits ordered by policy whose joins are compared already
	slotCmp  map[string]bool // limits whose slot keys are compared already
	full     bool            // out of room: commit this, then settle again

	gone     map[*entry]bool // entries the plan removes
	removed  []store.Removal // tickets removed by a sweep (reaped)
	revoke   []int64         // leases to revoke after the commit
	promoted []*entry
	counted  map[string]*store.Counts // the counts this plan writes, by limit (countsrec.go)

	// kept: tickets whose lease is gone that the plan keeps; those it
	// writes under a hold (holding) each get a lease of their own, which
	// try grants (holdLeases, by id; quarantine.go).
	kept       map[*entry]bool
	holding    []*entry
	holdLeases map[string]grantedHold

	eventSuffix string // set while logging an event of a kind a ticket logs more than once
	// light: the plan of a step that read no limit (releaseWaiting): its
	// events are counted in delta keys, not the limit's counts key.
	light bool
}

type writeOp struct {
	del   bool
	all   bool // with del: every key under this prefix
	val   string
	lease int64 // 0: none
	keep  bool  // keep the key's lease (a rewrite of a live ticket)
	day   bool  // put under the day lease
	// hold: a key of this ticket put under its hold (quarantine.go): a
	// slot key (val), or its ticket key or, unleased, its record, both
	// naming the hold's lease (holdRec).
	hold     *rec
	holdRec  bool
	unleased bool
}

func (s *Store) newPlan(st *lstate) *plan {
	return &plan{s: s, st: st, now: time.Now(), w: map[string]writeOp{}, gone: map[*entry]bool{},
		limitCmp: map[string]bool{}, slotCmp: map[string]bool{}}
}

func (p *plan) cmp(c clientv3.Cmp) { p.cmps = append(p.cmps, c) }

func (p *plan) put(key string, w writeOp) {
	if _, ok := p.w[key]; !ok {
		p.keys = append(p.keys, key)
	}
	p.w[key] = w
	if w.day {
		p.needDay = true
	}
}

func (p *plan) del(key string) {
	if w, ok := p.w[key]; ok && !w.del {
		return // a later owner's put replaces the key
	}
	p.put(key, writeOp{del: true})
}

func (p *plan) room(ops, cmps int) bool {
	if len(p.keys)+ops > maxPlanOps || len(p.cmps)+cmps > maxPlanOps {
		p.full = true
		return false
	}
	return true
}

func (p *plan) empty() bool { return len(p.keys) == 0 }

// event logs the ticket's event in each of its limits (docs/leases.md
// §2.1 item 9): under that limit, with its lowest index there.
func (p *plan) event(kind string, r rec, fence int64, evidence string) {
	p.eventBy(kind, r, fence, evidence, "")
}

// eventBy logs an event naming the newer run (by) that superseded or
// replaced the ticket (docs/leases.md §2.1 item 10). A held ticket may be
// replaced more than once (each newer run overwrites its stop request):
// each "replaced" event has a key of its own.
func (p *plan) eventBy(kind string, r rec, fence int64, evidence, by string) {
	p.log(kind, r, fence, evidence, by, false)
}

// log is eventBy of an event that removes a held ticket when held: it
// says how long it was held. An admission says how long it waited. Each
// event is counted in its limit's counts in this plan (plan.count).
func (p *plan) log(kind string, r rec, fence int64, evidence, by string, held bool) {
	names := r.names()
	key := kind
	if kind == "replaced" {
		key += "." + by
	}
	if p.eventSuffix != "" {
		key += "." + p.eventSuffix // a kind a ticket logs more than once ("resized")
	}
	for _, n := range names {
		e := eventRec{V: formatVersion, I: p.events, NewFence: fence == 0 && kind == "admitted", Event: store.Event{Time: p.now, Kind: kind, Limit: n,
			Ticket: r.ID, Fence: uint64(fence), Slot: -1, By: by, Host: r.Holder.Host, Pid: r.Holder.Pid,
			User: r.Holder.User, Command: r.Holder.Command(), Evidence: evidence}}
		ix := r.in(n)
		if len(ix) > 0 {
			e.Slot = ix[0]
		}
		if len(names) > 1 {
			e.Limits = slices.Clone(names)
		}
		if r.weighs() > 1 {
			e.Weight, e.Indexes = r.weighs(), slices.Clone(ix)
		}
		if kind == "admitted" {
			e.Waited = store.WaitedFor(r.Created, p.now)
		}
		if held {
			e.Held = store.HeldFor(r.Admitted, p.now)
		}
		p.events++
		p.put(p.s.k.event(n, r.ID, key), writeOp{val: encode(e), day: true})
		p.count(e.Event)
	}
}

// tombstone turns the id's key into the record of its removal, for a day:
// why, and the newer run that superseded it (by, when not nil).
func (p *plan) tombstone(id string, names []string, why store.Reason, by *store.Successor) {
	ir := idRec{V: formatVersion, Limit: names[0], Removed: why, At: p.now, By: by}
	if len(names) > 1 {
		ir.Limits = names
	}
	p.put(p.s.k.id(id), writeOp{val: encode(ir), day: true})
}

// compareLimit makes the plan depend on a limit's size as read.
func (p *plan) compareLimit(name string) {
	if p.limitCmp[name] {
		return
	}
	p.limitCmp[name] = true
	if ls := p.st.lims[name]; ls == nil || ls.limKV == nil {
		p.cmp(clientv3.Compare(clientv3.CreateRevision(p.s.k.limit(name)), "=", 0))
	} else {
		p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.limit(name)), "=", ls.limKV.ModRevision))
	}
}

// compareSlots makes the plan depend on a limit's slot keys as read: no
// slot key was written since (an admission the plan did not see). Slot keys
// deleted since only free slots. One compare covers every index the plan
// takes there, absent or freed by a removal in this plan.
func (p *plan) compareSlots(name string) {
	if p.slotCmp[name] {
		return
	}
	p.slotCmp[name] = true
	p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.slots(name)).WithPrefix(), "<", p.st.rev+1))
}

// remove deletes a ticket from all of its limits at once (compare-and-delete
// on the revisions read), frees its slots in each, tombstones its id and
// logs why (docs/leases.md §2.1 item 9). It reports false when out of room.
func (p *plan) remove(e *entry, why store.Reason, evidence string) bool {
	return p.removeBy(e, why, evidence, nil)
}

// removeBy is remove naming the newer run that superseded e (by, when not
// nil): in its tombstone, so that Get and Renew can say so, and in its
// events (docs/leases.md §2.1 item 10).
func (p *plan) removeBy(e *entry, why store.Reason, evidence string, by *store.Successor) bool {
	names := e.r.names()
	if c := p.countRoom(names); !p.room(ticketKeys(len(names), e.r.Weight)+1+c, 2+c) {
		return false
	}
	at, id := e.at, e.r.ID
	p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.record(at, id)), "=", e.rkv.ModRevision))
	if e.tkv != nil {
		p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.ticket(at, id)), "=", e.tkv.ModRevision))
		for _, n := range names {
			p.del(p.s.k.ticket(n, id))
		}
		p.revoke = append(p.revoke, e.r.Lease)
	}
	if i := slices.Index(p.holding, e); i >= 0 {
		// Kept by this plan, then removed (proven dead): none of its
		// hold's writes stand.
		p.holding = slices.Delete(p.holding, i, i+1)
		for _, n := range names {
			for _, k := range []string{p.s.k.record(n, id), p.s.k.ticket(n, id)} {
				p.put(k, writeOp{del: true})
			}
			for _, i := range e.r.in(n) {
				if k := p.s.k.slot(n, i); p.w[k].hold != nil {
					p.put(k, writeOp{del: true})
				}
			}
		}
	}
	for _, n := range names {
		p.del(p.s.k.record(n, id))
		// Under its lease, or its hold's (quarantine.go).
		if ls := p.st.lims[n]; ls != nil {
			for _, i := range e.r.in(n) {
				if kv := ls.slots[i]; kv != nil && string(kv.Value) == id {
					p.del(string(kv.Key))
				}
			}
		}
	}
	p.gone[e] = true
	byID := ""
	if by != nil {
		byID = by.Ticket
	}
	p.tombstone(id, names, why, by)
	p.log(string(why), e.r, e.fence, evidence, byID, e.r.State == store.Held)
	return true
}

// stop asks the held ticket e to stop for the newer run by (--replace,
// docs/leases.md §2.1 item 10): its keys in every limit are rewritten with
// the request, keeping its lease, on the revision read (compare), with a
// "replaced" event in each. The request is part of the ticket: Get and
// Renew return it, a restart keeps it, and its holder's bell, watching its
// key, rings. It reports false when out of room.
func (p *plan) stop(e *entry, by store.Successor) bool {
	names := e.r.names()
	if c := p.countRoom(names); !p.room(3*len(names)+c, 1+c) {
		return false
	}
	p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.ticket(e.at, e.r.ID)), "=", e.tkv.ModRevision))
	e.r.Stop = &by
	v := encode(e.r)
	for _, n := range names {
		p.put(p.s.k.ticket(n, e.r.ID), writeOp{val: v, keep: true})
		p.put(p.s.k.record(n, e.r.ID), writeOp{val: v})
	}
	p.eventBy("replaced", e.r, e.fence, "", by.Ticket)
	return true
}

// settle sweeps the limits read and promotes their waiters, the step every
// write that can free or add capacity ends with: one policy.PlanSettle over
// every ticket of the closure (docs/leases.md §2.1 item 9), each once, in
// fence order. Expired tickets (records whose lease the server revoked)
// are removed, and so are holders proven dead, probed as the bbolt store
// does; an expired one is shown to the judge only by a reap (all). The
// judge may stop an orphaned job (act). Tickets the plan removes already (a
// release) count as gone; the ticket being enqueued is admitted but not judged.
//
// It carries on the unfinished supersedes (supersede) before it applies
// the plan; out of room there, it applies nothing of it and settles again
// after this commit.
func (p *plan) settle(all bool) {
	plan, es := p.planSettle(all, nil)
	if !p.supersede(removes(plan, es)) {
		return
	}
	if len(es) > 0 || !plan.Empty() {
		p.apply(plan, es, true)
	}
}

// removes is the entries a settle's plan removes.
func removes(plan policy.SettlePlan, es []*entry) map[*entry]bool {
	out := map[*entry]bool{}
	for _, rm := range plan.Remove {
		out[es[rm.Index]] = true
	}
	return out
}

// superseding is the live tickets read whose supersede is unfinished
// (rec.Superseding), newest first, but the one being enqueued, which
// does its own.
func (p *plan) superseding() []*entry {
	var ms []*entry
	for _, e := range p.st.entries {
		if e.r.Superseding && e.live() && !e.isNew && !p.gone[e] {
			ms = append(ms, e)
		}
	}
	slices.SortFunc(ms, func(a, b *entry) int { return cmp.Compare(b.fence, a.fence) })
	return ms
}

// supersedes reports whether the marked ticket m supersedes x: x is an
// older live waiting ticket of m's key sharing one of its limits.
func supersedes(m, x *entry) bool {
	return x != m && !x.isNew && x.live() && x.r.State != store.Held && x.r.Key == m.r.Key &&
		x.fence < m.fence && slices.ContainsFunc(x.r.names(), func(n string) bool { return slices.Contains(m.r.names(), n) })
}

// doomed is the tickets that an unfinished supersede will remove: a
// settle must not admit them, and plans as if they were gone already
// (queued), as their enqueue did.
func (p *plan) doomed() map[*entry]bool {
	ms := p.superseding()
	if len(ms) == 0 {
		return nil
	}
	out := map[*entry]bool{}
	for _, x := range p.st.entries {
		if !p.gone[x] && slices.ContainsFunc(ms, func(m *entry) bool { return supersedes(m, x) }) {
			out[x] = true
		}
	}
	return out
}

// supersede carries on the supersedes that did not fit in their enqueue's
// transaction, newest first (a newer one removes an older marked one): as
// the enqueue does, it removes the tickets the marked one supersedes,
// tombstones naming it, and asks the held ones it Replaces to stop, unless
// it or another live run did already. Once nothing of that is left it
// clears the mark, in the same transaction as the last of it. A ticket
// that lost its lease supersedes nothing more. The tickets the settle
// removes (spare) are left to it: a removal must not follow a rewrite of
// the same keys in one plan. It reports false when out of room.
func (p *plan) supersede(spare map[*entry]bool) bool {
	for _, m := range p.superseding() {
		if p.gone[m] || spare[m] {
			continue // superseded by a newer one in this plan, or removed
		}
		by := successor(m.r.ID, m.r.Holder)
		for _, x := range p.st.entries {
			if !p.gone[x] && supersedes(m, x) && !p.removeBy(x, store.Superseded, "superseded by ticket "+m.r.ID, &by) {
				return false
			}
		}
		for _, id := range m.r.Replaces {
			h, _ := p.st.find(id)
			if h == nil || p.gone[h] || spare[h] || !h.live() || h.r.State != store.Held {
				continue
			}
			if s := h.r.Stop; s != nil && (s.Ticket == m.r.ID || p.lives(s.Ticket)) {
				continue
			}
			if !p.stop(h, by) {
				return false
			}
		}
		if !p.unmark(m) {
			return false
		}
	}
	return true
}

// lives reports whether the ticket id is read, live and kept by the plan.
func (p *plan) lives(id string) bool {
	e, _ := p.st.find(id)
	return e != nil && e.live() && !p.gone[e]
}

// unmark clears m's Superseding mark: its keys in every limit rewritten,
// keeping its lease, on the revision read. It reports false when out of room.
func (p *plan) unmark(m *entry) bool {
	names := m.r.names()
	if !p.room(2*len(names), 1) {
		return false
	}
	p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.ticket(m.at, m.r.ID)), "=", m.tkv.ModRevision))
	m.r.Superseding = false
	v := encode(m.r)
	for _, n := range names {
		p.put(p.s.k.ticket(n, m.r.ID), writeOp{val: v, keep: true})
		p.put(p.s.k.record(n, m.r.ID), writeOp{val: v})
	}
	return true
}

// planSettle plans the settle of the limits read, as settle does, over the
// entries the plan keeps and keep accepts (all when nil), and returns the
// plan and those entries, without applying it.
func (p *plan) planSettle(all bool, keep func(*entry) bool) (policy.SettlePlan, []*entry) {
	in := p.input()
	if len(in.Slots) == 0 {
		return policy.SettlePlan{}, nil
	}
	in.Judge, in.All = p.s.dead, all
	es := p.queued(&in, time.Millisecond, keep)
	return policy.PlanSettle(in), es
}

// input is a settle's sizes and policies: every limit read that exists,
// each rated one with the starts its record keeps, on this client's clock
// (etcd has none a transaction could read).
func (p *plan) input() policy.SettleInput {
	in := policy.SettleInput{Slots: map[string]int{}, Now: p.now}
	for _, n := range p.st.order {
		l := p.st.lim(n)
		if l == nil {
			continue
		}
		in.Slots[n] = l.Slots
		if !l.Policy.IsFIFO() {
			if in.Policies == nil {
				in.Policies, in.Starts = map[string]store.Policy{}, map[string][]time.Time{}
			}
			in.Policies[n], in.Starts[n] = l.Policy, l.Starts
		}
	}
	return in
}

// reap sweeps the tickets of limit (all of them judged, docs/leases.md
// §2.1 item 9), then settles the closure, which admits whom that frees.
func (p *plan) reap(limit string) {
	in := p.input()
	in.Judge, in.All = p.s.dead, true
	es := p.queued(&in, time.Millisecond, func(e *entry) bool { return slices.Contains(e.r.names(), limit) })
	if !p.apply(policy.PlanSettle(in), es, false) {
		return
	}
	p.settle(false)
}

// apply applies a settle's plan: its removals, then (with admit) its
// admissions. It reports false when out of room.
func (p *plan) apply(plan policy.SettlePlan, es []*entry, admit bool) bool {
	for _, rm := range plan.Remove {
		e := es[rm.Index]
		if !p.remove(e, store.Reaped, rm.Evidence) {
			return false // out of room: the admissions may rest on this removal
		}
		p.removed = append(p.removed, store.Removal{Ticket: p.s.view(e, 0, 0), Reason: store.Reaped, Evidence: rm.Evidence})
	}
	if !admit {
		return true
	}
	for _, a := range plan.Admit {
		if !p.admit(es[a.Index], a) {
			return false
		}
	}
	return true
}

// queued fills in's tickets with the entries that this plan keeps (those
// keep accepts, when not nil; never the doomed), in queue order, and
// returns those entries.
// A live ticket is shown to the judge with remaining left (its lease is
// the server's to tell).
func (p *plan) queued(in *policy.SettleInput, remaining time.Duration, keep func(*entry) bool) []*entry {
	var es []*entry
	doomed := p.doomed()
	for _, e := range p.st.entries {
		if p.gone[e] || doomed[e] || keep != nil && !keep(e) {
			continue
		}
		q := policy.Queued{Fresh: e.isNew, Ticket: p.s.view(e, 0, remaining)}
		if !e.live() && !p.holds(e) {
			q.Expired = expiredEvidence
		}
		es = append(es, e)
		in.Tickets = append(in.Tickets, q)
	}
	return es
}

// admit admits the waiter e to all of its limits at once, taking the
// indexes a names in each: compare each limit's size and slot keys as read
// (the indexes absent, or freed in this plan by a removal whose compare
// covers them), rewrite its keys in every limit held and put its slot keys
// under its lease. It reports false when out of room.
func (p *plan) admit(e *entry, a policy.Admit) bool {
	names := e.r.names()
	// A waiter this plan keeps under a hold (quarantine.go) is admitted
	// under the hold, which it writes; one whose hold did not fit waits.
	held := !e.isNew && e.tkv == nil
	if held && !slices.Contains(p.holding, e) {
		return false
	}
	if c, r := p.countRoom(names), p.chargeRoom(names); !p.room(ticketKeys(len(names), e.r.Weight)+c+r, 1+3*len(names)+c) {
		return false
	}
	for _, n := range names {
		p.compareLimit(n)
		p.compareSlots(n)
		p.compareOrder(n)
		p.charge(n)
	}
	e.r.State, e.r.Slot, e.r.Admitted = store.Held, a.Slot, p.now
	e.r.Indexes = nil
	if len(names) > 1 || e.r.weighs() > 1 {
		e.r.Indexes = map[string][]int{}
		for _, n := range names {
			e.r.Indexes[n] = slices.Clone(a.Indexes[n])
		}
	}
	r := e.r
	switch {
	case e.isNew:
		p.putNew(e)
	case held:
		for _, n := range names {
			p.put(p.s.k.record(n, r.ID), writeOp{hold: &r, holdRec: true, unleased: true})
			p.put(p.s.k.ticket(n, r.ID), writeOp{hold: &r, holdRec: true})
		}
	default:
		p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.ticket(e.at, e.r.ID)), "=", e.tkv.ModRevision))
		v := encode(e.r)
		for _, n := range names {
			p.put(p.s.k.ticket(n, e.r.ID), writeOp{val: v, keep: true})
			p.put(p.s.k.record(n, e.r.ID), writeOp{val: v})
		}
	}
	for _, n := range names {
		for _, i := range a.Indexes[n] {
			if held {
				p.put(p.s.k.slot(n, i), writeOp{val: r.ID, hold: &r})
			} else {
				p.put(p.s.k.slot(n, i), writeOp{val: e.r.ID, lease: e.r.Lease})
			}
		}
	}
	p.event("admitted", e.r, e.fence, "")
	p.promoted = append(p.promoted, e)
	return true
}

// compareOrder makes an admission to limit name depend on its waiters as
// read when its policy orders them otherwise than by ticket: a ticket that
// joined since may come first (in ticket order a newcomer comes last).
func (p *plan) compareOrder(name string) {
	l := p.st.lim(name)
	if l == nil || l.Policy.Ordered() == store.FIFO || p.orderCmp[name] {
		return
	}
	if p.orderCmp == nil {
		p.orderCmp = map[string]bool{}
	}
	p.orderCmp[name] = true
	p.cmp(clientv3.Compare(clientv3.CreateRevision(p.s.k.tickets(name)).WithPrefix(), "<", p.st.rev+1))
}

// chargeRoom is how many limit records an admission to names adds to the
// plan: one per rated limit not charged in it yet.
func (p *plan) chargeRoom(names []string) int {
	n := 0
	for _, name := range names {
		if l := p.st.lim(name); l != nil && l.Policy.Rate.N > 0 && !p.charged[name] {
			n++
		}
	}
	return n
}

// charge spends one admission of limit name's rate, if it has one: the
// admission's start goes into the limit's record, written by the same
// transaction as the admission and compared on the revision read
// (compareLimit), so that two clients admitting at once can never spend
// one token; the loser plans again on the starts the winner wrote. (The
// planner's SettlePlan.Starts are these starts, one admission at a time;
// counted here, a plan cut short by etcd's bound on a transaction charges
// only the admissions it writes.)
func (p *plan) charge(name string) {
	ls := p.st.lims[name]
	if ls == nil || ls.lim == nil || ls.lim.Policy.Rate.N == 0 {
		return
	}
	l := *ls.lim
	l.Starts = l.Policy.Charge(l.Starts, p.now, 1)
	ls.lim = &l
	if p.charged == nil {
		p.charged = map[string]bool{}
	}
	p.charged[name] = true
	p.put(p.s.k.limit(name), writeOp{val: encode(l)})
}

// putNew writes a new ticket's keys in all of its limits (Enqueue): one
// transaction, so one create revision, its fence.
func (p *plan) putNew(e *entry) {
	v := encode(e.r)
	names := e.r.names()
	for _, n := range names {
		p.put(p.s.k.ticket(n, e.r.ID), writeOp{val: v, lease: e.r.Lease})
		p.put(p.s.k.record(n, e.r.ID), writeOp{val: v})
	}
	ir := idRec{V: formatVersion, Limit: names[0], Lease: e.r.Lease}
	if len(names) > 1 {
		ir.Limits = names
	}
	p.put(p.s.k.id(e.r.ID), writeOp{val: encode(ir)})
}

// after is the state as the plan leaves it (for the answer to the caller;
// its revisions are not for comparing).
func (p *plan) after() *lstate {
	st := *p.st
	st.entries = nil
	st.lims = map[string]*limState{}
	for _, e := range p.st.entries {
		if !p.gone[e] {
			st.entries = append(st.entries, e)
		}
	}
	for n, ls := range p.st.lims {
		l := *ls
		l.entries = nil
		for _, e := range ls.entries {
			if !p.gone[e] {
				l.entries = append(l.entries, e)
			}
		}
		st.lims[n] = &l
	}
	return &st
}

// ops are the plan's writes as etcd operations.
func (p *plan) ops(day int64) []clientv3.Op {
	out := make([]clientv3.Op, 0, len(p.keys))
	for _, k := range p.keys {
		w := p.w[k]
		switch {
		case w.hold != nil:
			out = append(out, holdOp(k, w, p.holdLeases[w.hold.ID]))
		case w.del && w.all:
			out = append(out, clientv3.OpDelete(k, clientv3.WithPrefix()))
		case w.del:
			out = append(out, clientv3.OpDelete(k))
		case w.keep:
			out = append(out, clientv3.OpPut(k, w.val, clientv3.WithIgnoreLease()))
		case w.day:
			out = append(out, clientv3.OpPut(k, w.val, clientv3.WithLease(clientv3.LeaseID(day))))
		case w.lease != 0:
			out = append(out, clientv3.OpPut(k, w.val, clientv3.WithLease(clientv3.LeaseID(w.lease))))
		default:
			out = append(out, clientv3.OpPut(k, w.val))
		}
	}
	return out
}

// errRetry: the plan's compares failed; plan again on the state returned.
var errRetry = errors.New("state changed: plan again")

// errNoCommit, returned by a build, ends commit without a transaction: the
// plan has nothing to write, or the caller has its answer already.
var errNoCommit = errors.New("nothing to commit")

// commit builds a plan on st and commits it: the one loop of every write.
// When a compare fails it builds again, on the state the failed transaction
// read in the same round trip, pacing the retries (retrier). This is etcd's
// concurrency.NewSTM — its apply function reruns on a conflict — with the
// reads done up front (st) and the compares named by the plan. build
// returns errNoCommit to stop without writing: commit then returns the plan
// and a nil response. An error of build, or giving up on conflicts, comes
// with a nil plan; an error of the transaction itself comes with its plan
// (its outcome may be unknown: the caller may read again and retry).
func (s *Store) commit(ctx context.Context, st *lstate, id string, build func(p *plan) error) (*plan, *clientv3.TxnResponse, error) {
	var r retrier
	for {
		p := s.newPlan(st)
		if err := build(p); errors.Is(err, errNoCommit) {
			return p, nil, nil
		} else if err != nil {
			return nil, nil, err
		}
		resp, nst, err := s.try(ctx, p, id)
		if errors.Is(err, errRetry) {
			if err := r.next(ctx); err != nil {
				return nil, nil, err
			}
			st = nst
			continue
		}
		return p, resp, err
	}
}

// commitRead commits what build plans on the state read returns, and
// after a read or a write whose answer was lost (unknownOutcome) reads and
// plans again while the step's time lasts (again). The steps that use it
// set a value rather than add one, so a write that landed finds its own
// effect on the new read; retried tells build that an attempt's outcome
// was unknown. It returns as commit does, but with no plan beside an
// error.
func (s *Store) commitRead(ctx context.Context, read func(again bool) (*lstate, error), id string,
	build func(p *plan, retried bool) error) (*plan, *clientv3.TxnResponse, error) {
	start := time.Now()
	retried := false
	st, err := read(false)
	for {
		if err == nil {
			p, resp, cerr := s.commit(ctx, st, id, func(p *plan) error { return build(p, retried) })
			if cerr == nil || p == nil {
				return p, resp, cerr
			}
			err = cerr
		}
		if !unknownOutcome(err) || !s.again(ctx, start) {
			return nil, nil, err
		}
		retried = true
		st, err = read(true)
	}
}

// reader reads names (closed) for commitRead: serializable at first, the
// compares making up for a stale read, and linearizable after an answer
// was lost.
func (s *Store) reader(ctx context.Context, names []string, id string) func(again bool) (*lstate, error) {
	return func(again bool) (*lstate, error) { return s.read(ctx, names, id, !again) }
}

// try runs the plan once. On a failed compare it returns errRetry and the
// state at the revision of the failure (read in the same transaction, when
// the limits read fit in one; closed again over the limits their tickets
// name). A lease that vanished between the read and the commit (a waiter's
// expired, the day lease ran out) is also a retry, on a fresh read.
func (s *Store) try(ctx context.Context, p *plan, id string) (*clientv3.TxnResponse, *lstate, error) {
	var day int64
	if p.needDay {
		var err error
		if day, err = s.dayLease(ctx, p.st.dayKV); err != nil {
			return nil, nil, err
		}
	}
	names := p.st.order
	if len(names) == 0 {
		names = p.st.asked
	}
	reread := func() (*lstate, error) {
		st, err := s.read(ctx, p.st.asked, id, false)
		if err != nil {
			return nil, err
		}
		return st, nil
	}
	if err := s.grantHolds(ctx, p); err != nil {
		return nil, nil, err
	}
	var els []clientv3.Op
	if len(names)*opsPerLimit+2 <= maxPlanOps {
		els = s.readOps(names, id, false)
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Txn(cctx).If(p.cmps...).Then(p.ops(day)...).Else(els...).Commit()
	if err != nil {
		if isLeaseNotFound(err) {
			s.revokeHolds(p) // refused whole: unused
			if p.needDay {
				s.dropDay(day)
			}
			st, rerr := reread()
			if rerr != nil {
				return nil, nil, rerr
			}
			return nil, st, errRetry
		}
		return nil, nil, s.unavailable(err, false)
	}
	s.answered()
	if !resp.Succeeded {
		s.revokeHolds(p) // unused
		var st *lstate
		if els == nil {
			st, err = reread()
		} else if st, err = s.parseState(names, resp.Header.Revision, getResponses(resp.Responses), id != ""); err == nil {
			st.asked, st.name = p.st.asked, p.st.name
			if p.st.closed {
				st, err = s.closeOver(ctx, st, id)
			}
		}
		if err != nil {
			return nil, nil, err
		}
		return resp, st, errRetry
	}
	return resp, nil, nil
}

// afterCommit revokes the leases of the tickets the plan removed. Their keys
// are gone already (that is what freed their slots): this only spares the
// server an empty lease until its TTL, so a job's own path does not wait
// for it; an operator's command (reap, limit rm) does.
func (s *Store) afterCommit(p *plan) { s.revokeRemoved(p, false) }

func (s *Store) revokeRemoved(p *plan, wait bool) {
	var wg sync.WaitGroup
	for _, l := range p.revoke {
		s.leases.forget(l)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.o.RequestTimeout)
			defer cancel()
			_, _ = s.c.Revoke(ctx, clientv3.LeaseID(l))
		})
	}
	if wait {
		wg.Wait()
	}
}

// retrier paces the retries of a transaction whose compares failed: at once
// the first times, then with a short random pause, so that writers racing on
// one limit do not livelock.
type retrier struct{ n int }

func (r *retrier) next(ctx context.Context) error {
	r.n++
	if r.n > 200 {
		return fmt.Errorf("%w: gave up after %d conflicting transactions", store.ErrUnavailable, r.n)
	}
	if r.n > 3 {
		d := time.Duration(rand.Int64N(int64(min(r.n, 20)) * int64(time.Millisecond)))
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// dayLease returns the lease that tombstones and events are put under: one
// lease of 25 hours, replaced after an hour, so that each of them lasts at
// least a day. kv is P/meta/day-lease as read with the state.
func (s *Store) dayLease(ctx context.Context, kv *mvccpb.KeyValue) (int64, error) {
	s.mu.Lock()
	day, stale := s.day, s.staleDay
	s.mu.Unlock()
	if day != 0 {
		return day, nil
	}
	var modRev int64
	if kv != nil {
		modRev = kv.ModRevision
		var cur dayRec
		if decode("day lease", kv.Value, &cur) == nil && cur.Lease != stale {
			if age := time.Since(cur.Granted); age >= -time.Hour && age < time.Hour {
				s.mu.Lock()
				s.day = cur.Lease
				s.mu.Unlock()
				return cur.Lease, nil
			}
		}
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	g, err := s.c.Grant(cctx, 25*3600)
	if err != nil {
		return 0, s.unavailable(err, false)
	}
	nr := dayRec{V: formatVersion, Lease: int64(g.ID), Granted: time.Now()}
	resp, err := s.c.Txn(cctx).
		If(clientv3.Compare(clientv3.ModRevision(s.k.dayLease()), "=", modRev)).
		Then(clientv3.OpPut(s.k.dayLease(), encode(nr))).
		Else(clientv3.OpGet(s.k.dayLease())).Commit()
	if err != nil {
		return 0, s.unavailable(err, false)
	}
	lease := int64(g.ID)
	if !resp.Succeeded {
		// Someone replaced it first: use theirs, unless it is the stale one.
		var cur dayRec
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 && decode("day lease", kvs[0].Value, &cur) == nil && cur.Lease != stale {
			_, _ = s.c.Revoke(cctx, g.ID)
			lease = cur.Lease
		} else {
			// Theirs is stale too: replace it unconditionally.
			if _, err := s.c.Put(cctx, s.k.dayLease(), encode(nr)); err != nil {
				return 0, s.unavailable(err, false)
			}
		}
	}
	s.mu.Lock()
	s.day = lease
	s.mu.Unlock()
	return lease, nil
}

// dropDay forgets a day lease that the server no longer has, so that the
// next dayLease grants another even if P/meta/day-lease still names it.
func (s *Store) dropDay(day int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.day == day {
		s.day = 0
	}
	s.staleDay = day
}
