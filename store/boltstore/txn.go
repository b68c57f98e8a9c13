package boltstore

import (
	"bytes"
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
}

// init creates the buckets of a new file and checks the format of an old one.
func (x *txn) init() error {
	for _, name := range allBucketKey {
		if _, err := x.tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	meta := x.tx.Bucket(bucketMeta)
	if meta.Get(keyFormat) == nil {
		return meta.Put(keyFormat, []byte(fmt.Sprint(formatVersion)))
	}
	return x.checkFormat()
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
	if v := meta.Get(keyFormat); !bytes.Equal(v, []byte(fmt.Sprint(formatVersion))) {
		return fmt.Errorf("%w: store format %q, this slotctl reads %d", store.ErrCorrupt, v, formatVersion)
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

// tickets reads a limit's queue in order (fence order is FIFO order).
func (x *txn) tickets(limit string) ([]ticketRec, error) {
	b, err := x.queue(limit, false)
	if err != nil || b == nil {
		return nil, err
	}
	var out []ticketRec
	err = b.ForEach(func(k, v []byte) error {
		var r ticketRec
		if err := decode(v, &r); err != nil {
			return fmt.Errorf("ticket %x of limit %q: %w", k, limit, err)
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

func (x *txn) putTicket(r ticketRec) error {
	b, err := x.queue(r.Limit, true)
	if err != nil {
		return err
	}
	r.V = formatVersion
	return b.Put(u64key(r.Fence), encode(&r))
}

// lookup finds a live ticket by id.
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
	if r.DeadlineBoot != x.now.Boot {
		return "previous boot"
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

// remove deletes a live ticket, tombstones its id and logs why. It is the
// only way a ticket leaves the store, and so the only thing that frees a slot.
func (x *txn) remove(r ticketRec, why store.Reason, evidence string) error {
	b, err := x.queue(r.Limit, false)
	if err != nil {
		return err
	}
	if b == nil || b.Get(u64key(r.Fence)) == nil {
		return fmt.Errorf("%w: removing ticket %s that is not in limit %q", store.ErrCorrupt, r.ID, r.Limit)
	}
	if err := b.Delete(u64key(r.Fence)); err != nil {
		return err
	}
	if err := x.bucket(bucketIDs).Delete([]byte(r.ID)); err != nil {
		return err
	}
	if err := x.addTombstone(r.ID, why); err != nil {
		return err
	}
	x.unbell = append(x.unbell, refOf(r))
	return x.event(string(why), r, evidence)
}

func (x *txn) addTombstone(id string, why store.Reason) error {
	if x.s.mut.Has(mutation.NoTombstone) { // mutation (test-only): forget removed ids (C5, S7)
		return nil
	}
	t := tombRec{V: formatVersion, Reason: why, Wall: x.now.Wall, Boot: x.now.Boot, Mono: x.now.Mono}
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

func (x *txn) event(kind string, r ticketRec, evidence string) error {
	n, err := x.next(keyEventSeq)
	if err != nil {
		return err
	}
	e := eventRec{V: formatVersion, Event: store.Event{Seq: n, Time: x.now.Wall, Kind: kind, Limit: r.Limit, Ticket: r.ID,
		Fence: r.Fence, Slot: r.Slot, Host: r.Holder.Host, Pid: r.Holder.Pid, User: r.Holder.User,
		Command: r.Holder.Command(), Evidence: evidence}}
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

// settle sweeps a limit and promotes its waiters: the step every write that
// can free or add capacity ends with. The policy is store.PlanSettle's, on
// the tickets read in this transaction (a list made earlier is never
// trusted); an expired ticket is shown to the judge too, so that a job its
// dead supervisor left running is stopped before its slot is handed on.
// all: judge every ticket (reap). It returns the tickets that remain, in
// order, and the removals.
func (x *txn) settle(limit string, all bool) ([]ticketRec, []store.Removal, error) {
	lim, ok, err := x.limit(limit)
	if err != nil || !ok {
		return nil, nil, err
	}
	recs, err := x.tickets(limit)
	if err != nil {
		return nil, nil, err
	}
	in := x.settleInput(limit, lim.Slots, recs)
	in.All, in.Judge, in.JudgeExpired = all, x.s.dead, true
	if x.s.mut.Has(mutation.StaleVerdict) { // mutation (test-only): judge on the deadlines an earlier scan read (A1)
		x.mutStaleVerdict(&in)
	}
	return x.apply(recs, store.PlanSettle(in))
}

// settleInput is a limit's tickets as the planner sees them, judged by the store's clock.
func (x *txn) settleInput(limit string, slots int, recs []ticketRec) store.SettleInput {
	in := store.SettleInput{Slots: map[string]int{limit: slots}, Tickets: make([]store.Queued, len(recs))}
	for i, r := range recs {
		in.Tickets[i] = store.Queued{Ticket: x.view(r, 0), Expired: x.expiry(r)}
	}
	return in
}

// apply carries out a settle's plan on recs (the planner's input): each
// removal reaps its ticket, each admission takes its slot index. It returns
// the tickets that remain, in order, with the admitted ones held.
func (x *txn) apply(recs []ticketRec, plan store.SettlePlan) ([]ticketRec, []store.Removal, error) {
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
		r.State, r.Slot, r.Admitted = store.Held, a.Slot, x.now.Wall
		if err := x.putTicket(*r); err != nil {
			return nil, nil, err
		}
		if err := x.event("admitted", *r, ""); err != nil {
			return nil, nil, err
		}
		x.rings = append(x.rings, refOf(*r))
	}
	live := recs[:0:0]
	for i, r := range recs {
		if !gone[i] {
			live = append(live, r)
		}
	}
	return live, removed, nil
}

// view turns a record into the caller's Ticket; position is 1-based among waiters.
func (x *txn) view(r ticketRec, position int) store.Ticket {
	t := store.Ticket{ID: r.ID, Limit: r.Limit, State: r.State, Fence: r.Fence, Slot: r.Slot,
		TTL: r.TTL, Holder: r.Holder, Created: r.Created, Admitted: r.Admitted, Renewed: r.Renewed}
	if r.State == store.Waiting {
		t.Slot, t.Position = -1, position
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

// quiet reports whether a limit's settle would change nothing: no ticket has
// expired, and store.PlanSettle finds nobody to admit or prove dead. It reads
// the queue's fixed fields without decoding the records (see fastFields),
// and decodes only the few tickets the planner shows the judge. A waiter's
// renewal asks it first: hundreds of queued waiters renew a full limit all
// the time, and each full settle would decode the whole queue.
func (x *txn) quiet(limit string) (bool, error) {
	lim, ok, err := x.limit(limit)
	if err != nil || !ok {
		return false, err
	}
	b, err := x.queue(limit, false)
	if err != nil || b == nil {
		return false, err
	}
	in := store.SettleInput{Slots: map[string]int{limit: lim.Slots}}
	var raw [][]byte // the records, by the index each Queued carries as its ID
	err = b.ForEach(func(_, v []byte) error {
		f, ok := fastFields(v)
		if !ok || f.boot != x.now.Boot || x.now.Mono >= f.deadline {
			return errNotQuiet // expired (or to be decoded): the full settle sweeps it
		}
		in.Tickets = append(in.Tickets, store.Queued{Ticket: store.Ticket{ID: strconv.Itoa(len(raw)), Limit: limit, State: f.state}})
		raw = append(raw, v)
		return nil
	})
	if err == errNotQuiet {
		return false, nil
	}
	if err != nil {
		return false, err
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
}

// fastFields reads a stored ticket's state and deadline without decoding it.
// encoding/json writes ticketRec's fields in order, and every field before
// the holder is ours (version, id, limit name, state, numbers, boot id): none
// can hold a quote, so the first occurrence of each key is the field. A
// record that does not read this way gets ok = false and a full decode.
func fastFields(v []byte) (fixed, bool) {
	var f fixed
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
	return f, true
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

// viewIn returns the ticket with its queue position among recs.
func (x *txn) viewIn(recs []ticketRec, id string) (store.Ticket, bool) {
	pos := 0
	for _, r := range recs {
		if r.State == store.Waiting {
			pos++
		}
		if r.ID == id {
			return x.view(r, pos), true
		}
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
	recs, err := x.tickets(limit)
	if err != nil {
		return err
	}
	held := 0
	for _, r := range recs {
		if r.State == store.Held {
			held++
		}
	}
	in := x.settleInput(limit, max(held+1, lim.Slots), recs)
	for i := range in.Tickets {
		in.Tickets[i].Expired = "" // no sweep: only the promotion
	}
	_, _, err = x.apply(recs, store.PlanSettle(in))
	return err
}

// mutReleaseSlot (ReleaseNoCompare) removes whichever ticket holds the slot
// t held: a release keyed by the slot, not by the caller's own ticket.
func (x *txn) mutReleaseSlot(t store.Ticket, why store.Reason) error {
	if t.State != store.Held || t.Limit == "" {
		return nil
	}
	recs, err := x.tickets(t.Limit)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.State == store.Held && r.Slot == t.Slot {
			if err := x.remove(r, why, ""); err != nil {
				return err
			}
			_, _, err := x.settle(t.Limit, false)
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
