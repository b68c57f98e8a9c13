package boltstore_test

import (
	"encoding/binary"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
	"github.com/slotctl/slotctl/store/storetest"
)

// skewedClock reads another clock plus an offset: the store's clock as a
// second process, whose reading is ahead, sees it.
type skewedClock struct {
	c boltstore.Clock
	d time.Duration
}

func (k skewedClock) Now() boltstore.Instant {
	i := k.c.Now()
	i.Mono += k.d
	i.Wall = i.Wall.Add(k.d)
	return i
}

func newBackend(t *testing.T, judge store.Judge) storetest.Backend {
	return newBackendAt(t, judge, filepath.Join(t.TempDir(), "slots.db"),
		boltstore.NewFakeClock(boltstore.Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()}))
}

func newBackendAt(t *testing.T, judge store.Judge, path string, clock *boltstore.FakeClock) storetest.Backend {
	open := func(c boltstore.Clock) store.Store {
		st, err := boltstore.New(path, boltstore.Options{Clock: c, Timeout: 5 * time.Second, Dead: judge})
		if err != nil {
			t.Fatalf("boltstore.New(%s): %v", path, err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	return storetest.Backend{
		Store:   open(clock),
		Advance: clock.Advance,
		Reopen:  func() store.Store { return open(clock) },
		Skewed:  func(d time.Duration) store.Store { return open(skewedClock{clock, d}) },
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		TTL:          10 * time.Second,
		New:          func(t *testing.T) storetest.Backend { return newBackend(t, nil) },
		NewWithJudge: newBackend,
		NewLegacy:    newLegacy,
	})
}

// conformanceTTL is the TTL the suite runs with (Harness.TTL).
const conformanceTTL = 10 * time.Second

// v1Ticket is a ticket record as the previous release wrote it (record
// version 1): one limit, weight 1, no limits, weight or indexes.
type v1Ticket struct {
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
	Holder       store.Holder  `json:"holder"`
}

// newLegacy is Harness.NewLegacy: the fixture written straight into a new
// file in the previous release's layout and format (meta format "1",
// version 1 records, one queue bucket per limit, ids -> {limit, fence}),
// its leases running from the fake clock's now.
func newLegacy(t *testing.T) storetest.Backend {
	path := filepath.Join(t.TempDir(), "slots.db")
	clock := boltstore.NewFakeClock(boltstore.Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()})
	now := clock.Now()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	u64 := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	js := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := map[string]*bolt.Bucket{}
		for _, name := range []string{"meta", "limits", "queue", "ids", "tombstones", "tombstone-order", "events"} {
			if b[name], err = tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		q, err := b["queue"].CreateBucket([]byte(storetest.LegacyLimit))
		if err != nil {
			return err
		}
		put := func(b *bolt.Bucket, k, v []byte) {
			if err == nil {
				err = b.Put(k, v)
			}
		}
		put(b["meta"], []byte("format"), []byte("1"))
		put(b["meta"], []byte("seq"), u64(uint64(len(storetest.LegacyIDs))))
		put(b["limits"], []byte(storetest.LegacyLimit), js(map[string]any{"v": 1, "slots": 2, "created": now.Wall}))
		for i, id := range storetest.LegacyIDs {
			fence := uint64(i + 1)
			r := v1Ticket{V: 1, ID: id, Limit: storetest.LegacyLimit, State: store.Held, Fence: fence, Slot: i, TTL: conformanceTTL,
				DeadlineBoot: now.Boot, DeadlineMono: now.Mono + conformanceTTL, Created: now.Wall, Admitted: now.Wall,
				Holder: storetest.LegacyHolder}
			if i >= 2 {
				r.State, r.Slot, r.Admitted = store.Waiting, -1, time.Time{}
			}
			put(q, u64(fence), js(r))
			put(b["ids"], []byte(id), js(map[string]any{"v": 1, "limit": storetest.LegacyLimit, "fence": fence}))
		}
		return err
	})
	if err == nil {
		err = db.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return newBackendAt(t, nil, path, clock)
}
