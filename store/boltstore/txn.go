package boltstore

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// Retention of the bounded logs.
const (
	maxTombstones = 100000
	tombstoneAge  = 24 * time.Hour
	pruneBatch    = 64 // at most this many old entries pruned per transaction
)

// txn is one transaction's view: the clock reading taken under the lock,
// and what to do after the commit.
type txn struct {
	s      *Store
	tx     *bolt.Tx // nil when the store file does not exist yet (reads only)
	now    Instant
	rings  []bellRef // tickets promoted: wake their waiters after the commit
	unbell []bellRef // tickets removed: delete their bells after the commit
	// counted is the counts this transaction wrote, by limit (countsrec.go).
	counted map[string]*store.Counts
	// known is the boot ids recorded as this machine's (boots.go), read
	// once; unlisted: none recorded yet.
	known    map[string]bool
	unlisted bool
}

// formatMeta is the meta bucket's format this slotctl writes; it reads the
// previous release's too (docs/leases.md §2.1 item 9).
var formatMeta, legacyMeta = []byte(strconv.Itoa(formatVersion)), []byte(strconv.Itoa(legacyVersion))

// init creates the buckets of a new file and checks the format of an old
// one. A store of the previous format becomes this format at its first write:
// records of the older version are still read, and written back in this one.
func (x *txn) init() error {
	for _, name := range allBucketKey {
		if _, err := x.tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	meta := x.tx.Bucket(bucketMeta)
	v := meta.Get(keyFormat)
	if v != nil {
		if err := x.checkFormat(); err != nil {
			return err
		}
	}
	if !bytes.Equal(v, formatMeta) {
		if err := meta.Put(keyFormat, formatMeta); err != nil {
			return err
		}
	}
	return x.noteBoot()
}

func (x *txn) checkFormat() error {
	if x.tx == nil {
		return nil
	}
	meta := x.tx.Bucket(bucketMeta)
	if meta == nil {
		for _, name := range allBucketKey {
			if x.tx.Bucket(name) != nil {
				return fmt.Errorf("%w: no meta bucket", store.ErrCorrupt)
			}
		}
		return nil // created by a reader-less open; empty
	}
	if v := meta.Get(keyFormat); !bytes.Equal(v, formatMeta) && !bytes.Equal(v, legacyMeta) {
		return fmt.Errorf("%w: store format %q: this slotctl reads formats %d and %d", store.ErrCorrupt, v, legacyVersion, formatVersion)
	}
	return nil
}

func (x *txn) bucket(name []byte) *bolt.Bucket {
	if x.tx == nil {
		return nil
	}
	return x.tx.Bucket(name)
}

// next increments a counter in the meta bucket and returns its new value.
func (x *txn) next(key []byte) (uint64, error) {
	meta := x.bucket(bucketMeta)
	var n uint64
	if v := meta.Get(key); v != nil {
		var err error
		if n, err = keyU64(v); err != nil {
			return 0, err
		}
	}
	n++
	return n, meta.Put(key, u64key(n))
}

// --- limits ---

func (x *txn) limit(name string) (limitRec, bool, error) {
	b := x.bucket(bucketLimits)
	if b == nil {
		return limitRec{}, false, nil
	}
	v := b.Get([]byte(name))
	if v == nil {
		return limitRec{}, false, nil
	}
	var r limitRec
	if err := decode(v, &r); err != nil {
		return r, false, fmt.Errorf("limit %q: %w", name, err)
	}
	return r, true, nil
}

func (x *txn) putLimit(name string, r limitRec) error {
	r.V = formatVersion
	return x.bucket(bucketLimits).Put([]byte(name), encode(&r))
}

// --- tickets ---

// queue returns the limit's queue bucket, creating it when create is set.
func (x *txn) queue(limit string, create bool) (*bolt.Bucket, error) {
	q := x.bucket(bucketQueue)
	if q == nil {
		return nil, nil
	}
	if b := q.Bucket([]byte(limit)); b != nil || !create {
		return b, nil
	}
	return q.CreateBucket([]byte(limit))
}

// readQueue decodes a limit's queue in fence order. Each record must sit
// under its own fence and name the limit whose queue holds it.
func (x *txn) readQueue(limit string, fn func(r ticketRec, raw []byte) error) error {
	b, err := x.queue(limit, false)
	if err != nil || b == nil {
		return err
	}
	return b.ForEach(func(k, v []byte) error {
		fence, err := keyU64(k)
		if err != nil {
			return fmt.Errorf("ticket of limit %q: %w", limit, err)
		}
		var r ticketRec
		if err := decode(v, &r); err != nil {
			return fmt.Errorf("ticket %x of limit %q: %w", k, limit, err)
		}
		if r.Fence != fence || !r.has(limit) {
			return fmt.Errorf("%w: ticket %s of limits %q, fence %d, stored as ticket %d of limit %q", store.ErrCorrupt, r.ID, r.names(), r.Fence, fence, limit)
		}
		return fn(r, v)
	})
}

// tickets reads a limit's queue in order (fence order is FIFO order).
func (x *txn) tickets(limit string) ([]ticketRec, error) {
	var out []ticketRec
	err := x.readQueue(limit, func(r ticketRec, _ []byte) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// copies remembers the first copy read of each ticket of several limits,
// by fence: every other copy must be the same bytes.
type copies map[uint64]*copyOf

type copyOf struct {
	raw   []byte
	limit string // the limit it was first read in
	n     int    // copies read
	index int    // its place in the caller's list
}

// seen reports whether r was read before (in another limit), and checks
// that this copy is the same.
func (c copies) seen(r *ticketRec, raw []byte, limit string, index int) (*copyOf, error) {
	first, ok := c[r.Fence]
	if !ok {
		c[r.Fence] = &copyOf{raw: raw, limit: limit, n: 1, index: index}
		return nil, nil
	}
	if !bytes.Equal(first.raw, raw) {
		return nil, fmt.Errorf("%w: ticket %s (fence %d) differs between limits %q and %q", store.ErrCorrupt, r.ID, r.Fence, first.limit, limit)
	}
	first.n++
	return first, nil
}

// gather reads the tickets of limits and, transitively, of every limit they
// name: the closure a settle works on (docs/leases.md §2.1 item 9), since
// admitting a ticket of several limits can unblock tickets behind it in its
// others. It returns each ticket once, in fence order (the one queue order
// of every limit), and every limit it read. Each ticket must be in the queue
// of every limit it names, the same bytes in each.
func (x *txn) gather(limits []string) ([]ticketRec, []string, error) {
	todo := slices.Clone(limits)
	var recs []ticketRec
	var multi copies // tickets of several limits, made when one is read
	for i := 0; i < len(todo); i++ {
		name := todo[i]
		err := x.readQueue(name, func(r ticketRec, raw []byte) error {
			if len(r.Limits) < 2 {
				recs = append(recs, r)
				return nil
			}
			if multi == nil {
				multi = copies{}
			}
			if first, err := multi.seen(&r, raw, name, len(recs)); err != nil || first != nil {
				return err
			}
			recs = append(recs, r)
			for _, l := range r.Limits {
				if !slices.Contains(todo, l) {
					todo = append(todo, l)
				}
			}
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
	}
	for _, c := range multi {
		if r := recs[c.index]; c.n != len(r.Limits) {
			return nil, nil, fmt.Errorf("%w: ticket %s of limits %q is in %d of their queues", store.ErrCorrupt, r.ID, r.Limits, c.n)
		}
	}
	if len(todo) > 1 {
		slices.SortFunc(recs, func(a, b ticketRec) int { return cmp.Compare(a.Fence, b.Fence) })
	}
	return recs, todo, nil
}

// putTicket writes the ticket into the queue of each of its limits: the
// same bytes in every one.
func (x *txn) putTicket(r ticketRec) error {
	r.V = formatVersion
	if len(r.Limits) <= 1 && r.weight() == 1 {
		// One limit, weight 1: stored as before, its slot its index, so
		// that the one-limit path decodes no more than it did.
		r.Limits, r.Weight, r.Indexes = nil, 0, nil
	} else if r.State != store.Held {
		r.Indexes = nil
	}
	v := encode(&r)
	for _, name := range r.names() {
		b, err := x.queue(name, true)
		if err != nil {
			return err
		}
		if err := b.Put(u64key(r.Fence), v); err != nil {
			return err
		}
	}
	return nil
}

// lookup finds a live ticket by id: its copy in its first limit.
func (x *txn) lookup(id string) (ticketRec, bool, error) {
	ids := x.bucket(bucketIDs)
	if ids == nil {
		return ticketRec{}, false, nil
	}
	v := ids.Get([]byte(id))
	if v == nil {
		return ticketRec{}, false, nil
	}
	var ir idRec
	if err := decode(v, &ir); err != nil {
		return ticketRec{}, false, fmt.Errorf("ticket id %s: %w", id, err)
	}
	b, err := x.queue(ir.Limit, false)
	if err != nil {
		return ticketRec{}, false, err
	}
	var tv []byte
	if b != nil {
		tv = b.Get(u64key(ir.Fence))
	}
	if tv == nil {
		return ticketRec{}, false, fmt.Errorf("%w: ticket id %s points to missing ticket %d of limit %q", store.ErrCorrupt, id, ir.Fence, ir.Limit)
	}
	var r ticketRec
	if err := decode(tv, &r); err != nil {
		return r, false, fmt.Errorf("ticket %s: %w", id, err)
	}
	if r.ID != id || r.Fence != ir.Fence || r.Limit != ir.Limit {
		return r, false, fmt.Errorf("%w: ticket id %s points to ticket %s (fence %d, first limit %q) as ticket %d of limit %q",
			store.ErrCorrupt, id, r.ID, r.Fence, r.Limit, ir.Fence, ir.Limit)
	}
	return r, true, nil
}

// tombstone returns why a removed id was removed, if it was.
func (x *txn) tombstone(id string) (tombRec, bool, error) {
	b := x.bucket(bucketTombs)
	if b == nil {
		return tombRec{}, false, nil
	}
	v := b.Get([]byte(id))
	if v == nil {
		return tombRec{}, false, nil
	}
	var t tombRec
	if err := decode(v, &t); err != nil {
		return t, false, fmt.Errorf("tombstone %s: %w", id, err)
	}
	return t, true, nil
}

// expiry is the store's clock's verdict on a ticket: why its lease is
// over, or "" while it runs.
func (x *txn) expiry(r ticketRec) string {
	if r.Quiet && r.State == store.Waiting && r.DeadlineBoot == x.now.Boot {
		return "" // docs/leases.md rule 17: proven dead or lined, never late
	}
	if r.DeadlineBoot != x.now.Boot {
		if x.previousBoot(r.DeadlineBoot) {
			return "previous boot"
		}
		return "" // another machine's boot, or one forgotten: see boots.go
	}
	if late := x.now.Mono - r.DeadlineMono; late >= 0 {
		return "expired " + roundAgo(late) + " ago"
	}
	return ""
}

func roundAgo(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// remove deletes a live ticket from every one of its limits, tombstones its
// id once and logs why in each limit. It is the only way a ticket leaves
// the store, and so the only thing that frees a slot.
func (x *txn) remove(r ticketRec, why store.Reason, evidence string) error {
	return x.removeBy(r, why, evidence, nil)
}

// removeBy is remove naming the newer run that superseded r (by, with
// reason store.Superseded): its tombstone keeps it for Get and Renew of r's
// id, and each limit's event names it (docs/leases.md §2.1 item 10).
func (x *txn) removeBy(r ticketRec, why store.Reason, evidence string, by *store.Successor) error {
	key := u64key(r.Fence)
	var first []byte
	for i, name := range r.names() {
		b, err := x.queue(name, false)
		if err != nil {
			return err
		}
		var v []byte
		if b != nil {
			v = b.Get(key)
		}
		if v == nil {
			return fmt.Errorf("%w: removing ticket %s that is not in limit %q", store.ErrCorrupt, r.ID, name)
		}
		if i == 0 {
			first = bytes.Clone(v) // the page it is on may change with the deletion
		} else if !bytes.Equal(v, first) {
			return fmt.Errorf("%w: ticket %s (fence %d) differs between limits %q and %q", store.ErrCorrupt, r.ID, r.Fence, r.names()[0], name)
		}
		if err := b.Delete(key); err != nil {
			return err
		}
	}
	if err := x.bucket(bucketIDs).Delete([]byte(r.ID)); err != nil {
		return err
	}
	if err := x.addTombstoneBy(r.ID, why, by); err != nil {
		return err
	}
	x.unbell = append(x.unbell, refOf(r)) // rung, then deleted: its waiter learns at once
	e := eventOf{kind: string(why), evidence: evidence, held: r.State == store.Held}
	if by != nil {
		e.by = by.Ticket
	}
	return x.eventBy(e, r)
}

func (x *txn) addTombstone(id string, why store.Reason) error { return x.addTombstoneBy(id, why, nil) }

func (x *txn) addTombstoneBy(id string, why store.Reason, by *store.Successor) error {
	if x.s.mut.Has(mutation.NoTombstone) { // mutation (test-only): forget removed ids (C5, S7)
		return nil
	}
	t := tombRec{V: formatVersion, Reason: why, Wall: x.now.Wall, Boot: x.now.Boot, Mono: x.now.Mono, By: by}
	if err := x.bucket(bucketTombs).Put([]byte(id), encode(&t)); err != nil {
		return err
	}
	n, err := x.next(keyTombSeq)
	if err != nil {
		return err
	}
	if err := x.bucket(bucketTombQ).Put(u64key(n), []byte(id)); err != nil {
		return err
	}
	return x.pruneTombstones(n)
}

// pruneTombstones drops tombstones older than a day, or past the newest
// maxTombstones. A late write is bounded by the lock timeout (Options.Timeout), so a day is ample.
func (x *txn) pruneTombstones(last uint64) error {
	q, tombs := x.bucket(bucketTombQ), x.bucket(bucketTombs)
	c := q.Cursor()
	for i := 0; i < pruneBatch; i++ {
		k, id := c.First()
		if k == nil {
			return nil
		}
		n, err := keyU64(k)
		if err != nil {
			return err
		}
		old := last-n >= maxTombstones
		if !old {
			t, ok, err := x.tombstone(string(id))
			if err != nil {
				return err
			}
			old = !ok || t.Boot != x.now.Boot || x.now.Mono-t.Mono > tombstoneAge
		}
		if !old {
			return nil
		}
		if err := tombs.Delete(id); err != nil {
			return err
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// event logs one event in each of the ticket's limits (docs/leases.md §2.1
// item 9), each with the ticket's lowest slot index there.
func (x *txn) event(kind string, r ticketRec, evidence string) error {
	return x.eventBy(eventOf{kind: kind, evidence: evidence}, r)
}

// eventOf is what an event says beside its ticket.
type eventOf struct {
	kind, evidence string
	by             string // the newer run of a "superseded" or "replaced" event
	held           bool   // the event removes r, which was held: it says for how long
}

func (x *txn) eventBy(o eventOf, r ticketRec) error {
	for _, name := range r.names() {
		e := store.Event{Time: x.now.Wall, Kind: o.kind, Limit: name, Ticket: r.ID,
			Fence: r.Fence, Slot: -1, Host: r.Holder.Host, Pid: r.Holder.Pid, User: r.Holder.User,
			Command: r.Holder.Command(), Evidence: o.evidence, By: o.by}
		ix := r.in(name)
		if len(ix) > 0 {
			e.Slot = ix[0]
		}
		if len(r.Limits) > 1 {
			e.Limits = r.Limits
		}
		if w := r.weight(); w > 1 {
			e.Weight, e.Indexes = w, ix
		}
		if o.kind == "admitted" {
			e.Waited = store.WaitedFor(r.Created, x.now.Wall)
		}
		if o.held {
			e.Held = store.HeldFor(r.Admitted, x.now.Wall)
		}
		if err := x.event1(e); err != nil {
			return err
		}
		if err := x.count(e); err != nil { // in the event's own step (docs/leases.md §2.8)
			return err
		}
	}
	return nil
}

func (x *txn) event1(ev store.Event) error {
	n, err := x.next(keyEventSeq)
	if err != nil {
		return err
	}
	ev.Seq = n
	e := eventRec{V: formatVersion, Event: ev}
	b := x.bucket(bucketEvents)
	if err := b.Put(u64key(n), encode(&e)); err != nil {
		return err
	}
	c := b.Cursor()
	for i := 0; i < pruneBatch; i++ {
		k, _ := c.First()
		if k == nil {
			break
		}
		first, err := keyU64(k)
		if err != nil {
			return err
		}
		if n-first < store.MaxEvents {
			break
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// settle sweeps the limits a write touched and promotes their waiters: the
// step every write that can free or add capacity ends with. It works on
// the closure of those limits (gather): one store.PlanSettle over all their
// tickets, each once, in fence order, on the records read in this
// transaction (a list made earlier is never trusted); an expired ticket is
// shown to the judge too, so that a job its dead supervisor left running is
// stopped before its slot is handed on. all: judge every ticket (reap). It
// returns the tickets that remain, in order, and the removals.
func (x *txn) settle(limits []string, all bool) ([]ticketRec, []store.Removal, error) {
	recs, names, err := x.gather(limits)
	if err != nil {
		return nil, nil, err
	}
	return x.settleOn(recs, names, all, "")
}

// settleOn is settle on the closure recs of limits names that gather read
// in this transaction (and the caller changed since, as an enqueue's
// supersede does).
func (x *txn) settleOn(recs []ticketRec, names []string, all bool, fresh string) ([]ticketRec, []store.Removal, error) {
	in, err := x.planInput(recs, names)
	if err != nil {
		return nil, nil, err
	}
	in.All = all
	for i := range in.Tickets {
		// The ticket this very step writes is neither judged nor removed:
		// its enqueuer is alive by definition, as a renewer is (a late
		// duplicate of a request whose sender has died is not proof).
		in.Tickets[i].Fresh = fresh != "" && in.Tickets[i].Ticket.ID == fresh
	}
	if x.s.mut.Has(mutation.StaleVerdict) { // mutation (test-only): judge on the deadlines an earlier scan read (A1)
		x.mutStaleVerdict(&in)
	}
	return x.apply(recs, store.PlanSettle(in), fresh)
}

// settleInput reads the closure of limits (gather) and their sizes: the
// planner's input, judged by the store's clock.
func (x *txn) settleInput(limits []string) ([]ticketRec, store.SettleInput, error) {
	recs, names, err := x.gather(limits)
	if err != nil {
		return nil, store.SettleInput{}, err
	}
	in, err := x.planInput(recs, names)
	return recs, in, err
}

// planInput is the planner's input on recs, the closure of names.
func (x *txn) planInput(recs []ticketRec, names []string) (store.SettleInput, error) {
	in := store.SettleInput{Slots: make(map[string]int, len(names)), Tickets: make([]store.Queued, len(recs)),
		Judge: x.s.dead, JudgeExpired: true, Keep: x.s.keepTicket, Mutations: x.s.mut}
	for _, name := range names {
		lim, ok, err := x.limit(name)
		if err != nil {
			return in, err
		}
		if ok { // a ticket of a limit that is gone is never admitted
			in.Slots[name] = lim.Slots
		}
	}
	for i, r := range recs {
		in.Tickets[i] = store.Queued{Ticket: x.view(r, 0), Expired: x.expiry(r), Quiet: r.Quiet && r.State == store.Waiting}
	}
	return in, nil
}

// apply carries out a settle's plan on recs (the planner's input): each
// removal reaps its ticket, each admission takes its slot indexes in each of
// its limits. It returns the tickets that remain, in order, with the
// admitted ones held.
func (x *txn) apply(recs []ticketRec, plan store.SettlePlan, fresh string) ([]ticketRec, []store.Removal, error) {
	var removed []store.Removal
	gone := make([]bool, len(recs))
	for _, rm := range plan.Remove {
		r := recs[rm.Index]
		if err := x.remove(r, store.Reaped, rm.Evidence); err != nil {
			return nil, nil, err
		}
		gone[rm.Index] = true
		removed = append(removed, store.Removal{Ticket: x.view(r, 0), Reason: store.Reaped, Evidence: rm.Evidence})
	}
	for _, a := range plan.Admit {
		r := &recs[a.Index]
		r.State, r.Slot, r.Indexes, r.Admitted = store.Held, a.Slot, a.Indexes, x.now.Wall
		// A whole lease from the admission: its waiter may have renewed
		// nothing (quiet), or late (kept as alive), or be about to renew
		// on a slow machine (docs/leases.md rule 17); it learns what is
		// left when it reads the ticket.
		r.Quiet, r.DeadlineBoot, r.DeadlineMono = false, x.now.Boot, x.now.Mono+r.TTL
		if err := x.putTicket(*r); err != nil {
			return nil, nil, err
		}
		if err := x.event("admitted", *r, ""); err != nil {
			return nil, nil, err
		}
		x.rings = append(x.rings, refOf(*r)) // one bell per ticket, rung once it holds all its limits
	}
	for _, i := range plan.Line {
		// Into line: renewing from now, with a whole lease to start it
		// (docs/leases.md rule 17), and told so by its bell.
		r := &recs[i]
		r.Quiet, r.DeadlineBoot, r.DeadlineMono = false, x.now.Boot, x.now.Mono+r.TTL
		if err := x.putTicket(*r); err != nil {
			return nil, nil, err
		}
		if r.ID != fresh { // its enqueuer reads the answer
			x.rings = append(x.rings, refOf(*r))
		}
	}
	live := recs[:0:0]
	for i, r := range recs {
		if !gone[i] {
			live = append(live, r)
		}
	}
	return live, removed, nil
}

// view turns a record into the caller's Ticket, under its first limit;
// position is 1-based among that limit's waiters.
func (x *txn) view(r ticketRec, position int) store.Ticket {
	t := store.Ticket{ID: r.ID, Limit: r.Limit, State: r.State, Fence: r.Fence, Slot: r.Slot,
		TTL: r.TTL, Holder: r.Holder, Created: r.Created, Admitted: r.Admitted, Renewed: r.Renewed,
		Key: r.Key, Replaces: slices.Clip(r.Replaces)}
	if r.Stop != nil {
		stop := *r.Stop
		t.Stop = &stop
	}
	if len(r.Limits) > 1 {
		t.Limits = r.Limits
	}
	if r.Weight > 1 {
		t.Weight = r.Weight
	}
	if r.State == store.Waiting {
		t.Slot, t.Position, t.Quiet = -1, position, r.Quiet
	} else if t.Multi() {
		t.Indexes = r.Indexes
	}
	if r.DeadlineBoot == x.now.Boot {
		t.Remaining = r.DeadlineMono - x.now.Mono
	}
	return t
}

// position is a waiting ticket's 1-based place among its limit's waiters (0
// for a held one). It counts the waiting tickets queued before it without
// decoding them (see fastState): a waiter's poll must not cost a decode of the
// whole queue, or a long queue polls in quadratic time.
func (x *txn) position(r ticketRec) (int, error) {
	if r.State != store.Waiting {
		return 0, nil
	}
	b, err := x.queue(r.Limit, false)
	if err != nil || b == nil {
		return 0, err
	}
	pos := 1
	c := b.Cursor()
	mine := u64key(r.Fence)
	for k, v := c.First(); k != nil && bytes.Compare(k, mine) < 0; k, v = c.Next() {
		state, ok := fastState(v)
		if !ok {
			var full ticketRec
			if err := decode(v, &full); err != nil {
				return 0, fmt.Errorf("ticket %x of limit %q: %w", k, r.Limit, err)
			}
			state = full.State
		}
		if state == store.Waiting {
			pos++
		}
	}
	return pos, nil
}

// fastState reads a stored ticket's state without decoding it. Records are
// written by encoding/json from ticketRec, whose only fields before "state"
// are the version, the id and the limit name: none can hold a quote, so the
// first "state":" is the field. Anything else falls back to a full decode.
func fastState(v []byte) (store.State, bool) {
	if store.CheckRecordSize(len(v)) != nil {
		return "", false // decode refuses it, unread
	}
	const key = `"state":"`
	i := bytes.Index(v, []byte(key))
	if i < 0 {
		return "", false
	}
	rest := v[i+len(key):]
	switch {
	case bytes.HasPrefix(rest, []byte(`held"`)):
		return store.Held, true
	case bytes.HasPrefix(rest, []byte(`waiting"`)):
		return store.Waiting, true
	}
	return "", false
}

// quiet reports whether a settle of limits would change nothing: no ticket
// of their closure (see gather) has expired, and store.PlanSettle finds
// nobody to admit or prove dead. It reads the queues' fixed fields without
// decoding the records (see fastFields), and decodes only the few tickets
// the planner shows the judge. A waiter's renewal asks it first: hundreds of
// queued waiters renew a full limit all the time, and each full settle would
// decode the whole queue.
func (x *txn) quiet(limits []string) (bool, error) {
	in := store.SettleInput{Slots: make(map[string]int, len(limits)), Mutations: x.s.mut}
	var raw [][]byte         // the records, by the index each Queued carries as its ID
	var seen map[uint64]bool // tickets of several limits already read
	todo := limits
	for i := 0; i < len(todo); i++ {
		name := todo[i]
		lim, ok, err := x.limit(name)
		if err != nil || !ok {
			return false, err
		}
		in.Slots[name] = lim.Slots
		b, err := x.queue(name, false)
		if err != nil {
			return false, err
		}
		if b == nil {
			continue
		}
		err = b.ForEach(func(k, v []byte) error {
			f, ok := fastFields(v)
			if !ok || len(k) != 8 || f.boot != x.now.Boot || (!f.quiet && x.now.Mono >= f.deadline) {
				return errNotQuiet // expired (or to be decoded): the full settle sweeps it
			}
			fence := binary.BigEndian.Uint64(k)
			t := store.Ticket{ID: strconv.Itoa(len(raw)), Limit: name, State: f.state, Fence: fence, Weight: f.weight}
			if f.limits != nil {
				if seen[fence] {
					return nil
				}
				if seen == nil {
					seen, todo = map[uint64]bool{}, slices.Clone(todo)
				}
				seen[fence] = true
				t.Limit, t.Limits = f.limits[0], f.limits
				for _, l := range f.limits {
					if !slices.Contains(todo, l) {
						todo = append(todo, l)
					}
				}
			}
			in.Tickets = append(in.Tickets, store.Queued{Ticket: t, Quiet: f.quiet})
			raw = append(raw, v)
			return nil
		})
		if err == errNotQuiet {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	if len(todo) > 1 {
		slices.SortFunc(in.Tickets, func(a, b store.Queued) int { return cmp.Compare(a.Ticket.Fence, b.Ticket.Fence) })
	}
	if x.s.dead != nil {
		in.Judge = func(t store.Ticket, act bool) (string, bool) {
			i, _ := strconv.Atoi(t.ID)
			var r ticketRec
			if err := decode(raw[i], &r); err != nil {
				return "", true // not quiet: let the full settle report it
			}
			return x.s.dead(x.view(r, 0), act)
		}
	}
	return store.PlanSettle(in).Empty(), nil
}

var errNotQuiet = fmt.Errorf("not quiet")

// fixed is what fastFields reads of a stored ticket.
type fixed struct {
	state    store.State
	boot     string
	deadline time.Duration
	limits   []string // nil for a ticket of one limit
	weight   int
	quiet    bool // a quiet waiter (docs/leases.md rule 17)
}

// fastFields reads a stored ticket's state, deadline, limits and weight
// without decoding it. encoding/json writes ticketRec's fields in order,
// and every field before the holder is ours (version, id, limit names,
// state, numbers, slot indexes, boot id): none can hold a quote, so the
// first occurrence of each key is the field. A record that does not read
// this way gets ok = false and a full decode. A record without limits is of
// version 1: one limit, weight 1.
func fastFields(v []byte) (fixed, bool) {
	f := fixed{weight: 1}
	var ok bool
	if f.state, ok = fastState(v); !ok {
		return f, false
	}
	if i := bytes.Index(v, []byte(`"holder":`)); i >= 0 {
		v = v[:i] // nothing after here is read without decoding
	}
	boot, ok := fastString(v, `"deadline_boot":"`)
	if !ok {
		return f, false
	}
	mono, ok := fastInt(v, `"deadline_mono_ns":`)
	if !ok {
		return f, false
	}
	f.boot, f.deadline = boot, time.Duration(mono)
	f.quiet = f.state == store.Waiting && bytes.Contains(v, []byte(`"quiet":true`))
	if i := bytes.Index(v, []byte(`"limits":[`)); i >= 0 {
		rest := v[i+len(`"limits":[`):]
		j := bytes.IndexByte(rest, ']')
		if j < 0 {
			return f, false
		}
		if list := rest[:j]; bytes.IndexByte(list, ',') >= 0 {
			for _, q := range bytes.Split(list, []byte(",")) {
				name, ok := bytes.CutPrefix(q, []byte(`"`))
				if name, ok = bytes.CutSuffix(name, []byte(`"`)); !ok || !store.ValidLimitName(string(name)) {
					return f, false
				}
				f.limits = append(f.limits, string(name))
			}
		}
		w, ok := fastUint(v, `"weight":`)
		if !ok || w < 1 || w > store.MaxSlots {
			return f, false
		}
		f.weight = w
	}
	return f, true
}

// fastUint reads a small unsigned number without allocating.
func fastUint(v []byte, key string) (int, bool) {
	i := bytes.Index(v, []byte(key))
	if i < 0 {
		return 0, false
	}
	n, digits := 0, 0
	for _, c := range v[i+len(key):] {
		if c < '0' || c > '9' || digits > 6 {
			break
		}
		n, digits = n*10+int(c-'0'), digits+1
	}
	return n, digits > 0 && digits <= 6
}

func fastString(v []byte, key string) (string, bool) {
	i := bytes.Index(v, []byte(key))
	if i < 0 {
		return "", false
	}
	rest := v[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 || bytes.IndexByte(rest[:j], '\\') >= 0 {
		return "", false
	}
	return string(rest[:j]), true
}

func fastInt(v []byte, key string) (int64, bool) {
	i := bytes.Index(v, []byte(key))
	if i < 0 {
		return 0, false
	}
	rest := v[i+len(key):]
	j := 0
	for j < len(rest) && (rest[j] == '-' || rest[j] >= '0' && rest[j] <= '9') {
		j++
	}
	n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return n, err == nil
}

// viewIn returns the ticket with its place among its first limit's waiters in recs.
func (x *txn) viewIn(recs []ticketRec, id string) (store.Ticket, bool) {
	for i, r := range recs {
		if r.ID != id {
			continue
		}
		pos := 0
		if r.State == store.Waiting {
			pos = 1
			for _, o := range recs[:i] {
				if o.State == store.Waiting && o.has(r.Limit) {
					pos++
				}
			}
		}
		return x.view(r, pos), true
	}
	return store.Ticket{}, false
}

// --- Test-only mutations (internal/mutation). Each re-introduces a bug of
// docs/leases.md so that internal/sim can prove it catches it; with a nil
// Options.Mutations none of this runs, and without the build tag
// slotctl_mutations none of it is linked in.

// mutScan is what a store handle's last dry-run reap read: the tickets it
// listed as removable (a reap "job queue") and every deadline it saw.
type mutScan struct {
	listed    map[string]string // ticket id -> limit
	deadlines map[string]ticketRec
}

func (s *Store) mutResetScan() {
	s.mutMu.Lock()
	defer s.mutMu.Unlock()
	s.mutScan = mutScan{listed: map[string]string{}, deadlines: map[string]ticketRec{}}
}

func (s *Store) mutNoteScan(r ticketRec, gone bool) {
	s.mutMu.Lock()
	defer s.mutMu.Unlock()
	s.mutScan.deadlines[r.ID] = r
	if gone {
		s.mutScan.listed[r.ID] = r.Limit
	}
}

// mutStaleVerdict (StaleVerdict) judges expiry on the deadline the last scan
// read, when it read one, instead of on the record of this transaction; a
// ticket the scan read is judged by that deadline alone.
func (x *txn) mutStaleVerdict(in *store.SettleInput) {
	x.s.mutMu.Lock()
	defer x.s.mutMu.Unlock()
	scanned := map[string]bool{}
	for i := range in.Tickets {
		q := &in.Tickets[i]
		old, ok := x.s.mutScan.deadlines[q.Ticket.ID]
		if !ok {
			continue
		}
		scanned[q.Ticket.ID] = true
		q.Expired = ""
		if old.DeadlineBoot != x.now.Boot || x.now.Mono >= old.DeadlineMono {
			q.Expired = "expired (as scanned)"
		}
	}
	if judge := in.Judge; judge != nil {
		in.Judge = func(t store.Ticket, act bool) (string, bool) {
			if scanned[t.ID] {
				return "", false
			}
			return judge(t, act)
		}
	}
}

// mutFreeOne (ReleaseCounter) admits one waiter beyond the held count of the
// limit: what decrementing a counter for a ticket that is not there does.
func (x *txn) mutFreeOne(limit string) error {
	lim, ok, err := x.limit(limit)
	if err != nil || !ok {
		return err
	}
	recs, in, err := x.settleInput([]string{limit})
	if err != nil {
		return err
	}
	held := 0
	for _, r := range recs {
		if r.State == store.Held && r.has(limit) {
			held += r.weight()
		}
	}
	in.Slots[limit], in.Judge = max(held+1, lim.Slots), nil
	for i := range in.Tickets {
		in.Tickets[i].Expired = "" // no sweep: only the promotion
	}
	_, _, err = x.apply(recs, store.PlanSettle(in), "")
	return err
}

// mutReleaseSlot (ReleaseNoCompare) removes whichever ticket holds the slot
// t held: a release keyed by the slot, not by the caller's own ticket.
func (x *txn) mutReleaseSlot(t store.Ticket, why store.Reason) error {
	if t.State != store.Held || store.CheckLimitName(t.Limit) != nil {
		return nil
	}
	recs, err := x.tickets(t.Limit)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.State == store.Held && slices.Contains(r.in(t.Limit), t.Slot) {
			if err := x.remove(r, why, ""); err != nil {
				return err
			}
			_, _, err := x.settle(r.names(), false)
			return err
		}
	}
	return nil
}

// mutBlindReap (BlindReap) frees one more slot for each ticket of limit that
// the last scan listed and that this reap did not delete: another reaper or
// its holder removed it already, and its slot is freed a second time.
func (x *txn) mutBlindReap(limit string, removed []store.Removal) error {
	x.s.mutMu.Lock()
	var listed []string
	for id, l := range x.s.mutScan.listed {
		if l == limit {
			listed = append(listed, id)
			delete(x.s.mutScan.listed, id) // a reap job runs once
		}
	}
	x.s.mutMu.Unlock()
	slices.Sort(listed)
	for _, id := range listed {
		if slices.ContainsFunc(removed, func(r store.Removal) bool { return r.Ticket.ID == id }) {
			continue
		}
		if _, live, err := x.lookup(id); err != nil || live {
			if err != nil {
				return err
			}
			continue
		}
		if err := x.mutFreeOne(limit); err != nil {
			return err
		}
	}
	return nil
}
