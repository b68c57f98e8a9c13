package boltstore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/slotctl/slotctl/store"
)

// formatVersion is written in the meta bucket and in every record; a reader
// reads it and the previous release's (legacyVersion: one limit, weight 1)
// and refuses any other instead of guessing (docs/leases.md §2.1 item 9).
const (
	formatVersion = 2
	legacyVersion = 1
)

// Bucket and key names. Numbers in keys are big-endian so that bbolt's byte
// order is numeric order: the queue order of a limit is its keys' order.
var (
	bucketMeta   = []byte("meta")
	bucketLimits = []byte("limits")
	bucketQueue  = []byte("queue") // holds one sub-bucket per limit: fence -> ticket, a copy in each of its limits
	bucketIDs    = []byte("ids")   // ticket id -> {first limit, fence}
	bucketTombs  = []byte("tombstones")
	bucketTombQ  = []byte("tombstone-order") // counter -> ticket id, oldest first, for pruning
	bucketEvents = []byte("events")          // counter -> event, oldest first

	keyFormat    = []byte("format")
	keySeq       = []byte("seq") // last fence issued
	keyEventSeq  = []byte("event-seq")
	keyTombSeq   = []byte("tombstone-seq")
	allBucketKey = [][]byte{bucketMeta, bucketLimits, bucketQueue, bucketIDs, bucketTombs, bucketTombQ, bucketEvents, bucketCounts}
)

// ticketRec is a ticket as stored. Its deadline is on the boot-time clock of
// the boot it was written in (docs/leases.md §4.4); wall times are for display only.
//
// A ticket of several limits is stored in the queue of each, the same bytes
// in every one (written together, in one transaction): a reader that finds
// two copies that differ has found a corrupt store.
type ticketRec struct {
	V     int         `json:"v"`
	ID    string      `json:"id"`
	Limit string      `json:"limit"` // the first of Limits
	State store.State `json:"state"`
	// Limits, Weight and Indexes are version 2's, written only for a ticket
	// of several limits or a weight above 1; otherwise (and in a version 1
	// record) it has none: one limit, weight 1, holding Slot. Use names,
	// weight, in. Nothing before the holder can hold a quote (see fastFields).
	Limits       []string         `json:"limits,omitempty"`
	Weight       int              `json:"weight,omitempty"`
	Fence        uint64           `json:"fence"`
	Slot         int              `json:"slot"`
	Indexes      map[string][]int `json:"indexes,omitempty"` // iff held: Weight ascending indexes in each limit
	TTL          time.Duration    `json:"ttl_ns"`
	DeadlineBoot string           `json:"deadline_boot"`
	DeadlineMono time.Duration    `json:"deadline_mono_ns"`
	// Quiet: a waiting ticket not yet in line, whose waiter renews nothing
	// and whose deadline is not judged (docs/leases.md rule 17). Before the
	// holder, so that fastFields reads it.
	Quiet    bool         `json:"quiet,omitempty"`
	Created  time.Time    `json:"created"`
	Admitted time.Time    `json:"admitted,omitzero"`
	Renewed  time.Time    `json:"renewed,omitzero"`
	Holder   store.Holder `json:"holder"`
	// BellUID is the user whose bell directory holds the waiter's bell
	// (bell.go); absent in records of older versions.
	BellUID *uint32 `json:"bell_uid,omitempty"`
	// Key, Stop and Replaces are docs/leases.md §2.1 item 10's (version 2,
	// optional). They come after the holder: a key or a URL may hold a
	// quote, and fastFields reads nothing past "holder".
	Key      string           `json:"key,omitempty"`
	Stop     *store.Successor `json:"stop,omitempty"`     // a held ticket a newer run asked to stop
	Replaces []string         `json:"replaces,omitempty"` // the held tickets this one waits to be gone
}

// maxReplaces is the most held tickets one enqueue may ask to stop: a
// record's list of them is bounded like everything else read from the file.
const maxReplaces = 256

// ownUID is this process's effective uid, as a record keeps it.
func ownUID() *uint32 {
	u := uint32(euid())
	return &u
}

// euid is this process's effective uid, read once.
var euid = sync.OnceValue(os.Geteuid)

