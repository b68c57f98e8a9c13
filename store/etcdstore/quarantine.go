package etcdstore

// A held ticket's slots outlive its lease by a TTL when the lease may have
// ended early (docs/leases.md rule 16).
//
// etcd can end a live lease: a leader stalled past the TTL (SIGSTOP, a
// paused VM) ticks the moment it resumes, which skips the leadership check
// of its lessor (isActive in etcdserver's ensureLeadership, the fix of
// etcd-io/etcd#15247), so it revokes the leases that expired in its stale
// view, and the revokes, forwarded to the real leader, commit. The holders
// were renewing at the real leader: their local deadlines lie up to a TTL
// ahead, their jobs still run, and the cluster suite saw their slots handed
// to the next waiters (3–5 children in a limit of 2). No client can stop a
// server revoking a lease, so the slot waits instead: a settle that finds a
// held ticket whose lease is gone, when the cluster's raft term moved past
// the one its lease was granted in, keeps the ticket held, its slot keys
// under a hold: a fresh lease of the ticket's TTL. Its holder, if alive,
// hears of the loss at its next renewal (its own lease is still gone) and
// stops its job before its local deadline, which is at most a TTL after
// the revoke; then its release frees the slot at once, as does a judge
// that proves it dead. Otherwise the hold expires and the next settle
// removes the ticket as expired.
//
// Only an election makes a stale leader, so a lease that vanishes in the
// term it was granted in is a real expiry: the slot comes back within the
// TTL (SPEC §4.2). After an election, a crashed holder's slot on another
// host comes back within two TTLs; so does one whose lease a member granted
// before it heard of the current leader (it answers with its older term),
// which errs on the side of the hold.

import (
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
)

// grantTerm is the Term of a ticket whose lease grant was answered with h,
// when known was the highest term seen before it was sent: the lower of the
// two (known, when not 0, is at most the term the grant committed in; the
// answer's may be a later one).
func grantTerm(known uint64, h *pb.ResponseHeader) uint64 {
	t := h.GetRaftTerm()
	if known != 0 && (t == 0 || known < t) {
		return known
	}
	return t
}

// holds reports whether the settle keeps e as held although its lease is
// gone: it is on its hold, or it held slots, no hold kept them yet and the
// cluster elected a leader since its lease was granted (a record without a
// Term, written before there were holds, counts as granted before any
// election). Then it writes the hold.
func (p *plan) holds(e *entry) bool {
	if e.onHold() {
		return true
	}
	if e.live() || e.r.State != store.Held || e.r.Hold != 0 || p.s.term.Load() <= e.r.Term {
		return false
	}
	if p.kept[e] {
		return true
	}
	// Its slots must still be its own: a client without holds may have
	// given them to another already.
	for _, n := range e.r.names() {
		ls := p.st.lims[n]
		if ls == nil {
			return false
		}
		for _, i := range e.r.in(n) {
			if kv := ls.slots[i]; kv != nil && string(kv.Value) != e.r.ID {
				return false
			}
		}
	}
	if p.kept == nil {
		p.kept = map[*entry]bool{}
	}
	p.kept[e] = true
	p.hold(e)
	return true
}

// onHold reports whether e is held on its hold: its record names one and
// its slot keys, under the hold's lease, are there in every limit read.
func (e *entry) onHold() bool {
	return e.r.Hold != 0 && e.tkv == nil && !e.holdGone
}

// sawSlots notes, for e read under limit with its slot keys, whether its
// hold still keeps them.
func (e *entry) sawSlots(limit string, slots map[int]*mvccpb.KeyValue) {
	if e.r.Hold == 0 || e.tkv != nil {
		return
	}
	for _, i := range e.r.in(limit) {
		if kv := slots[i]; kv == nil || string(kv.Value) != e.r.ID {
			e.holdGone = true
		}
	}
}

// hold puts e's slot keys again, under the hold, a lease of e's TTL granted
// with the transaction (try), and its records naming the hold, on the
// revision of its record and slot keys as read. Its ticket key stays gone:
// it carries the fence (its create revision), and the ticket's own lease
// is over. Out of room, it writes nothing: the ticket stays held in this
// plan, and a later settle writes the hold.
func (p *plan) hold(e *entry) {
	names := e.r.names()
	if c := p.countRoom(names); !p.room(ticketKeys(len(names), e.r.Weight)-len(names)+c, 1+len(names)+c) {
		return
	}
	p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.record(e.at, e.r.ID)), "=", e.rkv.ModRevision))
	for _, n := range names {
		p.compareSlots(n)
	}
	p.holdTTL = max(p.holdTTL, leaseTTL(e.r.TTL))
	r := e.r
	for _, n := range names {
		p.put(p.s.k.record(n, r.ID), writeOp{hold: &r, unleased: true})
		for _, i := range r.in(n) {
			p.put(p.s.k.slot(n, i), writeOp{val: r.ID, hold: &r})
		}
	}
	p.event(store.Kept, r, e.fence, fmt.Sprintf("its lease ended after an election (raft term %d, granted in %d): its slots are kept for up to %s, or until its holder stops and releases",
		p.s.term.Load(), r.Term, time.Duration(leaseTTL(r.TTL))*time.Second))
}

// holdOp is the put of a key of a ticket held on the hold lease: a slot
// key under it, or a record (unleased) naming it.
func holdOp(k string, w writeOp, lease int64) clientv3.Op {
	if w.unleased {
		r := *w.hold
		r.Hold = lease
		return clientv3.OpPut(k, encode(r))
	}
	return clientv3.OpPut(k, w.val, clientv3.WithLease(clientv3.LeaseID(lease)))
}
