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

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// Retention of the bounded logs.
const (
	maxTombstones = 100000
	tombstoneAge  = 24 * time.Hour
	pruneBatch    = 64 // at most this many old entries pruned per transaction
)

// txn is one transaction: the step the rules (store/policy) run in, the
// clock reading taken under the lock, and what to do after the commit.
type txn struct {
	s      *Store
	tx     *bolt.Tx // nil when the store file does not exist yet (reads only)
	now    Instant
	rings  []bellRef // tickets promoted: wake their waiters after the commit
	unbell []bellRef // tickets removed: delete their bells after the commit
	// checked is the tickets of several limits whose copies were checked
	// alike in all of their limits, by fence.
	checked map[uint64]bool
	// known is the boot ids recorded as this machine's (boots.go), read
	// once; unlisted: none recorded yet.
	known    map[string]bool
	unlisted bool
}

var (
	_ policy.Tx         = (*txn)(nil)
	_ policy.Positioner = (*txn)(nil)
	_ policy.Settler    = (*txn)(nil)
	_ policy.HeadQueuer = (*txn)(nil)
)

// formatMeta is the meta bucket's format this slotctl writes; it reads the
// previous release's too.
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

// Now implements policy.Tx.
func (x *txn) Now() Instant { return x.now }

// PreviousBoot implements policy.Tx (boots.go).
func (x *txn) PreviousBoot(boot string) bool { return x.previousBoot(boot) }

// --- limits ---

