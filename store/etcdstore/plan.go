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

	gone    map[*entry]bool          // entries the plan removes
	revoke  []int64                  // leases to revoke after the commit
	counted map[string]*store.Counts // the counts this plan writes, by limit (countsrec.go)

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

// dayKnown is the day lease this handle puts tombstones and events under,
// 0 before it has one.
func (s *Store) dayKnown() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.day
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
