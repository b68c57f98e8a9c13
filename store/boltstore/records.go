package boltstore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/slotctl/slotctl/store"
)

// formatVersion is written in the meta bucket and in every record; a reader
// refuses any other version instead of guessing.
const formatVersion = 1

// Bucket and key names. Numbers in keys are big-endian so that bbolt's byte
// order is numeric order: the queue order of a limit is its keys' order.
var (
	bucketMeta   = []byte("meta")
	bucketLimits = []byte("limits")
	bucketQueue  = []byte("queue") // holds one sub-bucket per limit: fence -> ticket
	bucketIDs    = []byte("ids")   // ticket id -> {limit, fence}
	bucketTombs  = []byte("tombstones")
	bucketTombQ  = []byte("tombstone-order") // counter -> ticket id, oldest first, for pruning
	bucketEvents = []byte("events")          // counter -> event, oldest first

	keyFormat    = []byte("format")
	keySeq       = []byte("seq") // last fence issued
	keyEventSeq  = []byte("event-seq")
	keyTombSeq   = []byte("tombstone-seq")
	allBucketKey = [][]byte{bucketMeta, bucketLimits, bucketQueue, bucketIDs, bucketTombs, bucketTombQ, bucketEvents}
)

// ticketRec is a ticket as stored. Its deadline is on the boot-time clock of
// the boot it was written in (docs/leases.md §4.4); wall times are for display only.
type ticketRec struct {
	V            int           `json:"v"`
	ID           string        `json:"id"`
	Limit        string        `json:"limit"`
	State        store.State   `json:"state"`
	Fence        uint64        `json:"fence"`
	Slot         int           `json:"slot"`
	TTL          time.Duration `json:"ttl_ns"`
	DeadlineBoot string        `json:"deadline_boot"`
	DeadlineMono time.Duration `json:"deadline_mono_ns"`
	Created      time.Time     `json:"created"`
	Admitted     time.Time     `json:"admitted,omitzero"`
	Renewed      time.Time     `json:"renewed,omitzero"`
	Holder       store.Holder  `json:"holder"`
	// BellUID is the user whose bell directory holds the waiter's bell
	// (bell.go); absent in records of older versions.
	BellUID *uint32 `json:"bell_uid,omitempty"`
}

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
}

func (r *ticketRec) version() int { return r.V }
func (r *limitRec) version() int  { return r.V }
func (r *idRec) version() int     { return r.V }
func (r *tombRec) version() int   { return r.V }
func (r *eventRec) version() int  { return r.V }

func (r *ticketRec) check() error {
	if err := store.CheckID(r.ID); err != nil {
		return err
	}
	if err := store.CheckLimitName(r.Limit); err != nil {
		return err
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
	return store.CheckTTL(r.TTL)
}

func (r *limitRec) check() error { return store.CheckSlots(r.Slots) }

func (r *idRec) check() error {
	if r.Fence == 0 {
		return fmt.Errorf("fence 0")
	}
	return store.CheckLimitName(r.Limit)
}

func (r *tombRec) check() error { return nil }

func (r *eventRec) check() error {
	if err := store.CheckID(r.Ticket); err != nil {
		return err
	}
	return store.CheckLimitName(r.Limit)
}

// decode parses a stored value; anything it cannot read exactly, or that a
// request could not have written, is ErrCorrupt.
func decode(b []byte, r record) error {
	if err := json.Unmarshal(b, r); err != nil {
		return fmt.Errorf("%w: undecodable record: %v", store.ErrCorrupt, err)
	}
	if v := r.version(); v != formatVersion {
		return fmt.Errorf("%w: record format version %d, this slotctl reads %d", store.ErrCorrupt, v, formatVersion)
	}
	if err := r.check(); err != nil {
		return fmt.Errorf("%w: invalid record: %v", store.ErrCorrupt, strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
	}
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
