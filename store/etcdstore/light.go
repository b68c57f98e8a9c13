package etcdstore

// Steps of a waiter whose cost does not grow with the queue.
//
// A settle reads the whole limit (every record, every live key): it must,
// to decide on the queue as it stands. But most of what a waiter does in a
// long queue decides nothing: it waits behind the ticket ahead of it, and
// when it leaves, it frees no slot. Reading 2,000 records for each of those
// steps made every waiter's memory and every mass cancel grow with the
// queue (1,594 waiters cancelled at once each read the whole queue: 1.6
// GB through one etcd, and all of them ran out of time). So:
//
//   - a waiter's bell, behind another waiter, reads its own key and the
//     live ticket just ahead of it (one key: the server sorts, the client
//     gets one), and watches those two (aheadOf);
//   - the cancel of a waiter this handle knows, behind another live waiter,
//     is one compare-and-delete of its own keys at the revision it knows
//     (and of the waiter ahead unchanged), with its tombstone and event, no
//     settle (releaseWaiting). That is correct: its removal frees no slot
//     and unblocks nobody, since whoever is behind it is behind the waiter
//     ahead too (strict FIFO). When only the key ahead changed (it left
//     too: a crowd cancelled at once), it reads the new one and tries
//     again. A waiter at the head of the queue (behind holders) may block
//     a lighter ticket behind it, or one of several limits: those take the
//     full path, which settles.
//
// (The renewal of a waiter far back still lists the keys of the tickets
// ahead of it, for its place in the queue: etcd counts a range before it
// filters it by revision, so a count cannot say how many are ahead.)
//
// Whenever the shortcut's premise fails (the key changed since, the ticket
// ahead holds, several limits, a limit with a scheduling policy, whose
// order may admit a waiter past the one ahead of it, or whose rate may
// open with no key changing), the step falls back to the full read.

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
)

// releaseWaiting removes a waiting ticket this handle knows, as of the
// revision it knows, without reading its limits. done is false when that
// could not decide (the ticket changed since, or the store did not answer
// for sure): the caller takes the full path. uncertain: a transaction was
// sent whose answer was lost.
func (s *Store) releaseWaiting(ctx context.Context, k known, why store.Reason) (done, uncertain bool, err error) {
	if k.rev == 0 || k.r.State == store.Held || len(k.r.names()) > 1 {
		return false, false, nil
	}
	// A crowd leaving at once (a mass cancel) keeps changing the key
	// ahead of each of them: a try that lost only that race reads the new
	// one and tries again, rather than every one of them settling the
	// whole limit, each conflicting with all the others.
	for range lightReleaseTries {
		done, again, uncertain := s.releaseWaitingOnce(ctx, k, why)
		if !again {
			return done, uncertain, nil
		}
	}
	return false, false, nil
}

// lightReleaseTries bounds releaseWaiting's tries.
const lightReleaseTries = 8

