package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// Resize implements [store.Store] in one transaction, compared at the
// revision read (docs/leases.md §2.1 item 12). The ticket's keys in every
// limit are rewritten on the revision of its ticket key (keeping its
// lease), and its slot keys follow its indexes: a shrink deletes the freed
// ones and settles the closure of its limits as a release does, so the
// waiters it makes room for are admitted in the same transaction; a growth
// puts the slot keys of what policy.PlanResize finds free (a ticket whose
// lease the server expired waits for nothing), under the ticket's lease,
// with compares that no slot key was written, no ticket joined and no size
// changed in its limits since the read. A growth stops at MaxTicketKeys: a
// ticket must stay removable in one transaction.
func (s *Store) Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	out, err := s.resize(ctx, t, weight)
	if errors.Is(err, errNotLive) && store.CheckTTL(t.TTL) == nil {
		// Its lease is gone: after an election a hold may keep the ticket,
		// which a renewal takes over (quarantine.go); then resize again.
		if _, rerr := s.Renew(ctx, t, t.TTL); rerr == nil {
			out, err = s.resize(ctx, t, weight)
		}
	}
	return out, err
}

// errNotLive marks a resize refused because the ticket's lease is gone.
var errNotLive = errors.New("its lease is gone")

func (s *Store) resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error) {
	return s.pol.Resize(ctx, t, weight)
}

// resizable finds t in st: the live held ticket of t's fence, else why it
// cannot be resized.
func resizable(st *lstate, t store.Ticket) (*entry, error) {
	if st.idKV == nil {
		return nil, fmt.Errorf("%w: %w", store.ErrLost, notFound(t.ID, nil))
	}
	ir, err := decodeID(t.ID, st.idKV.Value)
	if err != nil {
		return nil, err
	}
	if ir.Removed != "" {
		return nil, fmt.Errorf("%w: %w", store.ErrLost, notFound(t.ID, &ir))
	}
	e, _ := st.find(t.ID)
	if e == nil {
		return nil, fmt.Errorf("%w: ticket %s is gone", store.ErrLost, t.ID)
	}
	switch {
	case uint64(e.fence) != t.Fence:
		return e, fmt.Errorf("%w: ticket %s has fence %d, not %d", store.ErrLost, t.ID, e.fence, t.Fence)
	case !e.live():
		return e, fmt.Errorf("%w: %w: ticket %s: %s", store.ErrLost, errNotLive, t.ID, expiredEvidence)
	case e.r.State != store.Held:
		return e, fmt.Errorf("%w: ticket %s is waiting: only a held ticket can be resized", store.ErrInvalid, t.ID)
	}
	return e, nil
}

// grow plans the growth of held ticket e toward weight on the state read,
// and reports whether it takes anything.
func (p *plan) grow(e *entry, weight int) bool {
	in := policy.ResizeInput{Ticket: p.s.view(e, 0, 0), Weight: weight, Slots: map[string]int{},
		MaxWeight: MaxTicketKeys/len(e.r.names()) - 3}
	for _, n := range e.r.names() {
		if l := p.st.lim(n); l != nil {
			in.Slots[n] = l.Slots
		}
	}
	for _, o := range p.st.entries {
		if o != e {
			q := policy.Queued{Ticket: p.s.view(o, 0, 0)}
			if !o.live() {
				q.Expired = expiredEvidence
			}
			in.Tickets = append(in.Tickets, q)
		}
	}
	w, ix := policy.PlanResize(in)
	if w <= e.r.weighs() {
		return false
	}
	names := e.r.names()
	if !p.room(len(names)*(3+w-e.r.weighs()), 1+3*len(names)) {
		return false
	}
	for _, n := range names {
		// Nobody was admitted, no ticket joined (a waiter goes first) and
		// no size changed since the read.
		p.compareLimit(n)
		p.compareSlots(n)
		p.cmp(clientv3.Compare(clientv3.CreateRevision(p.s.k.tickets(n)).WithPrefix(), "<", p.st.rev+1))
	}
	p.resized(e, w, ix)
	return true
}

// resized rewrites held ticket e with weight w and slot indexes ix in each
// of its limits, on the revision read: its ticket key (keeping its lease)
// and record under every limit, the slot keys it gives up deleted, those it
// takes put under its lease, and a "resized" event in each limit with the
// new weight.
func (p *plan) resized(e *entry, w int, ix map[string][]int) {
	names := e.r.names()
	p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.ticket(e.at, e.r.ID)), "=", e.tkv.ModRevision))
	for _, n := range names {
		old := e.r.in(n)
		for _, i := range old {
			if slices.Contains(ix[n], i) {
				continue
			}
			if ls := p.st.lims[n]; ls != nil {
				if kv := ls.slots[i]; kv != nil && string(kv.Value) == e.r.ID {
					p.del(string(kv.Key))
				}
			}
		}
		for _, i := range ix[n] {
			if !slices.Contains(old, i) {
				p.put(p.s.k.slot(n, i), writeOp{val: e.r.ID, lease: e.r.keyLease()})
			}
		}
	}
	e.r.Weight, e.r.Slot, e.r.Indexes = w, ix[e.r.Limit][0], nil
	if len(names) > 1 || w > 1 {
		e.r.Indexes = map[string][]int{}
		for _, n := range names {
			e.r.Indexes[n] = slices.Clone(ix[n])
		}
	}
	if w == 1 {
		e.r.Weight = 0 // as a ticket of weight 1 is written
	}
	if e.r.V < 2 && e.r.Indexes != nil {
		e.r.V = formatVersion // a version 1 record has no weight nor indexes
	}
	v := encode(e.r)
	for _, n := range names {
		p.put(p.s.k.ticket(n, e.r.ID), writeOp{val: v, keep: true})
		p.put(p.s.k.record(n, e.r.ID), writeOp{val: v})
	}
	// A ticket resizes many times: each event has a key of its own, named
	// by the revision of the ticket key it rewrites (one resize per revision).
	p.eventSuffix = strconv.FormatInt(e.tkv.ModRevision, 10)
	p.event(store.Resized, e.r, e.fence, "")
	p.eventSuffix = ""
}
