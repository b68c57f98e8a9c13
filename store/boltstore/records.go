package boltstore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"github.com/slotctl/slotctl/store/policy"
	"os"
	"strings"
	"sync"

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
	V int `json:"v"`
	// The record's fields, in the order fastFields relies on: everything
	// before "holder" is ours (ids, limit names, numbers, times, a boot
	// id) and holds no quote.
	policy.Rec
}

// ownUID is this process's effective uid, as a record keeps it.
func ownUID() *uint32 {
	u := uint32(euid())
	return &u
}

// euid is this process's effective uid, read once.
var euid = sync.OnceValue(os.Geteuid)

type limitRec struct {
	V int `json:"v"`
	policy.LimitRec
}

type idRec struct {
	V     int    `json:"v"`
	Limit string `json:"limit"`
	Fence uint64 `json:"fence"`
}

type tombRec struct {
	V int `json:"v"`
	policy.Tomb
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

// check refuses what the rules refuse (policy.Rec.Check) and, in a
// record of the previous version, what it could not hold.
func (r *ticketRec) check() error {
	if r.V == legacyVersion && (r.Limits != nil || r.Weight != 0 || r.Indexes != nil) {
		return fmt.Errorf("limits, weight or indexes in a version %d record", legacyVersion)
	}
	if r.V == legacyVersion && (r.Key != "" || r.Stop != nil || r.Replaces != nil || r.Holder.URL != "") {
		return fmt.Errorf("key, stop, replaces or url in a version %d record", legacyVersion)
	}
	return r.Rec.Check()
}

func (r *limitRec) check() error { return r.LimitRec.Check() }

func (r *idRec) check() error {
	if r.Fence == 0 {
		return fmt.Errorf("fence 0")
	}
	return store.CheckLimitName(r.Limit)
}

func (r *tombRec) check() error { return r.Tomb.Check() }

func (r *eventRec) check() error {
	if r.V == legacyVersion && (r.Limits != nil || r.Weight != 0 || r.Indexes != nil || r.By != "" || r.Waited != 0 || r.Held != 0) {
		return fmt.Errorf("limits, weight or indexes in a version %d event", legacyVersion)
	}
	return policy.CheckEvent(r.Event)
}

// decode parses a stored value into r, a zero record; anything it cannot
// read exactly, or that a request could not have written, is ErrCorrupt.
func decode(b []byte, r record) error {
	// Measured before anything reads it: a value is a slice of the store's
	// memory map, and an oversized one is never touched.
	if err := store.CheckRecordSize(len(b)); err != nil {
		return err
	}
	if t, ok := r.(*ticketRec); ok {
		return decodeTicket(b, t)
	}
	if err := json.Unmarshal(b, r); err != nil {
		return undecodable(err)
	}
	return checkRecord(r.version(), r.check, r.upgrade)
}

// decodeTicket is decode of a ticket: the fast reader, else encoding/json.
// It keeps r from escaping (encoding/json decodes into a copy), so that a
// caller decoding a whole queue does not allocate each record on the heap.
func decodeTicket(b []byte, r *ticketRec) error {
	if err := store.CheckRecordSize(len(b)); err != nil {
		return err
	}
	if !decodeTicketFast(b, r) {
		var slow ticketRec // not what the fast reader wrote before it gave up
		err := json.Unmarshal(b, &slow)
		if *r = slow; err != nil {
			return undecodable(err)
		}
	}
	if v := r.V; v != formatVersion && v != legacyVersion {
		return badVersion(v)
	}
	if err := r.check(); err != nil {
		return invalid(err)
	}
	r.upgrade()
	return nil
}

// checkRecord refuses a record of another version or one that a request
// could not have written, and upgrades one of the previous version.
func checkRecord(v int, check func() error, upgrade func()) error {
	if v != formatVersion && v != legacyVersion {
		return badVersion(v)
	}
	if err := check(); err != nil {
		return invalid(err)
	}
	upgrade() // check read a version 1 record as version 2 says
	return nil
}

func undecodable(err error) error {
	return fmt.Errorf("%w: undecodable record: %v", store.ErrCorrupt, err)
}

func badVersion(v int) error {
	return fmt.Errorf("%w: record format version %d: this slotctl reads versions %d and %d", store.ErrCorrupt, v, legacyVersion, formatVersion)
}

func invalid(err error) error {
	return fmt.Errorf("%w: invalid record: %v", store.ErrCorrupt, strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
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