// releaseWaitingOnce is one try of releaseWaiting. again: its transaction
// failed on the key ahead only (the ticket's own key is as known).
func (s *Store) releaseWaitingOnce(ctx context.Context, k known, why store.Reason) (done, again, uncertain bool) {
	// Behind a live waiter, which stays (compared): whoever is behind this
	// ticket stays behind that one.
	ahead, _, ok := s.aheadOf(ctx, k.r.ID)
	if !ok {
		return false, false, false
	}
	names := k.r.names()
	st := newState(names, 0)
	e := &entry{r: k.r, fence: k.fence, at: k.r.Limit, seen: len(names)}
	e.tkv = &mvccpb.KeyValue{Key: []byte(s.k.ticket(k.r.Limit, k.r.ID)), CreateRevision: k.fence, ModRevision: k.rev}
	e.rkv = &mvccpb.KeyValue{Key: []byte(s.k.record(k.r.Limit, k.r.ID)), CreateRevision: k.fence, ModRevision: k.rev}
	p := s.newPlan(st)
	p.light = true // its event is counted in a delta key (countsrec.go)
	p.cmp(clientv3.Compare(clientv3.ModRevision(string(ahead.key.Key)), "=", ahead.key.ModRevision))
	// Still FIFO: a policy set since may make this waiter's leaving
	// unblock others, which only a settle admits.
	p.cmp(clientv3.Compare(clientv3.ModRevision(s.k.limit(k.r.Limit)), "=", ahead.lim.ModRevision))
	if !p.remove(e, why, "") {
		return false, false, false
	}
	day, err := s.dayLease(ctx, s.dayKV(ctx))
	if err != nil {
		return false, false, false
	}
	cctx, cancel := s.ctx(ctx)
	own := s.k.ticket(k.r.Limit, k.r.ID)
	resp, err := s.c.Txn(cctx).If(p.cmps...).Then(p.ops(day)...).Else(clientv3.OpGet(own)).Commit()
	cancel()
	switch {
	case err != nil && isLeaseNotFound(err):
		s.dropDay(day)
		return false, false, false
	case err != nil:
		return false, false, unknownOutcome(s.unavailable(err, false))
	}
	s.answered()
	if !resp.Succeeded {
		rs := getResponses(resp.Responses)
		mine := len(rs) == 1 && len(rs[0].Kvs) == 1 && rs[0].Kvs[0].ModRevision == k.rev
		return false, mine, false
	}
	s.forget(k.r.ID)
	s.afterCommit(p)
	return true, false, false
}

// aheadKeys is what aheadOf read: the key of the live ticket just ahead,
// and the limit's key, which said the limit is FIFO.
type aheadKeys struct {
	key, lim *mvccpb.KeyValue
}

// aheadOf reads, for a waiting ticket of one limit that this handle
// knows, its own key, the live ticket just ahead of it in the queue and
// the limit's key. ok is false when that does not settle what to watch:
// the ticket is unknown, of several limits, gone or changed, held, or
// first in the queue or behind a holder, or its limit has a scheduling
// policy (which may admit it past the one ahead, or once a rate window
// opens, with no key changing): the full read decides then. Otherwise the
// ticket cannot be admitted before the one ahead (strict FIFO) and the
// bell waits for either key to change, from rev on.
func (s *Store) aheadOf(ctx context.Context, id string) (ahead aheadKeys, rev int64, ok bool) {
	s.mu.Lock()
	k, known := s.known[id]
	s.mu.Unlock()
	if !known || len(k.r.names()) > 1 || k.r.State == store.Held {
		return ahead, 0, false
	}
	own := s.k.ticket(k.limit, id)
	cctx, cancel := s.ctx(ctx)
	resp, err := s.c.Txn(cctx).Then(
		clientv3.OpGet(own),
		clientv3.OpGet(s.k.tickets(k.limit), clientv3.WithPrefix(), clientv3.WithMaxCreateRev(k.fence-1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1)),
		clientv3.OpGet(s.k.limit(k.limit)),
	).Commit()
	cancel()
	if err != nil {
		return ahead, 0, false
	}
	s.answered()
	rs := getResponses(resp.Responses)
	if len(rs[0].Kvs) == 0 || !ownKey(rs[0].Kvs[0], k.fence, k.lease) || len(rs[1].Kvs) == 0 || len(rs[2].Kvs) == 0 {
		return ahead, 0, false
	}
	if l, err := decodeLimit(k.limit, rs[2].Kvs[0].Value); err != nil || !l.Policy.IsFIFO() {
		return ahead, 0, false
	}
	r, err := decodeRec(rs[0].Kvs[0].Key, k.limit, id, rs[0].Kvs[0].Value)
	if err != nil || r.State == store.Held {
		return ahead, 0, false
	}
	kv := rs[1].Kvs[0]
	a, err := decodeRec(kv.Key, k.limit, last(kv.Key), kv.Value)
	if err != nil || a.State == store.Held {
		return ahead, 0, false
	}
	return aheadKeys{key: kv, lim: rs[2].Kvs[0]}, resp.Header.Revision, true
}