type limitRec struct {
	V       int       `json:"v"`
	Slots   int       `json:"slots"`
	Created time.Time `json:"created"`
}

type idRec struct {
	V     int    `json:"v"`
	Limit string `json:"limit"`
	Fence uint64 `json:"fence"`
}

type tombRec struct {
	V      int           `json:"v"`
	Reason store.Reason  `json:"reason"`
	Wall   time.Time     `json:"wall"`
	Boot   string        `json:"boot"`
	Mono   time.Duration `json:"mono_ns"`
	// By is the newer run that superseded the ticket (Reason Superseded
	// only): what Get and Renew of its id name (store.SupersededError).
	By *store.Successor `json:"by,omitempty"`
}

// eventRec is a store.Event as stored.
type eventRec struct {
	V int `json:"v"`
	store.Event
}

// record is what every stored value is: versioned JSON, checked as
// strictly as the requests that write it (docs/leases.md §4.5): a member can write the
// store file, and an id read from it names a bell.
type record interface {
	version() int
	check() error
	upgrade()
}

func (r *ticketRec) version() int { return r.V }
func (r *limitRec) version() int  { return r.V }
func (r *idRec) version() int     { return r.V }
func (r *tombRec) version() int   { return r.V }
func (r *eventRec) version() int  { return r.V }

func (r *ticketRec) upgrade() { r.V = formatVersion }
func (r *limitRec) upgrade()  { r.V = formatVersion }
func (r *idRec) upgrade()     { r.V = formatVersion }
func (r *tombRec) upgrade()   { r.V = formatVersion }
func (r *eventRec) upgrade()  { r.V = formatVersion }

func (r *ticketRec) check() error {
	if err := store.CheckID(r.ID); err != nil {
		return err
	}
	if err := store.CheckLimitName(r.Limit); err != nil {
		return err
	}
	if r.Limits != nil || r.Weight != 0 || r.Indexes != nil {
		if r.V == legacyVersion {
			return fmt.Errorf("limits, weight or indexes in a version %d record", legacyVersion)
		}
		if err := r.checkLimits(); err != nil {
			return err
		}
	}
	switch {
	case r.State != store.Held && r.State != store.Waiting:
		return fmt.Errorf("state %q", r.State)
	case r.Fence == 0:
		return fmt.Errorf("fence 0")
	case r.State == store.Held && (r.Slot < 0 || r.Slot >= store.MaxSlots):
		return fmt.Errorf("slot %d of a held ticket: want 0..%d", r.Slot, store.MaxSlots-1)
	case r.State == store.Waiting && r.Slot != -1:
		return fmt.Errorf("slot %d of a waiting ticket: want -1", r.Slot)
	case r.Holder.Pid < 0 || r.Holder.Pgid < 0:
		return fmt.Errorf("holder pid %d, group %d: want no negative pid", r.Holder.Pid, r.Holder.Pgid)
	}
	if err := store.CheckStoredHolder(r.Holder); err != nil {
		return err
	}
	if err := store.CheckTicketSlots(len(r.names()), r.weight()); err != nil {
		return err
	}
	if err := r.checkKeyed(); err != nil {
		return err
	}
	return store.CheckTTL(r.TTL)
}

// checkKeyed checks what newer runs first (docs/leases.md §2.1 item 10)
// and the CI URL add, as strictly as a request: a key and a URL a request
// could carry, a stop request only on a held ticket naming a successor,
// and at most maxReplaces distinct ticket ids (never its own) in Replaces.
func (r *ticketRec) checkKeyed() error {
	if r.V == legacyVersion && (r.Key != "" || r.Stop != nil || r.Replaces != nil || r.Holder.URL != "") {
		return fmt.Errorf("key, stop, replaces or url in a version %d record", legacyVersion)
	}
	if err := store.CheckKey(r.Key); err != nil {
		return err
	}
	if err := store.CheckURL(r.Holder.URL); err != nil {
		return err
	}
	if r.Stop != nil {
		if r.State != store.Held {
			return fmt.Errorf("a stop request on a ticket that is not held")
		}
		if err := checkSuccessor(*r.Stop); err != nil {
			return err
		}
	}
	if r.Replaces != nil && len(r.Replaces) == 0 || len(r.Replaces) > maxReplaces {
		return fmt.Errorf("%d replaced tickets: want 1..%d", len(r.Replaces), maxReplaces)
	}
	for i, id := range r.Replaces {
		if err := store.CheckID(id); err != nil {
			return err
		}
		if id == r.ID || slices.Contains(r.Replaces[:i], id) {
			return fmt.Errorf("ticket %s replaces %s twice or itself", r.ID, id)
		}
	}
	return nil
}

