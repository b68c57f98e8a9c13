package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
)

// unknownOutcome reports whether a failed write may have committed (its
// answer was lost): then it is retried, and finds its own effect.
func unknownOutcome(err error) bool {
	return errors.Is(err, store.ErrUnavailable) && !isAuthError(err)
}

// Enqueue implements [store.Store]: the rules' (store/policy), in one
// step, on a first read made while the ticket's lease is granted: the
// lease and that (serializable, so cheap) read at once, then one
// transaction, whose compares make a stale read plan again. A plain
// request behind a live waiter takes the light path (light.go) instead.
// A ticket of several limits has its keys under each, created in that one
// transaction: one create revision, its fence.
func (s *Store) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	if s.closed.Load() {
		return store.Ticket{}, s.errClosed()
	}
	if err := req.Check(); err != nil {
		return store.Ticket{}, err
	}
	if err := checkFits(req.Names(), req.Weight); err != nil {
		return store.Ticket{}, err
	}
	firstRead := make(chan enqueueRead, 1)
	go func() {
		st, b, err := s.readFirst(ctx, req)
		firstRead <- enqueueRead{st: st, err: err, behind: b}
	}()
	g := &freshLease{}
	defer g.release(ctx, s)
	_, _, err := g.get(ctx, s, req.TTL)
	read := <-firstRead
	if err != nil {
		return store.Ticket{}, err
	}
	if read.behind != nil {
		// Behind a live waiter: the end of the queue, no settle (light.go).
		if t, ok := s.enqueueBehind(ctx, req, g.lease, g.term, *read.behind); ok {
			g.used = true
			s.refreshIfSlow(ctx, g)
			return t, nil
		}
	}
	if read.err != nil || read.behind != nil {
		read.st = nil // the step reads for itself
	}
	out, err := s.pol.Enqueue(withSeed(ctx, read.st, req.ID, g), req)
	if errors.Is(err, store.ErrQueueFull) && read.st != nil {
		// Refused on the first, serializable read: a refusal stands only
		// on a current one.
		out, err = s.pol.Enqueue(ctx, req)
	}
	if err != nil {
		return store.Ticket{}, err
	}
	if g.used {
		s.refreshIfSlow(ctx, g)
	}
	s.mu.Lock()
	_, known := s.known[req.ID]
	s.mu.Unlock()
	if !known {
		// A retry found its ticket (an earlier answer lost): its bell
		// learns where it is.
		if _, err := s.readKnown(ctx, req.ID); err == nil {
			s.ring(req.ID, out.Names(), out.State == store.Held, 0)
		}
	}
	return out, nil
}

// refreshIfSlow restarts the lease when it was granted well before the
// ticket was written, so that the ticket has its whole TTL from its
// creation. (A failure is the renewer's to find.)
func (s *Store) refreshIfSlow(ctx context.Context, g *freshLease) {
	if s.leases.now()-g.sent > 20*time.Millisecond {
		s.refresh(ctx, g.lease)
	}
}

// enqueueRead is Enqueue's first read of the limits, made while the lease
// is granted.
type enqueueRead struct {
	st     *lstate
	err    error
	behind *behind // the light path's read (light.go), instead of st
}

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, id string) (store.Ticket, error) {
	if s.closed.Load() {
		return store.Ticket{}, s.errClosed()
	}
	if store.CheckID(id) != nil {
		return store.Ticket{}, fmt.Errorf("%w: ticket %q", store.ErrNotFound, id)
	}
	names, idr, err := s.lookup(ctx, id)
	if err != nil {
		return store.Ticket{}, err
	}
	if len(names) == 0 {
		return store.Ticket{}, notFound(id, idr)
	}
	s.mu.Lock()
	k, ok := s.known[id]
	if ok && k.promoted {
		once := k
		once.promoted = false // once: a later Get reads
		s.known[id] = once
	}
	s.mu.Unlock()
	if ok && k.promoted {
		t := s.view(&entry{r: k.r, fence: k.fence}, 0, 0)
		t.Remaining = s.remaining(ctx, k.lease) // live: its key was just written
		return t, nil
	}
	if ok {
		if t, ok, err := s.getLight(ctx, k, id); ok || err != nil {
			return t, err
		}
	}
	// The view is under the first limit: reading it is enough.
	st, err := s.readNames(ctx, names[:1], id, false)
	if err != nil {
		return store.Ticket{}, err
	}
	if st.idKV == nil {
		s.forget(id)
		return store.Ticket{}, notFound(id, nil)
	}
	ir, err := decodeID(id, st.idKV.Value)
	if err != nil {
		return store.Ticket{}, err
	}
	if ir.Removed != "" {
		s.forget(id)
		return store.Ticket{}, notFound(id, &ir)
	}
	t, ok := s.viewOf(ctx, st, id)
	if !ok {
		return store.Ticket{}, notFound(id, nil)
	}
	if e, _ := st.find(id); e != nil && e.tkv != nil {
		s.remember(e, e.tkv.ModRevision)
	}
	return t, nil
}