// behind is what readFirst learned of a limit: enough to put a ticket at
// the end of its queue, behind a live waiter, without reading the queue.
type behind struct {
	limKV   *mvccpb.KeyValue
	slots   int
	count   int // live tickets
	holders int // distinct holders of slot keys
}

// plainEnqueue reports whether req may take the light path: one limit,
// and nothing that decides on the whole queue (Supersede, Replace and
// MaxWaiting do).
func plainEnqueue(req store.EnqueueRequest) bool {
	return len(req.Names()) == 1 && !req.Supersede && !req.Replace && req.MaxWaiting == nil
}

// shortQueue is how many tickets Enqueue's first read reads of a limit
// (at least twice its size): a queue that fits is read whole in that one
// round trip, as before; a longer one is read no further when the new
// ticket goes behind a live waiter (enqueueBehind).
const shortQueue = 64

// readFirst is Enqueue's first read (serializable, beside the lease grant:
// the transaction's compares make up for a stale read). For a plain
// request it reads, in one round trip, the limit, its first tickets, its
// slot keys, its last ticket and the counts: when the queue fits, that is
// the whole state (st); when it is longer and the last ticket is a live
// waiter, the new ticket cannot be admitted in this step (strict FIFO) and
// a settle would do nothing, if also no lease has expired (records without
// tickets, which a settle would sweep) and the judge proves none of the
// head (the first 2*slots tickets: the holders and the waiters in line,
// all that a settle judges) dead: then b says where the queue ends.
// Otherwise it reads the whole state.
func (s *Store) readFirst(ctx context.Context, req store.EnqueueRequest) (st *lstate, b *behind, err error) {
	names := req.Names()
	if !plainEnqueue(req) || req.Slots < 1 || req.Slots > store.MaxSlots {
		st, err := s.read(ctx, names, req.ID, true)
		return st, nil, err
	}
	name := names[0]
	n := int64(max(shortQueue, 2*req.Slots))
	ser := clientv3.WithSerializable()
	byFence := func(o clientv3.SortOrder) clientv3.OpOption {
		return clientv3.WithSort(clientv3.SortByCreateRevision, o)
	}
	cctx, cancel := s.ctx(ctx)
	// limitOps' reads (records and ticket keys cut at n), the day lease
	// and the id (readOps), then the last ticket.
	resp, err := s.c.Txn(cctx).Then(
		clientv3.OpGet(s.k.limit(name), ser),
		clientv3.OpGet(s.k.records(name), ser, clientv3.WithPrefix(), byFence(clientv3.SortAscend), clientv3.WithLimit(n)),
		clientv3.OpGet(s.k.tickets(name), ser, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(n)),
		clientv3.OpGet(s.k.slots(name), ser, clientv3.WithPrefix()),
		clientv3.OpGet(s.k.counts(name), ser),
		clientv3.OpGet(s.k.countDeltas(name), ser, clientv3.WithPrefix(), clientv3.WithLimit(maxFold)),
		clientv3.OpGet(s.k.dayLease(), ser),
		clientv3.OpGet(s.k.id(req.ID), ser),
		clientv3.OpGet(s.k.tickets(name), ser, clientv3.WithPrefix(), byFence(clientv3.SortDescend), clientv3.WithLimit(1)),
	).Commit()
	cancel()
	if err != nil {
		return nil, nil, s.unavailable(err, false)
	}
	s.answered()
	rs := getResponses(resp.Responses)
	if rs[1].Count <= n && rs[2].Count <= n {
		st, err := s.parseState(names, resp.Header.Revision, rs[:opsPerLimit+2], true)
		if err != nil {
			return nil, nil, err
		}
		st, err = s.closeOver(ctx, st, req.ID)
		return st, nil, err
	}
	if bh, ok := s.behindOf(req, rs); ok {
		return nil, &bh, nil
	}
	st, err = s.read(ctx, names, req.ID, true)
	return st, nil, err
}