// checkSuccessor checks a successor as the enqueue that made it checked its
// request: a ticket id, a printable host, a pid, a URL.
func checkSuccessor(s store.Successor) error {
	if err := store.CheckID(s.Ticket); err != nil {
		return err
	}
	if len(s.Host) > maxHost || !store.IsPrintable(s.Host) {
		return fmt.Errorf("successor host %q: want at most %d printable characters", s.Host, maxHost)
	}
	if s.Pid < 0 {
		return fmt.Errorf("successor pid %d: want no negative pid", s.Pid)
	}
	return store.CheckURL(s.URL)
}

// maxHost bounds a successor's host name: a supersede or replace refuses a
// request whose host is longer or not printable (checkSuccessorHost), so
// that it never writes a successor its reader would refuse.
const maxHost = 255

// checkSuccessorHost refuses a superseding request whose host could not be
// read back from the records it names it in.
func checkSuccessorHost(host string) error {
	if len(host) > maxHost || !store.IsPrintable(host) {
		return fmt.Errorf("%w: host %q: want at most %d printable characters", store.ErrInvalid, host, maxHost)
	}
	return nil
}

// checkLimits checks what version 2 adds, written only for a ticket of
// several limits or of a weight above 1 (a ticket of one limit and weight 1
// is stored as version 1 stored it, but for "v", and holds Slot): the
// limits a request could name (the first one Limit), a weight of
// 1..MaxSlots, and, iff held, exactly Weight ascending distinct indexes
// below MaxSlots in each limit and no other, Slot the lowest in the first.
func (r *ticketRec) checkLimits() error {
	if err := store.CheckLimits(r.Limits); err != nil {
		return err
	}
	if r.Limits[0] != r.Limit {
		return fmt.Errorf("limit %q is not the first of limits %q", r.Limit, r.Limits)
	}
	if r.Weight < 1 || r.Weight > store.MaxSlots {
		return fmt.Errorf("weight %d: want 1..%d", r.Weight, store.MaxSlots)
	}
	if len(r.Limits) == 1 && r.Weight == 1 {
		return fmt.Errorf("limits and weight of a ticket of one limit and weight 1: want neither")
	}
	if r.State != store.Held {
		if r.Indexes != nil {
			return fmt.Errorf("slot indexes of a ticket that is not held")
		}
		return nil
	}
	if len(r.Indexes) != len(r.Limits) {
		return fmt.Errorf("slot indexes in %d limits of a held ticket of %d", len(r.Indexes), len(r.Limits))
	}
	for _, name := range r.Limits {
		ix, ok := r.Indexes[name]
		if !ok {
			return fmt.Errorf("no slot indexes in limit %q of a held ticket", name)
		}
		if len(ix) != r.Weight {
			return fmt.Errorf("%d slot indexes in limit %q of a ticket of weight %d", len(ix), name, r.Weight)
		}
		for i, n := range ix {
			if n < 0 || n >= store.MaxSlots || i > 0 && n <= ix[i-1] {
				return fmt.Errorf("slot indexes %v in limit %q: want ascending distinct indexes of 0..%d", ix, name, store.MaxSlots-1)
			}
		}
	}
	if r.Slot != r.Indexes[r.Limit][0] {
		return fmt.Errorf("slot %d of a ticket whose lowest index in %q is %d", r.Slot, r.Limit, r.Indexes[r.Limit][0])
	}
	return nil
}

// names is the ticket's limits: Limits, or Limit alone.
func (r *ticketRec) names() []string {
	if len(r.Limits) == 0 {
		return []string{r.Limit}
	}
	return r.Limits
}

// weight is how many slots it takes in each limit.
func (r *ticketRec) weight() int { return max(r.Weight, 1) }

