package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
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
	limitCmp bool // the limit's revision is compared already
	full     bool // out of room: commit this, then settle again

	gone     map[*entry]bool // entries the plan removes
	removed  []store.Removal // tickets removed by a sweep (reaped)
	revoke   []int64         // leases to revoke after the commit
	promoted []*entry
}

type writeOp struct {
	del   bool
	val   string
	lease int64 // 0: none
	keep  bool  // keep the key's lease (a rewrite of a live ticket)
	day   bool  // put under the day lease
}

func (s *Store) newPlan(st *lstate) *plan {
	return &plan{s: s, st: st, now: time.Now(), w: map[string]writeOp{}, gone: map[*entry]bool{}}
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

// event logs one event of the limit.
func (p *plan) event(kind string, r rec, fence int64, evidence string) {
	e := eventRec{V: formatVersion, I: p.events, NewFence: fence == 0 && kind == "admitted", Event: store.Event{Time: p.now, Kind: kind, Limit: r.Limit,
		Ticket: r.ID, Fence: uint64(fence), Slot: r.Slot, Host: r.Holder.Host, Pid: r.Holder.Pid,
		User: r.Holder.User, Command: r.Holder.Command(), Evidence: evidence}}
	if r.State != store.Held {
		e.Slot = -1
	}
	p.events++
	p.put(p.s.k.event(r.Limit, r.ID, kind), writeOp{val: encode(e), day: true})
}

// tombstone turns the id's key into the record of its removal, for a day.
func (p *plan) tombstone(id, limit string, why store.Reason) {
	p.put(p.s.k.id(id), writeOp{val: encode(idRec{V: formatVersion, Limit: limit, Removed: why, At: p.now}), day: true})
}

// compareLimit makes the plan depend on the limit's size as read.
func (p *plan) compareLimit() {
	if p.limitCmp {
		return
	}
	p.limitCmp = true
	if p.st.limKV == nil {
		p.cmp(clientv3.Compare(clientv3.CreateRevision(p.s.k.limit(p.st.name)), "=", 0))
	} else {
		p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.limit(p.st.name)), "=", p.st.limKV.ModRevision))
	}
}

// remove deletes a ticket (compare-and-delete on the revision read),
// tombstones its id and logs why. It reports false when out of room.
func (p *plan) remove(e *entry, why store.Reason, evidence string) bool {
	if !p.room(5, 2) {
		return false
	}
	l, id := e.r.Limit, e.r.ID
	p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.record(l, id)), "=", e.rkv.ModRevision))
	if e.tkv != nil {
		p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.ticket(l, id)), "=", e.tkv.ModRevision))
		p.del(p.s.k.ticket(l, id))
		if e.r.State == store.Held {
			if kv := p.st.slots[e.r.Slot]; kv != nil && string(kv.Value) == id {
				p.del(string(kv.Key))
			}
		}
		p.revoke = append(p.revoke, e.r.Lease)
	}
	p.del(p.s.k.record(l, id))
	p.gone[e] = true
	p.tombstone(id, l, why)
	p.event(string(why), e.r, e.fence, evidence)
	return true
}

// settle sweeps the limit and promotes its waiters, the step every write
// that can free or add capacity ends with. The policy is store.PlanSettle's:
// expired tickets (records whose lease the server revoked) are removed, and
// so are holders proven dead, probed as the bbolt store does; an expired one
// is shown to the judge only by a reap (all). The judge may stop an
// orphaned job (act). Tickets the plan removes already (a release) count as
// gone; the ticket being enqueued is admitted but not judged.
func (p *plan) settle(all bool) {
	st := p.st
	if st.lim == nil {
		return
	}
	in := store.SettleInput{Slots: map[string]int{st.name: st.lim.Slots}, Judge: p.s.dead, All: all}
	es := p.queued(&in, time.Millisecond)
	plan := store.PlanSettle(in)
	for _, rm := range plan.Remove {
		e := es[rm.Index]
		if !p.remove(e, store.Reaped, rm.Evidence) {
			return // out of room: the admissions may rest on this removal
		}
		p.removed = append(p.removed, store.Removal{Ticket: p.s.view(e, 0, 0), Reason: store.Reaped, Evidence: rm.Evidence})
	}
	for _, a := range plan.Admit {
		if !p.admit(es[a.Index], a.Slot) {
			return
		}
	}
}