// behindOf decides readFirst's light path on its answers (see there).
func (s *Store) behindOf(req store.EnqueueRequest, rs []*clientv3.GetResponse) (behind, bool) {
	name := req.Names()[0]
	// readFirst's answers: limitOps' (opsPerLimit), the day lease, the id, the last ticket.
	idAt, lastAt := opsPerLimit+1, opsPerLimit+2
	if len(rs[0].Kvs) == 0 || len(rs[idAt].Kvs) != 0 || len(rs[lastAt].Kvs) == 0 || rs[1].Count != rs[2].Count {
		return behind{}, false
	}
	l, err := decodeLimit(name, rs[0].Kvs[0].Value)
	if err != nil || l.Slots != req.Slots || !l.Policy.IsFIFO() || store.CheckWeightFits(name, l.Slots, req.Weighs()) != nil {
		return behind{}, false // a policy may admit past the waiter ahead, or once its rate opens: the full path settles
	}
	kv := rs[lastAt].Kvs[0]
	if r, err := decodeRec(kv.Key, name, last(kv.Key), kv.Value); err != nil || r.State == store.Held || len(r.names()) > 1 {
		return behind{}, false
	}
	holders := 0
	head := rs[1].Kvs[:min(len(rs[1].Kvs), 2*l.Slots)]
	for _, kv := range head {
		r, err := decodeRec(kv.Key, name, last(kv.Key), kv.Value)
		if err != nil || len(r.names()) > 1 {
			return behind{}, false
		}
		if r.State == store.Held {
			holders++
		}
		if s.dead != nil {
			if _, dead := s.dead(s.view(&entry{r: r, fence: kv.CreateRevision, tkv: kv}, 0, time.Millisecond), false); dead {
				return behind{}, false // the full path sweeps it
			}
		}
	}
	return behind{limKV: rs[0].Kvs[0], slots: l.Slots, count: int(rs[2].Count), holders: holders}, true
}

// enqueueBehind writes a new waiting ticket at the end of its queue, as
// readFirst found it: its keys and its id's, if the id is still new and
// the limit's size unchanged. ok is false when that did not commit for
// sure (the caller takes the full path, which finds a ticket that landed
// by its id).
func (s *Store) enqueueBehind(ctx context.Context, req store.EnqueueRequest, lease int64, term uint64, b behind) (store.Ticket, bool) {
	name := req.Names()[0]
	p := s.newPlan(newState([]string{name}, 0))
	p.cmp(clientv3.Compare(clientv3.CreateRevision(s.k.id(req.ID)), "=", 0))
	p.cmp(clientv3.Compare(clientv3.ModRevision(s.k.limit(name)), "=", b.limKV.ModRevision))
	r := rec{V: formatVersion, ID: req.ID, Limit: name, Lease: lease, State: store.Waiting,
		Slot: -1, TTL: req.TTL, Holder: req.Holder, Created: p.now, Key: req.Key, Term: term,
		Priority: req.Priority, Share: req.Share}
	if req.Weighs() > 1 {
		r.Weight = req.Weighs()
	}
	e := &entry{isNew: true, r: r}
	p.putNew(e)
	cctx, cancel := s.ctx(ctx)
	resp, err := s.c.Txn(cctx).If(p.cmps...).Then(p.ops(0)...).Commit()
	cancel()
	if err != nil || !resp.Succeeded {
		return store.Ticket{}, false
	}
	s.answered()
	e.fence = resp.Header.Revision
	s.remember(e, resp.Header.Revision)
	s.ring(req.ID, []string{name}, false, resp.Header.Revision)
	return s.view(e, max(b.count-b.holders, 0)+1, s.remaining(ctx, lease)), true
}