// in is its slot indexes in limit while held.
func (r *ticketRec) in(limit string) []int {
	if r.State != store.Held {
		return nil
	}
	if ix, ok := r.Indexes[limit]; ok {
		return ix
	}
	if r.Indexes == nil && limit == r.Limit && r.Slot >= 0 {
		return []int{r.Slot}
	}
	return nil
}

// has reports whether the ticket names limit.
func (r *ticketRec) has(limit string) bool {
	if len(r.Limits) == 0 {
		return r.Limit == limit
	}
	for _, n := range r.Limits {
		if n == limit {
			return true
		}
	}
	return false
}

func (r *limitRec) check() error { return store.CheckSlots(r.Slots) }

func (r *idRec) check() error {
	if r.Fence == 0 {
		return fmt.Errorf("fence 0")
	}
	return store.CheckLimitName(r.Limit)
}

func (r *tombRec) check() error {
	if r.By == nil {
		return nil
	}
	if r.Reason != store.Superseded {
		return fmt.Errorf("a successor in a tombstone of a ticket %s", r.Reason)
	}
	return checkSuccessor(*r.By)
}

func (r *eventRec) check() error {
	if err := store.CheckID(r.Ticket); err != nil {
		return err
	}
	if err := store.CheckLimitName(r.Limit); err != nil {
		return err
	}
	if r.By != "" {
		if err := store.CheckID(r.By); err != nil {
			return err
		}
	}
	if err := store.CheckEventText(r.Event); err != nil {
		return err
	}
	if r.Waited < 0 || r.Held < 0 {
		return fmt.Errorf("event waited %v, held %v: want neither negative", r.Waited, r.Held)
	}
	if r.V == legacyVersion {
		if r.Limits != nil || r.Weight != 0 || r.Indexes != nil || r.By != "" || r.Waited != 0 || r.Held != 0 {
			return fmt.Errorf("limits, weight or indexes in a version %d event", legacyVersion)
		}
		return nil
	}
	if r.Limits != nil {
		if err := store.CheckLimits(r.Limits); err != nil {
			return err
		}
		if len(r.Limits) < 2 || !slices.Contains(r.Limits, r.Limit) {
			return fmt.Errorf("event of limit %q naming limits %q", r.Limit, r.Limits)
		}
	}
	if r.Weight < 0 || r.Weight == 1 || r.Weight > store.MaxSlots {
		return fmt.Errorf("event weight %d: want none or 2..%d", r.Weight, store.MaxSlots)
	}
	if len(r.Indexes) > r.Weight {
		return fmt.Errorf("%d slot indexes in an event of weight %d", len(r.Indexes), r.Weight)
	}
	for _, n := range r.Indexes {
		if n < 0 || n >= store.MaxSlots {
			return fmt.Errorf("event slot index %d: want 0..%d", n, store.MaxSlots-1)
		}
	}
	return nil
}

// decode parses a stored value; anything it cannot read exactly, or that a
// request could not have written, is ErrCorrupt.
func decode(b []byte, r record) error {
	// Measured before anything reads it: a value is a slice of the store's
	// memory map, and an oversized one is never touched.
	if err := store.CheckRecordSize(len(b)); err != nil {
		return err
	}
	if err := json.Unmarshal(b, r); err != nil {
		return fmt.Errorf("%w: undecodable record: %v", store.ErrCorrupt, err)
	}
	if v := r.version(); v != formatVersion && v != legacyVersion {
		return fmt.Errorf("%w: record format version %d: this slotctl reads versions %d and %d", store.ErrCorrupt, v, legacyVersion, formatVersion)
	}
	if err := r.check(); err != nil {
		return fmt.Errorf("%w: invalid record: %v", store.ErrCorrupt, strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
	}
	r.upgrade() // check read a version 1 record as version 2 says
	return nil
}

func encode(r any) []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // only plain structs are encoded
	}
	return b
}

func u64key(n uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], n)
	return k[:]
}

func keyU64(k []byte) (uint64, error) {
	if len(k) != 8 {
		return 0, fmt.Errorf("%w: key of %d bytes where 8 were expected", store.ErrCorrupt, len(k))
	}
	return binary.BigEndian.Uint64(k), nil
}