// queued fills in's tickets with the limit's entries that this plan keeps,
// in queue order, and returns those entries. A live ticket is shown to the
// judge with remaining left (its lease is the server's to tell).
func (p *plan) queued(in *store.SettleInput, remaining time.Duration) []*entry {
	var es []*entry
	for _, e := range p.st.entries {
		if p.gone[e] {
			continue
		}
		q := store.Queued{Fresh: e.isNew, Ticket: p.s.view(e, 0, remaining)}
		if !e.live() {
			q.Expired = expiredEvidence
		}
		q.Ticket.Limit = p.st.name
		es = append(es, e)
		in.Tickets = append(in.Tickets, q)
	}
	return es
}

// admit puts the waiter e into slot index i: compare the slot key as read
// (absent, or freed in this plan by a removal whose compare covers it) and
// the limit's size, and rewrite the ticket held. It reports false when out of room.
func (p *plan) admit(e *entry, i int) bool {
	st := p.st
	if !p.room(4, 3) {
		return false
	}
	p.compareLimit()
	if kv := st.slots[i]; kv == nil {
		p.cmp(clientv3.Compare(clientv3.CreateRevision(p.s.k.slot(st.name, i)), "=", 0))
	} else {
		p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.slot(st.name, i)), "=", kv.ModRevision))
	}
	e.r.State, e.r.Slot, e.r.Admitted = store.Held, i, p.now
	if e.isNew {
		p.putNew(e)
	} else {
		p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.ticket(st.name, e.r.ID)), "=", e.tkv.ModRevision))
		p.put(p.s.k.ticket(st.name, e.r.ID), writeOp{val: encode(e.r), keep: true})
		p.put(p.s.k.record(st.name, e.r.ID), writeOp{val: encode(e.r)})
	}
	p.put(p.s.k.slot(st.name, i), writeOp{val: e.r.ID, lease: e.r.Lease})
	p.event("admitted", e.r, e.fence, "")
	p.promoted = append(p.promoted, e)
	return true
}

// putNew writes a new ticket's keys (Enqueue).
func (p *plan) putNew(e *entry) {
	v := encode(e.r)
	p.put(p.s.k.ticket(e.r.Limit, e.r.ID), writeOp{val: v, lease: e.r.Lease})
	p.put(p.s.k.record(e.r.Limit, e.r.ID), writeOp{val: v})
	p.put(p.s.k.id(e.r.ID), writeOp{val: encode(idRec{V: formatVersion, Limit: e.r.Limit, Lease: e.r.Lease})})
}

// after is the limit as the plan leaves it (for the answer to the caller;
// its revisions are not for comparing).
func (p *plan) after() *lstate {
	st := *p.st
	st.entries = nil
	for _, e := range p.st.entries {
		if !p.gone[e] {
			st.entries = append(st.entries, e)
		}
	}
	return &st
}

// ops are the plan's writes as etcd operations.
func (p *plan) ops(day int64) []clientv3.Op {
	out := make([]clientv3.Op, 0, len(p.keys))
	for _, k := range p.keys {
		w := p.w[k]
		switch {
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
		resp, nst, err := s.try(ctx, p, st.name, id)
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

// try runs the plan once. On a failed compare it returns errRetry and the
// state at the revision of the failure (read in the same transaction). A
// lease that vanished between the read and the commit (a waiter's expired,
// the day lease ran out) is also a retry, on a fresh read.
func (s *Store) try(ctx context.Context, p *plan, limit, id string) (*clientv3.TxnResponse, *lstate, error) {
	var day int64
	if p.needDay {
		var err error
		if day, err = s.dayLease(ctx, p.st.dayKV); err != nil {
			return nil, nil, err
		}
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Txn(cctx).If(p.cmps...).Then(p.ops(day)...).Else(s.readOps(limit, id, false)...).Commit()
	if err != nil {
		if isLeaseNotFound(err) {
			if p.needDay {
				s.dropDay(day)
			}
			st, rerr := s.read(ctx, limit, id, false)
			if rerr != nil {
				return nil, nil, rerr
			}
			return nil, st, errRetry
		}
		return nil, nil, s.unavailable(err, false)
	}
	s.answered()
	if !resp.Succeeded {
		st, err := s.parseState(limit, resp.Header.Revision, getResponses(resp.Responses), id != "")
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