// LimitNames implements policy.Tx.
func (x *txn) LimitNames() ([]string, error) {
	var names []string
	if b := x.bucket(bucketLimits); b != nil {
		err := b.ForEach(func(k, _ []byte) error {
			if !store.ValidLimitName(string(k)) { // a name from the file, checked as a request's
				return fmt.Errorf("%w: limit named %q", store.ErrCorrupt, k)
			}
			names = append(names, string(k))
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return names, nil
}

// Limit implements policy.Tx.
func (x *txn) Limit(name string) (policy.LimitRec, bool, error) {
	b := x.bucket(bucketLimits)
	if b == nil {
		return policy.LimitRec{}, false, nil
	}
	v := b.Get([]byte(name))
	if v == nil {
		return policy.LimitRec{}, false, nil
	}
	var r limitRec
	if err := decode(v, &r); err != nil {
		return r.LimitRec, false, fmt.Errorf("limit %q: %w", name, err)
	}
	return r.LimitRec, true, nil
}

// PutLimit implements policy.Tx.
func (x *txn) PutLimit(name string, l policy.LimitRec) error {
	return x.bucket(bucketLimits).Put([]byte(name), encode(&limitRec{V: formatVersion, LimitRec: l}))
}

// DeleteLimit implements policy.Tx.
func (x *txn) DeleteLimit(name string) error {
	if b, _ := x.queue(name, false); b != nil {
		if err := x.bucket(bucketQueue).DeleteBucket([]byte(name)); err != nil {
			return err
		}
	}
	if err := x.bucket(bucketLimits).Delete([]byte(name)); err != nil {
		return err
	}
	return x.bucket(bucketCounts).Delete([]byte(name))
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

// Queue implements policy.Tx: the limit's queue, decoded in fence order.
// Each record must sit under its own fence and name the limit whose queue
// holds it; a ticket of several limits must be the same bytes in the queue
// of each.
func (x *txn) Queue(limit string) ([]policy.Rec, error) {
	b, err := x.queue(limit, false)
	if err != nil || b == nil {
		return nil, err
	}
	n := 0 // counted first, so that the records are copied once
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	var out []policy.Rec
	if n > 0 {
		out = make([]policy.Rec, 0, n)
	}
	err = b.ForEach(func(k, v []byte) error {
		var r ticketRec
		if err := x.queued(limit, k, v, &r); err != nil {
			return err
		}
		out = append(out, r.Rec)
		return nil
	})
	return out, err
}

// queued decodes the record v stored under key k in limit's queue into r,
// and checks that it sits under its own fence, names the limit, and (a
// ticket of several limits) is the same bytes in the queue of each.
func (x *txn) queued(limit string, k, v []byte, r *ticketRec) error {
	fence, err := keyU64(k)
	if err != nil {
		return fmt.Errorf("ticket of limit %q: %w", limit, err)
	}
	if err := decodeTicket(v, r); err != nil {
		return fmt.Errorf("ticket %x of limit %q: %w", k, limit, err)
	}
	if r.Fence != fence || !r.Has(limit) {
		return fmt.Errorf("%w: ticket %s of limits %q, fence %d, stored as ticket %d of limit %q", store.ErrCorrupt, r.ID, r.Names(), r.Fence, fence, limit)
	}
	return x.sameEverywhere(r, v, limit)
}

// QueueHeads implements policy.HeadQueuer: the limit's held tickets and
// its oldest waiter, decoded and checked as Queue checks them. The waiters
// behind it are only counted, by their state read without decoding them
// (fastState, as Position counts them): metrics and a waiting run's status
// line show a queue's length, not its records.
func (x *txn) QueueHeads(limit string) ([]policy.Rec, int, error) {
	b, err := x.queue(limit, false)
	if err != nil || b == nil {
		return nil, 0, err
	}
	var out []policy.Rec
	waiting := 0
	err = b.ForEach(func(k, v []byte) error {
		if waiting > 0 && len(k) == 8 {
			if state, ok := fastState(v); ok && state == store.Waiting {
				waiting++
				return nil
			}
		}
		var r ticketRec
		if err := x.queued(limit, k, v, &r); err != nil {
			return err
		}
		if r.State == store.Waiting {
			if waiting++; waiting > 1 {
				return nil
			}
		}
		out = append(out, r.Rec)
		return nil
	})
	return out, waiting, err
}

// sameEverywhere checks, once per transaction, that a ticket of several
// limits read in limit is the same bytes in the queue of each of its limits.
func (x *txn) sameEverywhere(r *ticketRec, v []byte, limit string) error {
	if len(r.Limits) < 2 || x.checked[r.Fence] {
		return nil
	}
	key := u64key(r.Fence)
	for _, name := range r.Limits {
		if name == limit {
			continue
		}
		b, err := x.queue(name, false)
		if err != nil {
			return err
		}
		var o []byte
		if b != nil {
			o = b.Get(key)
		}
		if !bytes.Equal(o, v) {
			return fmt.Errorf("%w: ticket %s (fence %d) differs between limits %q and %q", store.ErrCorrupt, r.ID, r.Fence, limit, name)
		}
	}
	if x.checked == nil {
		x.checked = map[uint64]bool{}
	}
	x.checked[r.Fence] = true
	return nil
}

// Put implements policy.Tx: the ticket goes into the queue of each of its
// limits, the same bytes in every one, and a new one into the id index.
func (x *txn) Put(p policy.Rec) error {
	r := ticketRec{V: formatVersion, Rec: p}
	v := encode(&r)
	for _, name := range r.Names() {
		b, err := x.queue(name, true)
		if err != nil {
			return err
		}
		if err := b.Put(u64key(r.Fence), v); err != nil {
			return err
		}
	}
	if x.checked != nil {
		delete(x.checked, r.Fence)
	}
	ids := x.bucket(bucketIDs)
	if ids.Get([]byte(r.ID)) != nil {
		return nil
	}
	return ids.Put([]byte(r.ID), encode(&idRec{V: formatVersion, Limit: r.Limit, Fence: r.Fence}))
}

// Delete implements policy.Tx: the ticket leaves the queue of each of its
// limits (each copy the same bytes) and the id index.
func (x *txn) Delete(r policy.Rec) error {
	key := u64key(r.Fence)
	var first []byte
	for i, name := range r.Names() {
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
			return fmt.Errorf("%w: ticket %s (fence %d) differs between limits %q and %q", store.ErrCorrupt, r.ID, r.Fence, r.Names()[0], name)
		}
		if err := b.Delete(key); err != nil {
			return err
		}
	}
	return x.bucket(bucketIDs).Delete([]byte(r.ID))
}

// NextFence implements policy.Tx.
func (x *txn) NextFence() (uint64, error) { return x.next(keySeq) }

// Lookup implements policy.Tx: a live ticket by id, its copy in its first limit.
func (x *txn) Lookup(id string) (policy.Rec, bool, error) {
	ids := x.bucket(bucketIDs)
	if ids == nil {
		return policy.Rec{}, false, nil
	}
	v := ids.Get([]byte(id))
	if v == nil {
		return policy.Rec{}, false, nil
	}
	var ir idRec
	if err := decode(v, &ir); err != nil {
		return policy.Rec{}, false, fmt.Errorf("ticket id %s: %w", id, err)
	}
	b, err := x.queue(ir.Limit, false)
	if err != nil {
		return policy.Rec{}, false, err
	}
	var tv []byte
	if b != nil {
		tv = b.Get(u64key(ir.Fence))
	}
	if tv == nil {
		return policy.Rec{}, false, fmt.Errorf("%w: ticket id %s points to missing ticket %d of limit %q", store.ErrCorrupt, id, ir.Fence, ir.Limit)
	}
	var r ticketRec
	if err := decodeTicket(tv, &r); err != nil {
		return r.Rec, false, fmt.Errorf("ticket %s: %w", id, err)
	}
	if r.ID != id || r.Fence != ir.Fence || r.Limit != ir.Limit {
		return r.Rec, false, fmt.Errorf("%w: ticket id %s points to ticket %s (fence %d, first limit %q) as ticket %d of limit %q",
			store.ErrCorrupt, id, r.ID, r.Fence, r.Limit, ir.Fence, ir.Limit)
	}
	return r.Rec, true, nil
}

// --- tombstones, events, counts ---

// Tomb implements policy.Tx.
func (x *txn) Tomb(id string) (policy.Tomb, bool, error) {
	b := x.bucket(bucketTombs)
	if b == nil {
		return policy.Tomb{}, false, nil
	}
	v := b.Get([]byte(id))
	if v == nil {
		return policy.Tomb{}, false, nil
	}
	var t tombRec
	if err := decode(v, &t); err != nil {
		return t.Tomb, false, fmt.Errorf("tombstone %s: %w", id, err)
	}
	return t.Tomb, true, nil
}

// PutTomb implements policy.Tx, and prunes the oldest tombstones.
func (x *txn) PutTomb(id string, t policy.Tomb) error {
	if err := x.bucket(bucketTombs).Put([]byte(id), encode(&tombRec{V: formatVersion, Tomb: t})); err != nil {
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
// maxTombstones. A late write is bounded by the lock timeout
// (Options.Timeout), so a day is ample.
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
			t, ok, err := x.Tomb(string(id))
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

// Log implements policy.Tx: the event under the next number, and the
// oldest pruned past store.MaxEvents.
func (x *txn) Log(ev store.Event) error {
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

// Ring implements policy.Tx.
func (x *txn) Ring(r policy.Rec) { x.rings = append(x.rings, refOf(r)) }

// Gone implements policy.Tx: rung, then deleted, so that its waiter learns at once.
func (x *txn) Gone(r policy.Rec) { x.unbell = append(x.unbell, refOf(r)) }

// view is r as a caller sees it now.
func (x *txn) view(r ticketRec, position int) store.Ticket { return r.View(x.now, position) }

// Position implements policy.Positioner: a waiting ticket's 1-based place among its limit's waiters (0
// for a held one). It counts the waiting tickets queued before it without
// decoding them (see fastState): a waiter's poll must not cost a decode of the
// whole queue, or a long queue polls in quadratic time.
func (x *txn) Position(r policy.Rec) (int, error) {
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
			if err := decodeTicket(v, &full); err != nil {
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

// Settled implements policy.Settler: whether a settle of limits would change nothing: no ticket
// of their closure (see gather) has expired, and policy.PlanSettle finds
// nobody to admit or prove dead. It reads the queues' fixed fields without
// decoding the records (see fastFields), and decodes only the few tickets
// the planner shows the judge. A waiter's renewal asks it first: hundreds of
// queued waiters renew a full limit all the time, and each full settle would
// decode the whole queue.
func (x *txn) Settled(limits []string) (bool, error) {
	sc := settledScan{x: x, todo: limits, in: policy.SettleInput{Slots: make(map[string]int, len(limits)), Mutations: x.s.mut}}
	for i := 0; i < len(sc.todo); i++ {
		name := sc.todo[i]
		lim, ok, err := x.Limit(name)
		if err != nil || !ok || !lim.Policy.IsFIFO() {
			return false, err // a policy's order needs the records (priority, share, age): the full settle
		}
		sc.in.Slots[name] = lim.Slots
		b, err := x.queue(name, false)
		if err != nil {
			return false, err
		}
		if b == nil {
			continue
		}
		err = b.ForEach(func(k, v []byte) error { return sc.add(name, k, v) })
		if err == errNotQuiet {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	if len(sc.todo) > 1 {
		slices.SortFunc(sc.in.Tickets, func(a, b policy.Queued) int { return cmp.Compare(a.Ticket.Fence, b.Ticket.Fence) })
	}
	if x.s.dead != nil {
		sc.in.Judge = func(t store.Ticket, act bool) (string, bool) {
			i, _ := strconv.Atoi(t.ID)
			var r ticketRec
			if err := decodeTicket(sc.raw[i], &r); err != nil {
				return "", true // not quiet: let the full settle report it
			}
			return x.s.dead(x.view(r, 0), act)
		}
	}
	return policy.PlanSettle(sc.in).Empty(), nil
}

// settledScan is Settled's walk over the queues of a closure of limits.
type settledScan struct {
	x    *txn
	in   policy.SettleInput
	raw  [][]byte        // the records, by the index each Queued carries as its ID
	seen map[uint64]bool // tickets of several limits already read
	todo []string        // the closure's limits, growing as tickets name more
}

// add reads one stored ticket of limit name into the planner's input, or
// returns errNotQuiet when it has expired (or must be decoded).
func (sc *settledScan) add(name string, k, v []byte) error {
	x := sc.x
	f, ok := fastFields(v)
	if !ok || len(k) != 8 || f.boot != x.now.Boot || (!f.quiet && x.now.Mono >= f.deadline) {
		return errNotQuiet // expired (or to be decoded): the full settle sweeps it
	}
	fence := binary.BigEndian.Uint64(k)
	t := store.Ticket{ID: strconv.Itoa(len(sc.raw)), Limit: name, State: f.state, Fence: fence, Weight: f.weight}
	if f.limits != nil {
		if sc.seen[fence] {
			return nil
		}
		if sc.seen == nil {
			sc.seen, sc.todo = map[uint64]bool{}, slices.Clone(sc.todo)
		}
		sc.seen[fence] = true
		t.Limit, t.Limits = f.limits[0], f.limits
		for _, l := range f.limits {
			if !slices.Contains(sc.todo, l) {
				sc.todo = append(sc.todo, l)
			}
		}
	}
	sc.in.Tickets = append(sc.in.Tickets, policy.Queued{Ticket: t, Quiet: f.quiet})
	sc.raw = append(sc.raw, v)
	return nil
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
