package etcdstore

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// bell rings for one ticket. Its goroutine learns the ticket's limit from
// this handle's Enqueue (or, failing that, from P/ids/<id>), then watches
// two things from the revision it last read the limit at, so that no change
// falls between the read and the watch:
//
//   - the ticket's own key: rewritten when it is promoted, deleted when it
//     is removed or its lease expires: ring;
//   - the key it must outlast: the live ticket just ahead of it, or, at the
//     head of the queue, the holders' keys (their deletion). When that changes
//     it reads the limit again; if the ticket may now be admitted and nobody
//     did (a holder's lease expired, which no client writes), it settles the
//     limit itself, which promotes it, which rewrites its key: ring.
//
// So a release wakes the waiter it promoted and the one behind it, never the
// whole queue, and no waiter polls. A ring is a hint: the gate confirms with
// Get, which answers a promotion this bell saw in a watch event without
// another read (the handoff's critical path: one commit, one watch event).
//
// Once the ticket is held the bell goes on watching its own key while it is
// open (the holder keeps it open while its job runs): a newer run's stop
// request (--replace) rewrites the key, a removal deletes it, and either
// rings within one watch event (docs/leases.md §2.1 item 10). The Get the
// ring causes answers from that event.
type bell struct {
	s      *Store
	id     string
	c      chan struct{}
	limit  chan enqueued
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Watch implements [store.Store].
func (s *Store) Watch(ctx context.Context, id string) (store.Bell, error) {
	if s.closed.Load() {
		return nil, s.errClosed()
	}
	if err := store.CheckID(id); err != nil {
		return nil, err
	}
	b := &bell{s: s, id: id, c: make(chan struct{}, 1), limit: make(chan enqueued, 1), done: make(chan struct{})}
	b.ctx, b.cancel = context.WithCancel(clientv3.WithRequireLeader(context.WithoutCancel(ctx)))
	s.mu.Lock()
	if s.closed.Load() { // checked again under mu: Close cancels every bell registered before it
		s.mu.Unlock()
		b.cancel()
		return nil, s.errClosed()
	}
	s.bells[id] = b
	s.mu.Unlock()
	go b.run()
	return b, nil
}

func (b *bell) C() <-chan struct{} { return b.c }

func (b *bell) Close() error {
	b.once.Do(func() {
		b.cancel()
		<-b.done
		b.s.mu.Lock()
		if b.s.bells[b.id] == b {
			delete(b.s.bells, b.id)
		}
		b.s.mu.Unlock()
	})
	return nil
}

func (b *bell) ring() {
	select {
	case b.c <- struct{}{}:
	default:
	}
}

// enqueued is what this handle's Enqueue tells the ticket's bell.
type enqueued struct {
	names []string // its limits, first first
	held  bool
	rev   int64 // the revision it was written held at, when held
}

// ring tells id's bell, if this handle has one, where its ticket is.
func (s *Store) ring(id string, names []string, held bool, rev int64) {
	s.mu.Lock()
	b := s.bells[id]
	s.mu.Unlock()
	if b != nil {
		select {
		case b.limit <- enqueued{names, held, rev}:
		default:
		}
	}
}

// pause waits about d (jittered), or until the bell closes.
func (b *bell) pause(d time.Duration) bool {
	d = time.Duration(float64(d) * (0.75 + rand.Float64()/2))
	select {
	case <-time.After(d):
		return true
	case <-b.ctx.Done():
		return false
	}
}

func (b *bell) run() {
	defer close(b.done)
	var names []string
	select {
	case e := <-b.limit:
		if e.held {
			b.ring() // admitted at once: nothing to wait for but a stop request
			b.hold(e.names[0], e.rev, nil)
			return
		}
		names = e.names
	case <-time.After(200 * time.Millisecond):
		// Not enqueued through this handle (or slowly): find it in the store.
		var ok bool
		if names, ok = b.discover(); !ok {
			return
		}
	case <-b.ctx.Done():
		return
	}
	b.follow(names)
}

// discover waits for P/ids/<id> to exist and returns the ticket's limits.
func (b *bell) discover() ([]string, bool) {
	for {
		resp, err := b.s.c.Get(b.ctx, b.s.k.id(b.id))
		if err != nil {
			if !b.pause(time.Second) {
				return nil, false
			}
			continue
		}
		if len(resp.Kvs) > 0 {
			ir, err := decodeID(b.id, resp.Kvs[0].Value)
			if err != nil || ir.Removed != "" {
				b.ring()
				return nil, false
			}
			return ir.names(), true
		}
		wc := b.s.c.Watch(b.ctx, b.s.k.id(b.id), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wc {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type != mvccpb.PUT {
					continue
				}
				if ir, err := decodeID(b.id, ev.Kv.Value); err == nil {
					if ir.Removed != "" {
						b.ring()
						return nil, false
					}
					return ir.names(), true
				}
			}
		}
		if !b.pause(time.Second) {
			return nil, false
		}
	}
}

// follow watches the ticket until it is held or gone, or the bell closes.
// In each of its limits it outlasts the key ahead of it there (a ticket of
// several limits waits for all of them, docs/leases.md §2.1 item 9).
func (b *bell) follow(names []string) {
	first := names[0]
	var own clientv3.WatchChan // lives as long as the bell: its context is the bell's
	settled := int64(0)        // the revision of the last settle this bell ran
	for {
		if len(names) == 1 {
			// Behind another waiter: watch it and its own key, reading
			// neither the queue nor its records (light.go).
			if ahead, rev, ok := b.s.aheadOf(b.ctx, b.id); ok {
				done, o := b.waitBehindKey(first, ahead, rev, own)
				if done {
					return
				}
				own = o
				continue
			}
		}
		st, err := b.s.read(b.ctx, names, "", false)
		if err != nil {
			if !b.pause(time.Second) {
				return
			}
			continue
		}
		e, _ := st.find(b.id)
		if e == nil || !e.live() || e.r.State == store.Held {
			b.ended(first, st, e, own)
			return
		}
		if b.s.admissible(st, e) {
			// It may be admitted and nobody admitted it: settle. Once per
			// revision, so that a settle with nothing to do does not spin.
			if settled < st.rev {
				settled = st.rev
				if _, _, err := b.s.pol.Settle(b.ctx, names, ""); err == nil {
					continue
				}
			}
			if !b.pause(time.Second) {
				return
			}
			continue
		}
		if own == nil {
			own = b.s.c.Watch(b.ctx, b.s.k.ticket(first, b.id), clientv3.WithRev(st.rev+1))
		}
		done, o := b.waitBehindQueues(first, st, e, own)
		if done {
			return
		}
		own = o
	}
}

// ended rings for a ticket that st shows gone or held (e, nil if gone),
// and follows a held one.
func (b *bell) ended(first string, st *lstate, e *entry, own clientv3.WatchChan) {
	held := e != nil && e.tkv != nil && e.r.State == store.Held
	if held {
		b.s.promoted(b.id, e.tkv) // held: Get answers from this read
	}
	b.ring()
	if held {
		b.hold(first, st.rev, own)
	}
}

// waitBehindKey waits, from revision rev on, for the ticket's own key, the
// key ahead of it in its one limit or that limit's key (a policy set since
// ends the premise of the wait) to change; as after, done or the own watch
// to go on with.
func (b *bell) waitBehindKey(first string, ahead aheadKeys, rev int64, own clientv3.WatchChan) (bool, clientv3.WatchChan) {
	if own == nil {
		own = b.s.c.Watch(b.ctx, b.s.k.ticket(first, b.id), clientv3.WithRev(rev+1))
	}
	tctx, tcancel := context.WithCancel(b.ctx)
	targets := []clientv3.WatchChan{
		b.s.c.Watch(tctx, string(ahead.key.Key), clientv3.WithRev(rev+1)),
		b.s.c.Watch(tctx, string(ahead.lim.Key), clientv3.WithRev(rev+1)),
	}
	watched := map[string]bool{string(ahead.key.Key): false, string(ahead.lim.Key): false}
	again, heldAt := b.wait(own, merge(tctx, targets), map[string]bool{b.s.k.ticket(first, b.id): true}, watched, nil)
	tcancel()
	return b.after(again, first, heldAt, own)
}

// waitBehindQueues waits for the waiting ticket e's own keys or what is
// ahead of it in each of its limits in st to change; as after, done or
// the own watch to go on with.
func (b *bell) waitBehindQueues(first string, st *lstate, e *entry, own clientv3.WatchChan) (bool, clientv3.WatchChan) {
	tctx, tcancel := context.WithCancel(b.ctx)
	targets, watched := b.watchAhead(tctx, st, e)
	ownKeys := map[string]bool{}
	for _, n := range e.r.names() {
		ownKeys[b.s.k.ticket(n, b.id)] = true
	}
	var wake <-chan time.Time
	if d, ok := rateOpens(st, e, time.Now()); ok {
		tm := time.NewTimer(d)
		defer tm.Stop()
		wake = tm.C
	}
	again, heldAt := b.wait(own, merge(tctx, targets), ownKeys, watched, wake)
	tcancel()
	return b.after(again, first, heldAt, own)
}

// rateOpens is how long until the first rate window among e's limits in st
// whose rate is spent opens (ok false when none is spent): no key changes
// then, so the bell reads again by the clock, and settles if e may go.
func rateOpens(st *lstate, e *entry, now time.Time) (time.Duration, bool) {
	var first time.Time
	for _, n := range e.r.names() {
		l := st.lim(n)
		if l == nil || l.Policy.Tokens(l.Starts, now) != 0 {
			continue
		}
		if at := l.Policy.Opens(l.Starts, now, 1); first.IsZero() || at.Before(first) {
			first = at
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return max(first.Sub(now), 0) + rateSlack, true
}

// rateSlack is how long after a rate window opens by this host's clock the
// bell reads again: a little, for the clocks of the hosts that admit.
const rateSlack = 50 * time.Millisecond

// watchAhead watches, in each limit of e, what is ahead of it in st: the
// waiter just ahead, or the holders. watched maps each key to whether only
// its deletion counts.
func (b *bell) watchAhead(ctx context.Context, st *lstate, e *entry) (targets []clientv3.WatchChan, watched map[string]bool) {
	watched = map[string]bool{}
	now := time.Now()
	for _, n := range e.r.names() {
		ahead := liveAhead(b.s.arranged(st, n, now), e)
		if len(ahead) == 0 {
			// A paused limit (or one too small): only a resize admits
			// it, and that rewrites its key. (A spent rate opens by the
			// clock: rateOpens.)
			continue
		}
		if prev := ahead[len(ahead)-1]; prev.r.State != store.Held {
			// Behind another waiter: outlast it (it is promoted: its key is
			// rewritten; it leaves: deleted).
			k := b.s.k.ticket(n, prev.r.ID)
			watched[k] = false
			targets = append(targets, b.s.c.Watch(ctx, k, clientv3.WithRev(st.rev+1)))
			continue
		}
		// At the head of the queue: outlast a holder. The whole prefix,
		// puts too: a release deletes the holder's key and rewrites this
		// ticket's in one revision, so one answer carries both.
		for _, a := range ahead {
			watched[b.s.k.ticket(n, a.r.ID)] = true
		}
		targets = append(targets, b.s.c.Watch(ctx, b.s.k.tickets(n), clientv3.WithPrefix(), clientv3.WithRev(st.rev+1)))
	}
	return targets, watched
}

// liveAhead is the live tickets ahead of e in a limit's queue q, holders
// first, waiters in the order its policy admits them (lstate.arranged).
func liveAhead(q []*entry, e *entry) []*entry {
	var ahead []*entry
	for _, a := range q {
		if a == e {
			break
		}
		if a.live() {
			ahead = append(ahead, a)
		}
	}
	return ahead
}

// after acts on the end of a wait: done when the bell is over (closed, or
// the ticket held and followed by hold); else the own watch to go on with
// (nil: open another).
func (b *bell) after(again waitResult, first string, heldAt int64, own clientv3.WatchChan) (bool, clientv3.WatchChan) {
	switch again {
	case waitDone:
		return true, nil
	case waitHeld:
		b.hold(first, heldAt, own)
		return true, nil
	case waitOwnLost:
		b.ring() // something may have happened while the watch was down
		if !b.pause(time.Second) {
			return true, nil
		}
		return false, nil
	case waitTargetLost:
		if !b.pause(time.Second) {
			return true, nil
		}
	}
	return false, own
}

// merge is one channel of the answers of several watches (nil for none);
// the end of any of them is a cancelled answer.
func merge(ctx context.Context, wcs []clientv3.WatchChan) clientv3.WatchChan {
	switch len(wcs) {
	case 0:
		return nil
	case 1:
		return wcs[0]
	}
	out := make(chan clientv3.WatchResponse)
	for _, wc := range wcs {
		go func() {
			for {
				var wr clientv3.WatchResponse
				select {
				case r, ok := <-wc:
					if wr = r; !ok {
						wr = clientv3.WatchResponse{Canceled: true}
					}
				case <-ctx.Done():
					return
				}
				select {
				case out <- wr:
				case <-ctx.Done():
					return
				}
				if wr.Canceled {
					return
				}
			}
		}()
	}
	return out
}

// admissible reports whether a settle on st (by expiry alone, as no
// judge) would admit e now.
func (s *Store) admissible(st *lstate, e *entry) bool {
	p := s.newPlan(st)
	in := p.input()
	es := p.queued(&in, time.Millisecond, nil)
	for _, a := range policy.PlanSettle(in).Admit {
		if es[a.Index] == e {
			return true
		}
	}
	return false
}

type waitResult int

const (
	waitDone waitResult = iota // the bell closed
	waitHeld                   // the ticket is held

	waitAgain      // read the limit again
	waitOwnLost    // the own watch failed: re-establish it
	waitTargetLost // the target watch failed
)

// wait sleeps until the ticket's own key changes (ring, then read again),
// a watched key ahead changes (read again; with deletesOnly, only when it is
// deleted), wake fires (read again; nil never does), or the bell closes.
// An event on one of its own keys (its ticket key in any of its limits: a
// promotion rewrites them all in one revision, and the prefix watch of
// another limit may bring it first) that shows the ticket promoted, on
// either watch, ends the wait: nothing is left to watch.
func (b *bell) wait(own, target clientv3.WatchChan, ownKeys map[string]bool, watched map[string]bool, wake <-chan time.Time) (waitResult, int64) {
	for {
		select {
		case <-b.ctx.Done():
			return waitDone, 0
		case <-wake:
			return waitAgain, 0
		case wr, ok := <-own:
			if !ok || wr.Err() != nil || wr.Canceled {
				return waitOwnLost, 0
			}
			if len(wr.Events) > 0 {
				at, held := b.promotedIn(wr.Events, ownKeys) // before the ring: the Get it causes answers from it
				b.ring()
				if held {
					return waitHeld, at
				}
				return waitAgain, 0
			}
		case wr, ok := <-target:
			if !ok || wr.Err() != nil || wr.Canceled {
				return waitTargetLost, 0
			}
			if at, held := b.promotedIn(wr.Events, ownKeys); held {
				b.ring()
				return waitHeld, at
			}
			if watchedChanged(wr.Events, watched) {
				return b.aheadChanged(own, ownKeys)
			}
		}
	}
}

// promotedIn reports whether the last of evs on one of the ticket's own
// keys shows it promoted, and at which revision.
func (b *bell) promotedIn(evs []*clientv3.Event, ownKeys map[string]bool) (int64, bool) {
	for i := len(evs) - 1; i >= 0; i-- {
		if ev := evs[i]; ownKeys[string(ev.Kv.Key)] {
			if ev.Type == mvccpb.PUT && b.s.promoted(b.id, ev.Kv) {
				return ev.Kv.ModRevision, true
			}
			return 0, false
		}
	}
	return 0, false
}

// watchedChanged reports whether evs change a watched key ahead (with
// deletesOnly, delete it).
func watchedChanged(evs []*clientv3.Event, watched map[string]bool) bool {
	for _, ev := range evs {
		if deletesOnly, ok := watched[string(ev.Kv.Key)]; ok && (!deletesOnly || ev.Type == mvccpb.DELETE) {
			return true
		}
	}
	return false
}

// aheadChanged ends a wait on a change ahead. A release deletes the key
// ahead and promotes this ticket in one revision: ring first (from the own
// watch's answer, if one is there), read after.
func (b *bell) aheadChanged(own clientv3.WatchChan, ownKeys map[string]bool) (waitResult, int64) {
	select {
	case owr, ok := <-own:
		if ok && len(owr.Events) > 0 {
			at, held := b.promotedIn(owr.Events, ownKeys)
			b.ring()
			if held {
				return waitHeld, at
			}
		}
	default:
	}
	return waitAgain, 0
}

// hold follows the held ticket's own key under its first limit (a
// rewrite or removal changes all of its keys in one revision) from the
// revision after from, until the key is deleted or the bell closes:
// every change after from rings. A stop request is a rewrite; so is the
// holder's own SetChild, a spurious ring its Get answers from the event.
// own, if not nil, is a watch of that key already open. A failed watch
// reads the key, rings if it changed meanwhile, and watches again.
func (b *bell) hold(first string, from int64, own clientv3.WatchChan) {
	key := b.s.k.ticket(first, b.id)
	for {
		if own == nil {
			own = b.s.c.Watch(b.ctx, key, clientv3.WithRev(from+1))
		}
		for wr := range own {
			if wr.Err() != nil || wr.Canceled {
				break
			}
			for _, ev := range wr.Events {
				if string(ev.Kv.Key) != key || ev.Kv.ModRevision <= from {
					continue
				}
				from = ev.Kv.ModRevision
				if ev.Type == mvccpb.DELETE {
					b.s.forget(b.id) // gone: a Get reads its tombstone
					b.ring()
					return
				}
				// Before the ring: the Get it causes answers from it. A
				// rewrite this handle made itself (SetChild) is no news.
				if b.s.promoted(b.id, ev.Kv) || !b.s.wrote(b.id, ev.Kv.ModRevision) {
					b.ring()
				}
			}
		}
		if b.ctx.Err() != nil {
			return
		}
		own = nil
		resp, err := b.s.c.Get(b.ctx, key)
		if err != nil {
			if !b.pause(time.Second) {
				return
			}
			continue
		}
		if len(resp.Kvs) == 0 {
			b.s.forget(b.id)
			b.ring()
			return
		}
		if kv := resp.Kvs[0]; kv.ModRevision > from && (b.s.promoted(b.id, kv) || !b.s.wrote(b.id, kv.ModRevision)) {
			b.ring()
		}
		from = resp.Header.Revision
	}
}
