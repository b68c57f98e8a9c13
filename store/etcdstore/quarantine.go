package etcdstore

// A ticket outlives its lease by a TTL when the lease may have ended early,
// and its holder takes the hold over (docs/leases.md rule 16).
//
// etcd can end a live lease: a leader stalled past the TTL (SIGSTOP, a
// paused VM) ticks the moment it resumes, which skips the leadership check
// of its lessor (isActive in etcdserver's ensureLeadership, the fix of
// etcd-io/etcd#15247), so it revokes the leases that expired in its stale
// view, and the revokes, forwarded to the real leader, commit. The holders
// and waiters were renewing at the real leader: their local deadlines lie
// up to a TTL ahead, their jobs still run, and the cluster suite saw their
// slots handed to the next waiters (3–5 children in a limit of 2). No
// client can stop a server revoking a lease, so a settle that finds a
// ticket whose lease is gone, when the cluster's raft term moved past the
// one its lease was granted in, keeps it: it gives the ticket a hold, a new
// lease of the ticket's TTL, and puts its ticket key (and, held, its slot
// keys) again under it, its record naming the new lease. The ticket keeps
// its place (its fence, the create revision of its record, does not
// change) and its slots. Its holder, if alive, finds its own lease gone at
// its next renewal, reads the record, and renews the hold from then on:
// the job runs on, the waiter waits on. If nobody takes the hold over, it
// expires, and the next settle removes the ticket as expired; a release or
// a judge that proves the holder dead ends it at once.
//
// Only an election makes a stale leader, so a lease that vanishes in the
// term it was granted in is a real expiry: the slot comes back within the
// TTL, as a crashed holder's must. After an election, a crashed holder's
// slot on another host comes back within two TTLs (one more for each
// election meanwhile); so does one whose lease a member granted before it
// heard of the current leader (it answers with its older term), which errs
// on the side of the hold.
//
// A record that names a Hold was written by an earlier release, which kept
// a held ticket's slot keys only, on a hold its holder could not take
// over: it is read as before (onHold), and ends with that hold.

import (
	"context"
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

// holds reports whether the settle keeps e although its lease is gone: it
// is on an earlier release's hold, or the cluster elected a leader since
// its lease was granted (a record without a Term, written before there
// were holds, counts as granted before any election) and, held, its slots
// are still its own. Then it writes the hold.
func (p *plan) holds(e *entry) bool {
	if e.onHold() {
		return true
	}
	if e.live() || e.r.Hold != 0 || p.s.term.Load() <= e.r.Term {
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

// onHold reports whether e is held on an earlier release's hold: its
// record names one and its slot keys, under the hold's lease, are there in
// every limit read.
func (e *entry) onHold() bool {
	return e.r.Hold != 0 && e.tkv == nil && !e.holdGone
}

// sawSlots notes, for e read under limit with its slot keys, whether an
// earlier release's hold still keeps them.
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

// grantedHold is the lease try granted for a ticket's hold, and the raft
// term known when it was granted (the ticket's Term from then on).
type grantedHold struct {
	lease int64
	term  uint64
}

// hold gives e a hold: its ticket key, its slot keys and its records are
// put again in every limit, under a lease of e's TTL of its own (granted
// by try, so that its holder can take it over alone), its records naming
// that lease and the term it was granted in, on the revision of its
// record and slot keys as read. Its fence, its record's create revision,
// stays. Out of room, it writes nothing: the ticket stays kept in this
// plan, and a later settle writes the hold.
func (p *plan) hold(e *entry) {
	names := e.r.names()
	if c := p.countRoom(names); !p.room(ticketKeys(len(names), e.r.Weight)+c, 1+len(names)+c) {
		return
	}
	p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.record(e.at, e.r.ID)), "=", e.rkv.ModRevision))
	p.cmp(clientv3.Compare(clientv3.CreateRevision(p.s.k.ticket(e.at, e.r.ID)), "=", 0))
	for _, n := range names {
		p.compareSlots(n)
	}
	p.holding = append(p.holding, e)
	r := e.r
	for _, n := range names {
		p.put(p.s.k.record(n, r.ID), writeOp{hold: &r, holdRec: true, unleased: true})
		p.put(p.s.k.ticket(n, r.ID), writeOp{hold: &r, holdRec: true})
		for _, i := range r.in(n) {
			p.put(p.s.k.slot(n, i), writeOp{val: r.ID, hold: &r})
		}
	}
	what := "its place"
	if r.State == store.Held {
		what = "its slots"
	}
	p.event(store.Kept, r, e.fence, fmt.Sprintf("its lease ended after an election (raft term %d, granted in %d): it keeps %s under a new lease of %s, which its holder takes over as it renews; unrenewed, it ends then",
		p.s.term.Load(), r.Term, what, time.Duration(leaseTTL(r.TTL))*time.Second))
}

// grantHolds grants each hold of the plan its lease, before its commit.
func (s *Store) grantHolds(ctx context.Context, p *plan) error {
	for _, e := range p.holding {
		if _, ok := p.holdLeases[e.r.ID]; ok {
			continue
		}
		known := s.term.Load()
		cctx, cancel := s.ctx(ctx)
		g, err := s.c.Grant(cctx, leaseTTL(e.r.TTL))
		cancel()
		if err != nil {
			s.revokeHolds(p)
			return s.unavailable(err, false)
		}
		if p.holdLeases == nil {
			p.holdLeases = map[string]grantedHold{}
		}
		p.holdLeases[e.r.ID] = grantedHold{lease: int64(g.ID), term: grantTerm(known, g.ResponseHeader)}
	}
	return nil
}

// revokeHolds revokes the hold leases of a plan that did not commit.
func (s *Store) revokeHolds(p *plan) {
	q := &plan{}
	for _, h := range p.holdLeases {
		q.revoke = append(q.revoke, h.lease)
	}
	p.holdLeases = nil
	s.revokeRemoved(q, false)
}

// holdOp is the put of a key of a ticket under its hold: a slot key, or
// its ticket key or (unleased) record naming the hold's lease.
func holdOp(k string, w writeOp, h grantedHold) clientv3.Op {
	if !w.holdRec {
		return clientv3.OpPut(k, w.val, clientv3.WithLease(clientv3.LeaseID(h.lease)))
	}
	r := *w.hold
	r.Lease, r.Term = h.lease, h.term
	if w.unleased {
		return clientv3.OpPut(k, encode(r))
	}
	return clientv3.OpPut(k, encode(r), clientv3.WithLease(clientv3.LeaseID(h.lease)))
}
