package boltstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/store"
)

var fuzzWall = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

func seedTicket() *ticketRec {
	return &ticketRec{V: formatVersion, ID: "b", Limit: "x", Limits: []string{"x"}, Weight: 1, State: store.Waiting, Fence: 2, Slot: -1, TTL: testTTL,
		DeadlineBoot: "b1", DeadlineMono: time.Hour + testTTL, Created: fuzzWall,
		Holder: store.Holder{Host: "h", User: "u", BootID: "b1", PidNS: 4026531836, Pid: 42, PidStart: 99,
			Argv: []string{"make", "-j", "it's"}, Label: "build"}}
}

func seedRecords() []record {
	held := seedTicket()
	held.State, held.Slot, held.Admitted, held.Renewed = store.Held, 0, fuzzWall, fuzzWall
	held.Indexes = map[string][]int{"x": {0}}
	return []record{
		seedTicket(),
		held,
		&limitRec{V: formatVersion, Slots: 2, Created: fuzzWall},
		&idRec{V: formatVersion, Limit: "x", Fence: 2},
		&tombRec{V: formatVersion, Reason: store.Cancelled, Wall: fuzzWall, Boot: "b1", Mono: time.Hour},
		&eventRec{V: formatVersion, Event: store.Event{Seq: 9, Time: fuzzWall, Kind: "reaped", Limit: "x", Ticket: "b", Fence: 2,
			Slot: 0, Host: "h", Pid: 42, Command: "make", Evidence: "expired 3s ago"}},
	}
}

var extraSeeds = []string{
	``, `null`, `{}`, `[]`, `{"v":1}`, `{"v":2}`, `{"v":1.5}`, `{"v":"1"}`, `{"v":1,"v":2}`,
	`{"v":1,"fence":-1}`, `{"v":1,"ttl_ns":1e30}`, `{"v":1,"created":"10000-01-01T00:00:00Z"}`,
	`{"v":1,"created":"0000-01-01T00:00:00+23:59"}`, `{"v":1,"holder":{"argv":["\xff"]}}`,
	`{"v":1,"state":"zombie","slot":-7}`, "\x00\xff", `{"v":1}garbage`,
}

// checkDecode decodes b into r and checks the contract: an error wraps
// ErrCorrupt; a success has the current version and encodes again (the store
// writes decoded records back on promotion and renewal).
func checkDecode(t *testing.T, b []byte, r record) {
	t.Helper()
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("decode(%q) panicked: %v", b, p)
			}
		}()
		err = decode(b, r)
	}()
	if err != nil {
		if !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("decode(%q) = %v, want an error wrapping ErrCorrupt", b, err)
		}
		return
	}
	if v := r.version(); v != formatVersion {
		t.Fatalf("decode(%q) accepted version %d", b, v)
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("decode(%q) accepted a record that cannot be encoded again: %v", b, p)
			}
		}()
		encode(r)
	}()
}

func FuzzDecodeTicket(f *testing.F) {
	for _, r := range seedRecords() {
		f.Add(encode(r))
	}
	for _, s := range extraSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b, &ticketRec{})
	})
}

func FuzzDecodeRecords(f *testing.F) {
	for _, r := range seedRecords() {
		for kind := range uint8(4) {
			f.Add(kind, encode(r))
		}
	}
	for _, s := range extraSeeds {
		f.Add(uint8(0), []byte(s))
		f.Add(uint8(3), []byte(s))
	}
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		var r record
		switch kind % 4 {
		case 0:
			r = &limitRec{}
		case 1:
			r = &idRec{}
		case 2:
			r = &tombRec{}
		default:
			r = &eventRec{}
		}
		checkDecode(t, b, r)
	})
}

// FuzzStoredTicket writes arbitrary bytes as the value of waiting ticket "b"
// (fence 2) of limit "x", behind held ticket "a" (fence 1), straight into the
// file, then runs every operation that reads it: none may panic, and when the
// value does not decode each fails with ErrCorrupt naming the file.
func FuzzStoredTicket(f *testing.F) {
	tmpl := filepath.Join(f.TempDir(), "template.db")
	clock := newClock()
	base := clock.Now()
	s, err := New(tmpl, Options{Clock: clock, NoSync: true})
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if _, err := s.Enqueue(ctx, req(id, "x", 1)); err != nil {
			f.Fatal(err)
		}
	}
	template, err := os.ReadFile(tmpl)
	if err != nil {
		f.Fatal(err)
	}
	rawView(f, tmpl, func(tx *bolt.Tx) error {
		f.Add(append([]byte(nil), tx.Bucket(bucketQueue).Bucket([]byte("x")).Get(u64key(2))...))
		return nil
	})
	for _, r := range seedRecords()[:2] {
		f.Add(encode(r))
	}
	for _, s := range extraSeeds {
		f.Add([]byte(s))
	}
	other := seedTicket()
	other.Limit = "y" // decodes, but sits in the wrong limit
	f.Add(encode(other))
	other = seedTicket()
	other.ID = "zz" // decodes, but is not the id that points to it
	f.Add(encode(other))
	other = seedTicket()
	other.Fence = 7
	f.Add(encode(other))

	f.Fuzz(func(t *testing.T, value []byte) {
		path := filepath.Join(t.TempDir(), "slots.db")
		if err := os.WriteFile(path, template, 0o600); err != nil {
			t.Fatal(err)
		}
		rawUpdate(t, path, func(tx *bolt.Tx) error {
			return tx.Bucket(bucketQueue).Bucket([]byte("x")).Put(u64key(2), value)
		})
		corrupt := decode(value, &ticketRec{}) != nil
		s, err := New(path, Options{Clock: NewFakeClock(base), NoSync: true, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ops := []struct {
			name string
			run  func() error
		}{
			{"Get(b)", func() error { _, err := s.Get(ctx, "b"); return err }},
			{"Snapshot", func() error { _, err := s.Snapshot(ctx); return err }},
			{"Snapshot(x)", func() error { _, err := s.Snapshot(ctx, "x"); return err }},
			{"Renew(b)", func() error {
				_, err := s.Renew(ctx, store.Ticket{ID: "b", Limit: "x", Fence: 2}, testTTL)
				return err
			}},
			{"Release(a)", func() error { _, err := s.Release(ctx, store.Ticket{ID: "a", Fence: 1}, store.Released); return err }},
			{"Enqueue(c)", func() error { _, err := s.Enqueue(ctx, req("c", "x", 1)); return err }},
			{"SetLimit(x)", func() error { _, err := s.SetLimit(ctx, "x", 2); return err }},
			{"Release(b)", func() error { _, err := s.Release(ctx, store.Ticket{ID: "b"}, store.Cancelled); return err }},
		}
		for _, op := range ops {
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("%s with stored ticket %q panicked: %v", op.name, value, p)
					}
				}()
				err = op.run()
			}()
			if !corrupt {
				continue
			}
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("%s with undecodable stored ticket %q: err = %v, want ErrCorrupt", op.name, value, err)
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("%s: error %q does not name the file", op.name, err)
			}
		}
	})
}
