package etcdstore

import (
	"fmt"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// commit writes the step in one transaction, or nothing when it wrote
// nothing. errRetry: a compare failed, or a lease it writes under is gone.
func (t *etx) commit() error {
	if t.g == nil || t.p == nil {
		return nil
	}
	p := t.p
	renew, err := t.compile(p, false)
	if err != nil {
		return err
	}
	if p.empty() {
		return nil
	}
	if len(p.keys) > maxTxnOps || len(p.cmps) > maxTxnOps {
		return fmt.Errorf("%w: one step writes %d keys on %d compares, more than one etcd transaction holds (%d)",
			store.ErrUnavailable, len(p.keys), len(p.cmps), maxTxnOps)
	}
	for _, l := range renew {
		ka, sent, err := t.s.keepAliveOnce(t.ctx, l)
		if isLeaseNotFound(err) {
			return errRetry // read again: its ticket key is gone with it
		} else if err != nil {
			t.unanswered = true
			return t.s.unavailable(err, false)
		}
		t.s.leases.acked(l, sent, time.Duration(ka.TTL)*time.Second)
	}
	if err := t.s.grantHolds(t.ctx, p); err != nil {
		t.unanswered = true
		return err
	}
	var day int64
	if p.needDay {
		if day, err = t.s.dayLease(t.ctx, t.st.dayKV); err != nil { // t.p comes with t.st
			t.unanswered = true
			return err
		}
	}
	cctx, cancel := t.s.ctx(t.ctx)
	defer cancel()
	t.sent = true
	resp, err := t.s.c.Txn(cctx).If(p.cmps...).Then(p.ops(day)...).Commit()
	if err != nil {
		return t.failed(p, day, err)
	}
	t.s.answered()
	if !resp.Succeeded {
		t.s.revokeHolds(p)
		return errRetry
	}
	t.rev = resp.Header.Revision
	t.committed(p)
	return nil
}

// failed is the error of a transaction that got no answer or was refused.
func (t *etx) failed(p *plan, day int64, err error) error {
	if isLeaseNotFound(err) {
		t.s.revokeHolds(p)
		if p.needDay {
			t.s.dropDay(day)
		}
		if t.fresh != "" { // granted long ago, perhaps: a new one
			t.g.release(t.ctx, t.s)
			*t.g = freshLease{}
		}
		return errRetry
	}
	err = t.s.unavailable(err, false)
	if unknownOutcome(err) {
		t.g.used = true // perhaps the ticket's now: its TTL ends it otherwise
		return fmt.Errorf("%w (%w)", err, store.ErrUnknownOutcome)
	}
	t.s.revokeHolds(p)
	return err
}

// committed tells this handle what the step wrote: the new ticket it
// remembers and whose lease it keeps, the bells it rings, the leases of
// the removed tickets it revokes.
func (t *etx) committed(p *plan) {
	if w := t.recW[t.fresh]; t.fresh != "" && w != nil {
		t.g.used = true
		e := &entry{r: recFrom(w, rec{V: formatVersion, Lease: t.g.lease, Term: t.g.term}), fence: t.rev}
		t.s.remember(e, t.rev)
		t.s.ring(t.fresh, e.r.names(), e.r.State == store.Held, t.rev)
	}
	for _, id := range t.rings {
		if w := t.recW[id]; w != nil && id != t.fresh {
			t.s.ring(id, w.Names(), w.State == store.Held, t.rev)
		}
	}
	for id, w := range t.recW {
		switch e := t.st.byID[id]; {
		case w == nil:
			t.s.forget(id)
		case t.rewrote[id] && t.looked[id] && e.tkv != nil && t.s.knows(id):
			// The caller's own ticket (SetChild, Resize), as this step
			// wrote it: its bell, in this handle, is not rung by the write.
			// Another ticket the step rewrote (a stop request) is not:
			// its bell must hear that.
			t.s.remember(&entry{r: recFrom(w, e.r), fence: e.fence}, t.rev)
		}
	}
	t.s.revokeRemoved(p, t.ctx.Value(revokeWait{}) != nil)
}

// Fits implements policy.Bounded: room in the transaction, beside what
// the step wrote, for one more removal or admission of r (its keys in each
// limit, its tombstone, and each limit's counts and rate). A step that
// wrote nothing yet has room for any ticket (MaxTicketKeys).
func (t *etx) Fits(r policy.Rec) bool {
	if t.p == nil {
		return true
	}
	q := t.p.clone()
	if _, err := t.compile(q, true); err != nil || q.empty() {
		return true // commit says what is wrong
	}
	names := r.Names()
	c := q.countRoom(names)
	return q.room(ticketKeys(len(names), r.Weighs())+1+len(names)+c, 2+3*len(names)+c)
}

// clone is a copy of p that can be written without changing p.
func (p *plan) clone() *plan {
	q := *p
	q.cmps, q.keys, q.w = slices.Clone(p.cmps), slices.Clone(p.keys), maps.Clone(p.w)
	q.gone, q.kept, q.holding, q.revoke = maps.Clone(p.gone), maps.Clone(p.kept), slices.Clone(p.holding), slices.Clone(p.revoke)
	q.limitCmp, q.slotCmp, q.orderCmp, q.charged = maps.Clone(p.limitCmp), maps.Clone(p.slotCmp), maps.Clone(p.orderCmp), maps.Clone(p.charged)
	q.counted = map[string]*store.Counts{}
	for n, c := range p.counted {
		v := cloneCounts(*c)
		q.counted[n] = &v
	}
	return &q
}

// compile puts the step's writes in p with their compares, and returns the
// leases its renewals keep alive. dry: only to measure them (Fits), with
// no lease granted.
func (t *etx) compile(p *plan, dry bool) (renew []int64, err error) {
	created := t.compileLimits(p)
	defer func() {
		for _, n := range created {
			t.st.lims[n].lim = nil // as read
		}
	}()
	for _, id := range t.order {
		w := t.recW[id]
		switch e := t.st.byID[id]; {
		case id == t.fresh:
			if w != nil {
				if err := t.putFresh(p, w, dry); err != nil {
					return nil, err
				}
			}
		case e == nil:
			return nil, fmt.Errorf("etcdstore: ticket %s written but not read", id)
		case w == nil:
			t.remove(p, e)
		default:
			if !w.Renewed.IsZero() { // renewed: etcd's server moves the deadline
				renew = append(renew, e.r.keyLease())
			}
			if err := t.rewrite(p, e, w); err != nil {
				return nil, err
			}
		}
	}
	t.compileTombs(p)
	for _, k := range t.unlogged {
		p.cmp(clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
	}
	for _, e := range t.events {
		t.logEvent(p, e)
	}
	for _, n := range sortedKeys(t.limW) {
		if t.limW[n] == nil {
			p.dropCounts(n)
		}
	}
	return renew, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// compileLimits writes the limits the step wrote or removed, on their keys
// as read; one it creates counts from zero, and is returned (its limit
// stands in the state read while the step's events are counted).
func (t *etx) compileLimits(p *plan) (created []string) {
	for _, n := range sortedKeys(t.limW) {
		l := t.limW[n]
		p.compareLimit(n)
		if l == nil {
			// Its tickets went in this step: nobody may have joined since.
			p.cmp(clientv3.Compare(clientv3.CreateRevision(t.s.k.records(n)).WithPrefix(), "<", t.st.rev+1))
			p.del(t.s.k.limit(n))
			continue
		}
		lr := limitRec{V: formatVersion, Slots: l.Slots, Created: l.Created, Policy: l.Policy, Starts: l.Starts}
		p.put(t.s.k.limit(n), writeOp{val: encode(lr)})
		if ls := t.st.lims[n]; ls.lim == nil {
			ls.lim = &lr // the events of this step count in it
			p.newCounts(n)
			created = append(created, n)
		}
	}
	return created
}

// recFrom is the stored record of w, with side's fields the rules do not
// know of (its lease, term, hold, supersede mark, version).
func recFrom(w *policy.Rec, side rec) rec {
	r := rec{V: side.V, ID: w.ID, Limit: w.Limit, Lease: side.Lease, State: w.State, Slot: w.Slot, TTL: w.TTL,
		Holder: w.Holder, Created: w.Created, Admitted: w.Admitted, Key: w.Key, Stop: w.Stop, Priority: w.Priority,
		Share: w.Share, Superseding: w.Superseding, Term: side.Term, Hold: side.Hold}
	if r.V == 0 {
		r.V = formatVersion
	}
	if len(w.Replaces) > 0 {
		r.Replaces = w.Replaces
	}
	names := w.Names()
	if len(names) > 1 {
		r.Limits = names
	}
	if w.Weighs() > 1 {
		r.Weight = w.Weighs()
	}
	if w.State == store.Held && (len(names) > 1 || w.Weighs() > 1) {
		r.Indexes = w.Indexes
	}
	if r.V < 2 && r.setsVersion2Fields() {
		r.V = formatVersion
	}
	return r
}

// putFresh writes the ticket the step creates, under its new lease: its
// id absent, no ticket joined its limits since the read.
func (t *etx) putFresh(p *plan, w *policy.Rec, dry bool) error {
	lease, term := int64(1), uint64(0)
	if !dry {
		var err error
		if lease, term, err = t.g.get(t.ctx, t.s, w.TTL); err != nil {
			t.unanswered = true
			return err
		}
	}
	e := &entry{isNew: true, r: recFrom(w, rec{V: formatVersion, Lease: lease, Term: term})}
	names := e.r.names()
	p.cmp(clientv3.Compare(clientv3.CreateRevision(t.s.k.id(w.ID)), "=", 0))
	for _, n := range names {
		p.cmp(clientv3.Compare(clientv3.CreateRevision(t.s.k.tickets(n)).WithPrefix(), "<", t.st.rev+1))
	}
	p.putNew(e)
	if e.r.Superseding {
		// Its Replaces names every older holder of its key: none admitted since the read.
		for _, n := range names {
			p.compareSlots(n)
		}
	}
	if e.r.State == store.Held {
		for _, n := range names {
			t.compareAdmission(p, n)
			for _, i := range e.r.in(n) {
				p.put(t.s.k.slot(n, i), writeOp{val: w.ID, lease: lease})
			}
		}
	}
	return nil
}

// compareAdmission makes a step that takes slots in limit n rest on its
// size, its slot keys and, ordered by policy, its waiters as read.
func (t *etx) compareAdmission(p *plan, n string) {
	p.compareLimit(n)
	p.compareSlots(n)
	p.compareOrder(n)
}

// remove deletes e from all of its limits, on its keys as read, and frees
// its slots there; its lease is revoked after the commit.
func (t *etx) remove(p *plan, e *entry) {
	names, id := e.r.names(), e.r.ID
	p.cmp(clientv3.Compare(clientv3.ModRevision(t.s.k.record(e.at, id)), "=", e.rkv.ModRevision))
	if e.tkv != nil {
		p.cmp(clientv3.Compare(clientv3.ModRevision(t.s.k.ticket(e.at, id)), "=", e.tkv.ModRevision))
		p.revoke = append(p.revoke, e.r.Lease)
	}
	if i := slices.Index(p.holding, e); i >= 0 {
		// Kept by this step, then removed (proven dead): none of its
		// hold's writes stand.
		p.holding = slices.Delete(p.holding, i, i+1)
		for _, n := range names {
			for _, ix := range e.r.in(n) {
				if k := t.s.k.slot(n, ix); p.w[k].hold != nil {
					p.put(k, writeOp{del: true})
				}
			}
		}
	}
	for _, n := range names {
		p.put(t.s.k.ticket(n, id), writeOp{del: true})
		p.put(t.s.k.record(n, id), writeOp{del: true})
		t.freeSlots(p, e, n, nil)
	}
	p.gone[e] = true
}

// freeSlots deletes e's slot keys in limit n as read (under its lease or
// its hold's), but those of keep.
func (t *etx) freeSlots(p *plan, e *entry, n string, keep []int) {
	ls := t.st.lims[n]
	if ls == nil {
		return
	}
	for _, i := range e.r.in(n) {
		if kv := ls.slots[i]; kv != nil && string(kv.Value) == e.r.ID && !slices.Contains(keep, i) {
			p.del(string(kv.Key))
		}
	}
}

// rewrite writes e again as w in all of its limits, keeping its lease, on
// its keys as read; the slot keys follow its indexes, new ones under its
// lease (or hold), compared as an admission.
func (t *etx) rewrite(p *plan, e *entry, w *policy.Rec) error {
	nr := recFrom(w, e.r)
	v := encode(nr)
	if v == encode(e.r) {
		return nil
	}
	id, names := e.r.ID, nr.names()
	hold := slices.Contains(p.holding, e)
	if t.rewrote == nil {
		t.rewrote = map[string]bool{}
	}
	t.rewrote[id] = true
	switch {
	case e.tkv != nil:
		p.cmp(clientv3.Compare(clientv3.ModRevision(t.s.k.ticket(e.at, id)), "=", e.tkv.ModRevision))
	default:
		p.cmp(clientv3.Compare(clientv3.ModRevision(t.s.k.record(e.at, id)), "=", e.rkv.ModRevision))
	}
	for _, n := range names {
		switch {
		case hold:
			p.put(t.s.k.record(n, id), writeOp{hold: &nr, holdRec: true, unleased: true})
			p.put(t.s.k.ticket(n, id), writeOp{hold: &nr, holdRec: true})
		case e.tkv != nil:
			p.put(t.s.k.ticket(n, id), writeOp{val: v, keep: true})
			p.put(t.s.k.record(n, id), writeOp{val: v})
		default:
			p.put(t.s.k.record(n, id), writeOp{val: v})
		}
		old, now := e.r.in(n), nr.in(n)
		grown := false
		for _, i := range now {
			if slices.Contains(old, i) {
				continue
			}
			if e.tkv == nil && !hold {
				return fmt.Errorf("%w: ticket %s: %w", store.ErrLost, id, errNotLive)
			}
			grown = true
			if hold {
				p.put(t.s.k.slot(n, i), writeOp{val: id, hold: &nr})
			} else {
				p.put(t.s.k.slot(n, i), writeOp{val: id, lease: e.r.Lease})
			}
		}
		if grown {
			t.compareAdmission(p, n)
			if len(old) > 0 { // a growth: a waiter that joined since comes first
				p.cmp(clientv3.Compare(clientv3.CreateRevision(t.s.k.tickets(n)).WithPrefix(), "<", t.st.rev+1))
			}
		}
		t.freeSlots(p, e, n, now)
	}
	return nil
}

// compileTombs writes the tombstones of the step (under the day lease): a
// removed ticket's, or an id never created (a cancel before its create),
// which must still be absent.
func (t *etx) compileTombs(p *plan) {
	for _, id := range sortedKeys(t.tombs) {
		tb := t.tombs[id]
		var names []string
		if e := t.st.byID[id]; e != nil {
			names = e.r.names()
		} else if kv := t.ids[id]; kv != nil {
			if ir, err := decodeID(id, kv.Value); err == nil && ir.Removed == "" {
				names = ir.names()
			}
		}
		switch kv := t.ids[id]; {
		case kv == nil:
			p.cmp(clientv3.Compare(clientv3.CreateRevision(t.s.k.id(id)), "=", 0))
		case t.st.byID[id] == nil:
			p.cmp(clientv3.Compare(clientv3.ModRevision(t.s.k.id(id)), "=", kv.ModRevision))
		}
		ir := idRec{V: formatVersion, Removed: tb.Reason, At: tb.Wall, By: tb.By}
		if len(names) > 0 {
			ir.Limit = names[0]
		}
		if len(names) > 1 {
			ir.Limits = names
		}
		p.put(t.s.k.id(id), writeOp{val: encode(ir), day: true})
	}
}

// logEvent writes one event (under the day lease) and counts it in its
// limit. A kind a ticket logs more than once has keys of its own: a
// "replaced" event's ends in the newer run's id, a "resized" one's in the
// step's revision.
func (t *etx) logEvent(p *plan, e store.Event) {
	key := e.Kind
	switch e.Kind {
	case "replaced":
		key += "." + e.By
	case "resized":
		key += "." + itoa(int(t.st.rev))
	}
	er := eventRec{V: formatVersion, I: p.events, Event: e}
	if e.Fence == freshFence {
		er.NewFence, er.Fence = true, 0 // the step's revision, read back
	}
	p.events++
	p.put(t.s.k.event(e.Limit, e.Ticket, key), writeOp{val: encode(er), day: true})
	p.count(e)
}