// aheadCounts reads, beside a ticket's own key under its first limit, what
// gives its place there without reading the limit's records: the keys of
// the tickets ahead of it and the holders of the limit's slot keys (a
// ticket of weight w holds w of them). Holders come before waiters in every
// queue (strict FIFO, docs/leases.md §2.1 item 9), so its place is the
// tickets ahead that hold nothing there.
func (s *Store) aheadOps(k known, id string, more ...clientv3.Op) []clientv3.Op {
	return append([]clientv3.Op{
		clientv3.OpGet(s.k.ticket(k.limit, id)),
		clientv3.OpGet(s.k.tickets(k.limit), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(k.fence-1)),
		clientv3.OpGet(s.k.slots(k.limit), clientv3.WithPrefix()),
		clientv3.OpGet(s.k.tickets(k.limit), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(s.k.records(k.limit), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	}, more...)
}

// waitingAhead counts the live tickets ahead (rs[1]) that hold no slot key (rs[2]).
func waitingAhead(rs []*clientv3.GetResponse) int {
	holders := map[string]bool{}
	for _, kv := range rs[2].Kvs {
		holders[string(kv.Value)] = true
	}
	n := 0
	for _, kv := range rs[1].Kvs {
		if !holders[last(kv.Key)] {
			n++
		}
	}
	return n
}

// getLight reads a ticket this handle knows without reading its limit's
// records: its own key and a few counts give its place (the waiters polling
// or woken in a long queue must stay cheap). ok is false when that is not
// enough to answer exactly (its lease expired; the limit has expired
// tickets, whose states the counts cannot tell; its policy orders waiters
// otherwise than by ticket): read the limit then.
func (s *Store) getLight(ctx context.Context, k known, id string) (store.Ticket, bool, error) {
	cctx, cancel := s.ctx(ctx)
	resp, err := s.c.Txn(cctx).Then(s.aheadOps(k, id, clientv3.OpGet(s.k.limit(k.limit)))...).Commit()
	cancel()
	if err != nil {
		return store.Ticket{}, false, s.unavailable(err, false)
	}
	s.answered()
	rs := getResponses(resp.Responses)
	own := rs[0].Kvs
	if len(own) == 0 || !ownKey(own[0], k.fence, k.lease) || rs[4].Count != rs[3].Count || !queueOrdered(k.limit, rs[5].Kvs) {
		return store.Ticket{}, false, nil
	}
	e := &entry{fence: k.fence, tkv: own[0], rkv: own[0]}
	var err2 error
	if e.r, err2 = decodeRec(own[0].Key, k.limit, id, own[0].Value); err2 != nil {
		return store.Ticket{}, false, err2
	}
	s.remember(e, own[0].ModRevision)
	pos := 0
	if e.r.State != store.Held {
		// Every record is live, and the holders come first.
		pos = waitingAhead(rs) + 1
	}
	return s.view(e, pos, s.remaining(ctx, k.lease)), true, nil
}

// queueOrdered reports whether the limit's key (lim, as read) orders its
// waiters by ticket: then a waiter's place is the count of waiters ahead of
// it in the queue. A rate does not change that order, only when the first
// may go; any other order needs the limit's records (positionsIn).
func queueOrdered(name string, lim []*mvccpb.KeyValue) bool {
	if len(lim) == 0 {
		return true
	}
	l, err := decodeLimit(name, lim[0].Value)
	return err == nil && l.Policy.Ordered() == store.FIFO
}

// Renew implements [store.Store] with one keep-alive of the ticket's lease:
// the server, not this process, moves its deadline. A lease the server no
// longer has (expired, revoked) is lost for good, unless an election since
// its grant let a settle keep the ticket under a hold, which the renewal
// then takes over (takeHold, quarantine.go). The lease keeps the TTL it
// was granted with; ttl is only checked. Renewing a waiting ticket also
// settles its limit, so that a slot freed by an expired lease is handed on
// within a renewal period even if nobody else writes.
func (s *Store) Renew(ctx context.Context, t store.Ticket, ttl time.Duration) (store.Ticket, error) {
	if s.closed.Load() {
		return store.Ticket{}, s.errClosed()
	}
	if err := store.CheckTTL(ttl); err != nil {
		return store.Ticket{}, err
	}
	if store.CheckID(t.ID) != nil {
		return store.Ticket{}, fmt.Errorf("%w: ticket %q", store.ErrLost, t.ID)
	}
	s.mu.Lock()
	k, ok := s.known[t.ID]
	s.mu.Unlock()
	if !ok {
		var err error
		if k, err = s.readKnown(ctx, t.ID); err != nil {
			return store.Ticket{}, err
		}
	}
	if uint64(k.fence) != t.Fence {
		return store.Ticket{}, fmt.Errorf("%w: ticket %s has fence %d, not %d", store.ErrLost, t.ID, k.fence, t.Fence)
	}
	for took := false; ; took = true {
		ka, sent, err := s.keepAliveOnce(ctx, k.lease)
		if err != nil && !isLeaseNotFound(err) {
			return store.Ticket{}, s.unavailable(err, false)
		}
		lost := fmt.Errorf("%w: ticket %s: %s", store.ErrLost, t.ID, expiredEvidence)
		if err == nil {
			s.answered()
			out, err := s.renewed(ctx, k, t.ID, func(term uint64) error {
				// The read after the keep-alive is linearizable: a quorum's
				// current term. A keep-alive answered at an older one came
				// from a leader that was stalled and has not heard of its
				// successor: it renewed its own lessor only (staleTerm; a
				// handle that had not seen the newer term yet could not
				// tell before this read).
				if kt := ka.ResponseHeader.GetRaftTerm(); kt < term {
					s.sawRaftTerm(term)
					return s.unavailable(fmt.Errorf("keep-alive of ticket %s answered at raft term %d, behind the cluster's %d: not a renewal", t.ID, kt, term), false)
				}
				s.leases.acked(k.lease, sent, time.Duration(ka.TTL)*time.Second)
				return nil
			})
			if err == nil && t.State == store.Held && out.State != store.Held {
				return store.Ticket{}, s.heldNoMore(ctx, out)
			}
			if !errors.Is(err, errKeyGone) {
				return out, err
			}
			// Its key went between the keep-alive and the read: removed,
			// or its lease ended just then (a revoke).
			lost = fmt.Errorf("%w: ticket %s was removed", store.ErrLost, t.ID)
		}
		s.leases.forget(k.lease)
		if took {
			return store.Ticket{}, s.lostWhy(ctx, t.ID, lost)
		}
		nk, held, err := s.takeHold(ctx, t.ID, k)
		if err != nil {
			return store.Ticket{}, err
		}
		if !held {
			return store.Ticket{}, s.lostWhy(ctx, t.ID, lost)
		}
		k = nk
	}
}

// heldNoMore answers a renewal of t by a holder that was told t is held,
// while the store has it waiting: nothing but a restored snapshot moves a
// held ticket back into the queue, and the store no longer counts the slot
// its job uses. The renewal is lost and the ticket goes (left waiting, it
// would be admitted with nobody behind it).
func (s *Store) heldNoMore(ctx context.Context, t store.Ticket) error {
	if _, err := s.Release(ctx, t, store.Lost); err != nil {
		return err
	}
	return fmt.Errorf("%w: ticket %s was held by its holder but waits in the store (a restored snapshot?)", store.ErrLost, t.ID)
}

// readKnown reads what Renew needs of ticket id that this handle does not
// know, under its first limit, and remembers it if its lease is live.
func (s *Store) readKnown(ctx context.Context, id string) (known, error) {
	names, idr, err := s.lookup(ctx, id)
	if err != nil {
		return known{}, err
	}
	if len(names) == 0 {
		return known{}, fmt.Errorf("%w: %w", store.ErrLost, notFound(id, idr))
	}
	st, err := s.readNames(ctx, names[:1], id, false)
	if err != nil {
		return known{}, err
	}
	e, _ := st.find(id)
	if e == nil {
		return known{}, fmt.Errorf("%w: ticket %s is gone", store.ErrLost, id)
	}
	// Its lease may be gone: Renew's keep-alive says so, and a hold may
	// keep the ticket (takeHold).
	k := known{limit: e.r.Limit, lease: e.r.Lease, fence: e.fence, r: e.r}
	if e.live() {
		s.remember(e, e.tkv.ModRevision)
	}
	return k, nil
}

// errKeyGone is renewed's answer when the ticket's own key is not there:
// its Renew decides whether a hold keeps it (takeHold).
var errKeyGone = errors.New("the ticket's key is gone")

// takeHold answers a renewal whose lease the server said it no longer
// has: after an election, a settle keeps the ticket under a hold, a lease
// of its own (quarantine.go). It reads the ticket's limits and, if no
// settle kept it yet, settles them (which keeps it, or removes it as
// expired); when its key, created at its fence or under a hold, is then
// live, the renewal renews the lease its record names (held reports it,
// and nk is the ticket as known with it): a hold's, taken over, or its
// own, still there after all (the answer came from a member behind the
// cluster, which a handle that has not seen a newer term cannot tell by
// it). A read or write that fails is the renewal's error: unavailable,
// not lost.
func (s *Store) takeHold(ctx context.Context, id string, k known) (nk known, held bool, err error) {
	names := k.r.names()
	if len(names) == 0 || names[0] == "" {
		names = []string{k.limit}
	}
	st, err := s.read(ctx, names, id, false)
	if err != nil {
		return k, false, err
	}
	// Only an election since its grant makes a hold: otherwise the loss
	// stands, and the renewal writes nothing.
	if e := st.byID[id]; e != nil && e.fence == k.fence && !e.live() && !e.onHold() && e.r.Hold == 0 && s.term.Load() > e.r.Term {
		if _, _, err := s.pol.Settle(ctx, names, ""); err != nil {
			return k, false, err
		}
		if st, err = s.read(ctx, names, id, false); err != nil {
			return k, false, err
		}
	}
	e := st.byID[id]
	if e == nil || e.fence != k.fence || !e.live() {
		return k, false, nil
	}
	s.remember(e, e.tkv.ModRevision)
	return known{limit: e.r.Limit, lease: e.r.Lease, fence: e.fence, rev: e.tkv.ModRevision, r: e.r}, true, nil
}

// renewed reads a ticket just renewed. A holder, or a waiter far back in
// the queue, needs only its own key and a few counts (a waiter's renewal
// every TTL/3 must stay cheap when hundreds wait); a waiter next in line,
// any waiter when the limit has expired tickets to sweep, a waiter of a
// limit with a scheduling policy (its order may put it first, its rate may
// have opened since) and a waiter of several limits (it may be next in
// line in another) read the limits and settle them (probing the holders
// for death, admitting itself if a slot went with an expired lease and
// nobody handed it on).
//
// confirm sees the raft term of the read's answer before anything else is
// taken from it; its error is the renewal's.
func (s *Store) renewed(ctx context.Context, k known, id string, confirm func(term uint64) error) (store.Ticket, error) {
	cctx, cancel := s.ctx(ctx)
	resp, err := s.c.Txn(cctx).Then(s.aheadOps(k, id, clientv3.OpGet(s.k.limit(k.limit)))...).Commit()
	cancel()
	if err != nil {
		return store.Ticket{}, s.unavailable(err, false)
	}
	if err := confirm(resp.Header.GetRaftTerm()); err != nil {
		return store.Ticket{}, err
	}
	rs := getResponses(resp.Responses)
	own := rs[0].Kvs
	if len(own) == 0 || !ownKey(own[0], k.fence, k.lease) {
		// Released or reaped while its lease lived on (the removal is
		// final), or its lease ended since the keep-alive.
		return store.Ticket{}, errKeyGone
	}
	e := &entry{fence: k.fence, tkv: own[0], rkv: own[0]}
	if e.r, err = decodeRec(own[0].Key, k.limit, id, own[0].Value); err != nil {
		return store.Ticket{}, err
	}
	s.remember(e, own[0].ModRevision)
	rem, _ := s.leases.remaining(k.lease)
	if e.r.State == store.Held {
		return s.view(e, 0, max(rem, time.Millisecond)), nil
	}
	ahead := waitingAhead(rs)
	slots, fifo := 0, true
	if kvs := rs[5].Kvs; len(kvs) > 0 {
		l, err := decodeLimit(k.limit, kvs[0].Value)
		if err != nil {
			return store.Ticket{}, err
		}
		slots, fifo = l.Slots, l.Policy.IsFIFO()
	}
	if fifo && len(e.r.names()) == 1 && ahead >= slots && rs[4].Count <= rs[3].Count && !e.r.Superseding {
		return s.view(e, ahead+1, max(rem, time.Millisecond)), nil
	}
	out, ok, err := s.pol.Settle(ctx, e.r.names(), id)
	if err != nil {
		// Not settled: the ticket as it stands (the next renewal settles).
		if out, err = s.pol.Get(ctx, id); err == nil {
			return out, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return store.Ticket{}, err
		}
	}
	if !ok {
		return store.Ticket{}, s.lostWhy(ctx, id, fmt.Errorf("%w: ticket %s was removed", store.ErrLost, id))
	}
	return out, nil
}

// lostWhy is the error of a renewal that found its ticket gone: lost, and
// superseded when a newer run of its key took its place (its tombstone
// says so: one more read, on this path only; docs/leases.md §2.1 item 10).
func (s *Store) lostWhy(ctx context.Context, id string, lost error) error {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Get(cctx, s.k.id(id))
	if err != nil || len(resp.Kvs) == 0 {
		return lost
	}
	if ir, err := decodeID(id, resp.Kvs[0].Value); err == nil && ir.By != nil {
		return fmt.Errorf("%w: %w", store.ErrLost, &store.SupersededError{ID: id, By: *ir.By})
	}
	return lost
}

// refresh keeps a lease alive once, noting when.
func (s *Store) refresh(ctx context.Context, lease int64) {
	if ka, sent, err := s.keepAliveOnce(ctx, lease); err == nil {
		s.leases.acked(lease, sent, time.Duration(ka.TTL)*time.Second)
	}
}

// Release implements [store.Store]: compare-and-delete of the ticket key at
// the revision read (a stale retry never deletes a newer ticket), the
// tombstone, the event and the promotion of the next waiters, in one
// transaction. A ticket whose lease the server expired but that no sweep
// removed yet is removed by its release (the slot went with the lease).
func (s *Store) Release(ctx context.Context, t store.Ticket, why store.Reason) (bool, error) {
	if s.closed.Load() {
		return false, s.errClosed()
	}
	if err := store.CheckID(t.ID); err != nil {
		return false, err
	}
	s.mu.Lock()
	k, ok := s.known[t.ID]
	s.mu.Unlock()
	uncertain := false
	if ok && (t.Fence == 0 || uint64(k.fence) == t.Fence) {
		// A waiter leaves without reading its queue (light.go).
		done, unc, _ := s.releaseWaiting(ctx, k, why)
		if done {
			s.forget(t.ID)
			return true, nil
		}
		uncertain = unc
	}
	removed, err := s.pol.Release(ctx, t, why)
	if err == nil && !removed && uncertain {
		// The light release whose answer was lost landed: its tombstone
		// gives this release's reason.
		removed, err = s.tombstoned(ctx, t.ID, why)
	}
	if err == nil {
		s.forget(t.ID)
	}
	return removed, err
}

// tombstoned reports whether id's tombstone gives why.
func (s *Store) tombstoned(ctx context.Context, id string, why store.Reason) (bool, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Get(cctx, s.k.id(id))
	if err != nil {
		return false, s.unavailable(err, false)
	}
	s.answered()
	if len(resp.Kvs) == 0 {
		return false, nil
	}
	ir, err := decodeID(id, resp.Kvs[0].Value)
	return err == nil && ir.Removed == why, err
}

// Cancel implements [store.Store]: Release with store.Cancelled.
func (s *Store) Cancel(ctx context.Context, t store.Ticket) (bool, error) {
	return s.Release(ctx, t, store.Cancelled)
}

// dayKV reads P/meta/day-lease (nil when the handle knows its day lease).
func (s *Store) dayKV(ctx context.Context) *mvccpb.KeyValue {
	s.mu.Lock()
	day := s.day
	s.mu.Unlock()
	if day != 0 {
		return nil
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Get(cctx, s.k.dayLease(), clientv3.WithSerializable())
	if err != nil || len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0]
}

// SetChild implements [store.Store].
func (s *Store) SetChild(ctx context.Context, t store.Ticket, pgid int, pgidStart uint64) (store.Ticket, error) {
	return s.pol.SetChild(ctx, t, pgid, pgidStart)
}

// Snapshot implements [store.Store]: one consistent read of the limits'
// records and live ticket keys; the lease of each live ticket is asked of
// the server (or known to this process).
func (s *Store) Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error) {
	if s.closed.Load() {
		return store.Snapshot{}, s.errClosed()
	}
	for _, l := range limits {
		if err := store.CheckLimitName(l); err != nil {
			return store.Snapshot{}, err
		}
	}
	names := slices.Clone(limits)
	slices.Sort(names)
	names = slices.Compact(names)
	cctx, cancel := s.ctx(ctx)
	resp, err := s.c.Txn(cctx).Then(s.snapshotOps(names)...).Commit()
	cancel()
	if err != nil {
		return store.Snapshot{}, s.unavailable(err, false)
	}
	s.answered()
	lims, entries, err := s.parseSnapshot(getResponses(resp.Responses))
	if err != nil {
		return store.Snapshot{}, err
	}
	if len(names) == 0 {
		for n := range lims {
			names = append(names, n)
		}
		slices.Sort(names)
		if err := checkRecordedUnderAll(entries); err != nil {
			return store.Snapshot{}, err
		}
	}
	var all []*entry
	for _, n := range names {
		if lims[n] == nil {
			return store.Snapshot{}, fmt.Errorf("%w: %q", store.ErrLimitNotFound, n)
		}
		all = append(all, entries[n]...)
	}
	rem := s.remainingAll(ctx, all)
	out := store.Snapshot{Now: time.Now(), Limits: []store.Limit{}, Tickets: []store.Ticket{}}
	for _, n := range names {
		var ts []store.Ticket
		for _, e := range entries[n] {
			ts = append(ts, s.view(e, 0, rem[e.r.keyLease()]))
		}
		out.AddLimit(lims[n].view(n), ts)
	}
	return out, nil
}

// snapshotOps reads, three responses per group, the limits' keys, their
// records oldest first and their ticket keys: of every limit when names
// is empty or long, else of each of names.
func (s *Store) snapshotOps(names []string) []clientv3.Op {
	byFence := clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)
	if len(names) == 0 || len(names) > 40 {
		return []clientv3.Op{
			clientv3.OpGet(s.k.limits(), clientv3.WithPrefix()),
			clientv3.OpGet(s.k.allRecords(), clientv3.WithPrefix(), byFence),
			clientv3.OpGet(s.k.allTickets(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		}
	}
	var ops []clientv3.Op
	for _, n := range names {
		ops = append(ops, clientv3.OpGet(s.k.limit(n)),
			clientv3.OpGet(s.k.records(n), clientv3.WithPrefix(), byFence),
			clientv3.OpGet(s.k.tickets(n), clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	}
	return ops
}

// parseSnapshot decodes the responses of snapshotOps: the limits by name,
// and the entries recorded under each.
func (s *Store) parseSnapshot(rs []*clientv3.GetResponse) (map[string]*limitRec, map[string][]*entry, error) {
	lims := map[string]*limitRec{}
	entries := map[string][]*entry{}
	live := map[string]bool{} // limit/id of the live ticket keys
	for i := 0; i < len(rs); i += 3 {
		for _, kv := range rs[i].Kvs {
			l, err := decodeLimit(string(kv.Key), kv.Value)
			if err != nil {
				return nil, nil, err
			}
			lims[strings.TrimPrefix(string(kv.Key), s.k.limits())] = &l
		}
		for _, kv := range rs[i+2].Kvs {
			if name, ok := s.limitName(kv.Key, "tickets/"); ok {
				live[name+"/"+last(kv.Key)] = true
			}
		}
		if err := s.parseSnapshotRecords(rs[i+1].Kvs, live, entries); err != nil {
			return nil, nil, err
		}
	}
	return lims, entries, nil
}

// parseSnapshotRecords adds the ticket records kvs to entries, by limit,
// with their ticket key present when live names it.
func (s *Store) parseSnapshotRecords(kvs []*mvccpb.KeyValue, live map[string]bool, entries map[string][]*entry) error {
	for _, kv := range kvs {
		name, ok := s.limitName(kv.Key, "records/")
		if !ok {
			continue
		}
		r, err := decodeRec(kv.Key, name, last(kv.Key), kv.Value)
		if err != nil {
			return err
		}
		e := &entry{r: r, fence: kv.CreateRevision, rkv: kv}
		if live[name+"/"+r.ID] {
			e.tkv = kv // present; its own revisions are not needed here
		}
		entries[name] = append(entries[name], e)
	}
	return nil
}

// checkRecordedUnderAll refuses a read of every limit in which a ticket is
// not recorded under each of its limits (docs/leases.md §2.1 item 9): the
// store is corrupt.
func checkRecordedUnderAll(entries map[string][]*entry) error {
	under := map[string]int{}
	for _, es := range entries {
		for _, e := range es {
			under[e.r.ID]++
		}
	}
	for _, es := range entries {
		for _, e := range es {
			if got := under[e.r.ID]; got != len(e.r.names()) {
				return fmt.Errorf("%w: ticket %s names limits %s but is recorded under %d of them", store.ErrCorrupt, e.r.ID, strings.Join(e.r.names(), ", "), got)
			}
		}
	}
	return nil
}

// SetLimit implements [store.Store]. The limit keeps its policy and the
// starts its rate counts.
func (s *Store) SetLimit(ctx context.Context, name string, slots int) (store.Limit, error) {
	return s.pol.SetLimit(ctx, name, slots)
}

// SetPolicy implements [store.Store]: the limit's record rewritten with
// the policy changed, compared on the revision read, and the closure of
// the limit settled in the same transaction (the new order or rate may
// admit), as SetLimit does. A new rate counts the admissions the old one
// counted in its window, at most its N.
func (s *Store) SetPolicy(ctx context.Context, name string, ch store.PolicyChange) (store.Limit, error) {
	return s.pol.SetPolicy(ctx, name, ch)
}

// RemoveLimit implements [store.Store]. With force, every ticket naming
// the limit goes entirely (from all of its limits, docs/leases.md §2.1
// item 9), and the other limits they named are settled in the same step.
func (s *Store) RemoveLimit(ctx context.Context, name string, force bool) error {
	return s.pol.RemoveLimit(withRevokeWait(ctx), name, force)
}

// Reap implements [store.Store]. Expiry is the server's: the tickets it
// expired are records without a live ticket key, and reap removes those
// records (their slots went with their leases), saying so. Holders proven
// dead on this host are removed with their keys and their leases revoked.
// A reap of a limit sweeps the tickets naming it (each from all of its
// limits) and settles the limits that frees. A dry run lists the same,
// removing nothing.
func (s *Store) Reap(ctx context.Context, o store.ReapOptions) ([]store.Removal, error) {
	removed, err := s.pol.Reap(withRevokeWait(ctx), o)
	if err == nil {
		s.trimEvents(ctx)
	}
	return removed, err
}

// limitNames checks that the named limits exist, or lists them all.
func (s *Store) limitNames(ctx context.Context, limits []string) ([]string, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Get(cctx, s.k.limits(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, s.unavailable(err, false)
	}
	s.answered()
	have := map[string]bool{}
	var all []string
	for _, kv := range resp.Kvs {
		n := strings.TrimPrefix(string(kv.Key), s.k.limits())
		have[n] = true
		all = append(all, n)
	}
	if len(limits) == 0 {
		return all, nil
	}
	names := slices.Clone(limits)
	slices.Sort(names)
	names = slices.Compact(names)
	for _, n := range names {
		if !have[n] {
			return nil, fmt.Errorf("%w: %q", store.ErrLimitNotFound, n)
		}
	}
	return names, nil
}

// trimEvents keeps the newest MaxEvents events (each also goes after a day).
func (s *Store) trimEvents(ctx context.Context) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Get(cctx, s.k.allEvents(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count <= store.MaxEvents+64 {
		return
	}
	old, err := s.c.Get(cctx, s.k.allEvents(), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend), clientv3.WithLimit(resp.Count-store.MaxEvents))
	if err != nil {
		return
	}
	for i := 0; i < len(old.Kvs); i += maxPlanOps {
		var ops []clientv3.Op
		for _, kv := range old.Kvs[i:min(i+maxPlanOps, len(old.Kvs))] {
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
		if _, err := s.c.Txn(cctx).Then(ops...).Commit(); err != nil {
			return
		}
	}
}

// Events implements [store.Store].
func (s *Store) Events(ctx context.Context, limit string, n int) ([]store.Event, error) {
	if s.closed.Load() {
		return nil, s.errClosed()
	}
	prefix := s.k.allEvents()
	if limit != "" {
		if err := store.CheckLimitName(limit); err != nil {
			return nil, err
		}
		prefix = s.k.events(limit)
	}
	out := []store.Event{}
	if n <= 0 {
		return out, nil
	}
	n = min(n, store.MaxEvents)
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	// One transaction writes fewer than maxPlanOps events: a few more than
	// n cannot cut one short.
	resp, err := s.c.Get(cctx, prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend),
		clientv3.WithLimit(int64(n+maxPlanOps)))
	if err != nil {
		return nil, s.unavailable(err, false)
	}
	s.answered()
	for _, kv := range resp.Kvs {
		var e eventRec
		if err := decode("event "+string(kv.Key), kv.Value, &e); err != nil {
			return nil, err
		}
		if err := store.CheckEventText(e.Event); err != nil {
			return nil, fmt.Errorf("%w: event %s: %v", store.ErrCorrupt, kv.Key, strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
		}
		e.Seq = uint64(kv.ModRevision)<<8 | uint64(e.I)
		if e.NewFence {
			e.Fence = uint64(kv.ModRevision)
		}
		out = append(out, e.Event)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out, nil
}

// Changes returns a channel that receives (coalesced) after every change
// under the store's prefix, until ctx ends: what slotctl ls --watch redraws on.
func (s *Store) Changes(ctx context.Context) (<-chan struct{}, error) {
	if s.closed.Load() {
		return nil, s.errClosed()
	}
	c := make(chan struct{}, 1)
	wc := s.c.Watch(clientv3.WithRequireLeader(ctx), string(s.k), clientv3.WithPrefix())
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-wc:
				if !ok {
					return
				}
			}
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}()
	return c, nil
}
