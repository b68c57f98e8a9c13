package boltstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

var fuzzWall = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

func seedTicket() *ticketRec {
	return &ticketRec{V: formatVersion, Rec: policy.Rec{ID: "b", Limit: "x", State: store.Waiting, Fence: 2, Slot: -1, TTL: testTTL,
		DeadlineBoot: "b1", DeadlineMono: time.Hour + testTTL, Created: fuzzWall,
		Holder: store.Holder{Host: "h", User: "u", BootID: "b1", PidNS: 4026531836, Pid: 42, PidStart: 99,
			Argv: []string{"make", "-j", "it's"}, Label: "build"}}}
}

func seedRecords() []record {
	held := seedTicket()
	held.State, held.Slot, held.Admitted, held.Renewed = store.Held, 0, fuzzWall, fuzzWall
	multi := seedTicket() // a ticket of two limits and weight 2, waiting and held
	multi.Limits, multi.Weight = []string{"x", "y"}, 2
	multiHeld := *multi
	multiHeld.State, multiHeld.Slot, multiHeld.Admitted = store.Held, 1, fuzzWall
	multiHeld.Indexes = map[string][]int{"x": {1, 2}, "y": {0, 3}}
	legacy := seedTicket() // as the previous release wrote it
	legacy.V, legacy.State, legacy.Slot = legacyVersion, store.Held, 0
	by := store.Successor{Ticket: "n", Host: "h2", Pid: 43, URL: `https://ci.example/o/r/actions/runs/7?q="x"`}
	stopped := *held // a held ticket of a key that a newer run asked to stop
	stopped.Key, stopped.Stop, stopped.Holder.URL = `main "quoted"`, &by, "https://ci.example/o/r/actions/runs/6"
	replacing := seedTicket() // the newer run, waiting for it
	replacing.ID, replacing.Fence, replacing.Key, replacing.Replaces = "n", 3, stopped.Key, []string{"b"}
	return []record{
		seedTicket(),
		held,
		multi,
		&multiHeld,
		legacy,
		&stopped,
		replacing,
		&limitRec{V: formatVersion, LimitRec: policy.LimitRec{Slots: 2, Created: fuzzWall}},
		&idRec{V: formatVersion, Limit: "x", Fence: 2},
		&tombRec{V: formatVersion, Tomb: policy.Tomb{Reason: store.Cancelled, Wall: fuzzWall, Boot: "b1", Mono: time.Hour}},
		&tombRec{V: formatVersion, Tomb: policy.Tomb{Reason: store.Superseded, Wall: fuzzWall, Boot: "b1", Mono: time.Hour, By: &by}},
		&eventRec{V: formatVersion, Event: store.Event{Seq: 11, Time: fuzzWall, Kind: "superseded", Limit: "x", Ticket: "b", Fence: 2,
			Slot: -1, By: "n", Host: "h", Pid: 42, Command: "make"}},
		&eventRec{V: formatVersion, Event: store.Event{Seq: 12, Time: fuzzWall, Kind: "replaced", Limit: "x", Ticket: "b", Fence: 2,
			Slot: 0, By: "n", Host: "h", Pid: 42, Command: "make"}},
		&eventRec{V: formatVersion, Event: store.Event{Seq: 9, Time: fuzzWall, Kind: "reaped", Limit: "x", Ticket: "b", Fence: 2,
			Slot: 0, Host: "h", Pid: 42, Command: "make", Evidence: "expired 3s ago"}},
		&eventRec{V: formatVersion, Event: store.Event{Seq: 10, Time: fuzzWall, Kind: "admitted", Limit: "y", Ticket: "b", Fence: 2,
			Slot: 0, Limits: []string{"x", "y"}, Weight: 2, Indexes: []int{0, 3}, Host: "h", Pid: 42, Command: "make"}},
		&eventRec{V: legacyVersion, Event: store.Event{Seq: 9, Time: fuzzWall, Kind: "released", Limit: "x", Ticket: "b", Fence: 2}},
		&eventRec{V: formatVersion, Event: store.Event{Seq: 13, Time: fuzzWall, Kind: "busy", Limit: "x", Ticket: "b", Fence: 2,
			Slot: 0, Host: "h", Pid: 42, Command: "make", Held: 3 * time.Second}},
		seedCounts(),
		&countsRec{V: formatVersion, Counts: store.Counts{Limit: "y"}},
	}
}

// seedCounts is a limit's counts after a few events of every kind.
func seedCounts() *countsRec {
	c := store.Counts{Limit: "x"}
	for i, kind := range []string{"admitted", "admitted", "released", "busy", "superseded", "replaced", "reaped", "lost", "cancelled", "force-released"} {
		c.Add(store.Event{Kind: kind, Waited: time.Duration(i) * time.Minute, Held: time.Duration(i) * time.Hour})
	}
	return &countsRec{V: formatVersion, Counts: c}
}

var extraSeeds = []string{
	`{"v":2,"limit":"x","admitted":1,"wait":{"buckets":[1],"count":1,"sum":0}}`,
	`{"v":2,"limit":"x","admitted":2,"wait":{"buckets":[1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1],"count":1,"sum":1}}`,
	`{"v":2,"limit":"x","hold":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1],"count":1,"sum":-1}}`,
	`{"v":1,"limit":"x"}`, `{"v":2,"limit":"../x"}`, `{"v":2,"limit":"x","admitted":-1}`,
	`{"v":2,"ticket":"b","limit":"x","waited":-1}`, `{"v":1,"ticket":"b","limit":"x","held":5}`,
	``, `null`, `{}`, `[]`, `{"v":1}`, `{"v":2}`, `{"v":1.5}`, `{"v":"1"}`, `{"v":1,"v":2}`,
	`{"v":1,"fence":-1}`, `{"v":1,"ttl_ns":1e30}`, `{"v":1,"created":"10000-01-01T00:00:00Z"}`,
	`{"v":1,"created":"0000-01-01T00:00:00+23:59"}`, `{"v":1,"holder":{"argv":["\xff"]}}`,
	`{"v":1,"state":"zombie","slot":-7}`, "\x00\xff", `{"v":1}garbage`, `{"v":3}`,
	`{"v":2,"id":"b","limit":"x","limits":["x","x"],"weight":1,"state":"waiting","fence":2,"slot":-1,"ttl_ns":1}`,
	`{"v":2,"id":"b","limit":"x","limits":["x"],"weight":2,"state":"held","fence":2,"slot":0,"indexes":{"x":[0,0]},"ttl_ns":1}`,
	`{"v":2,"id":"b","limit":"x","limits":["x"],"weight":1,"state":"held","fence":2,"slot":0,"indexes":{"x":[0],"y":[0]},"ttl_ns":1}`,
	`{"v":2,"id":"b","limit":"x","limits":["x"],"weight":1,"state":"held","fence":2,"slot":0,"indexes":{"x":null},"ttl_ns":1}`,
	`{"v":2,"id":"b","limit":"x","limits":["x"],"weight":65536,"state":"waiting","fence":2,"slot":-1,"indexes":{},"ttl_ns":1}`,
	`{"v":1,"id":"b","limit":"x","limits":["x"],"state":"waiting","fence":2,"slot":-1,"ttl_ns":1}`,
	`{"v":2,"ticket":"b","limit":"x","limits":["y"],"weight":1,"indexes":[70000]}`,
	`{"v":2,"id":"b","limit":"x","state":"waiting","fence":2,"slot":-1,"ttl_ns":1,"holder":{"url":"a\u0007"},"key":"k\n"}`,
	`{"v":2,"id":"b","limit":"x","state":"waiting","fence":2,"slot":-1,"ttl_ns":1,"stop":{"ticket":"n"},"replaces":["b","../x"]}`,
	`{"v":2,"id":"b","limit":"x","state":"held","fence":2,"slot":0,"ttl_ns":1,"stop":{"ticket":"","host":"\u001b[2J","pid":-1}}`,
	`{"v":2,"id":"b","limit":"x","state":"waiting","fence":2,"slot":-1,"ttl_ns":1,"replaces":[]}`,
	`{"v":1,"id":"b","limit":"x","state":"waiting","fence":2,"slot":-1,"ttl_ns":1,"key":"k"}`,
	`{"v":2,"reason":"released","by":{"ticket":"n"}}`, `{"v":2,"reason":"superseded","by":{"ticket":"a/b"}}`,
	`{"v":2,"ticket":"b","limit":"x","by":"../n"}`, `{"v":1,"ticket":"b","limit":"x","by":"n"}`,
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
	if tr, ok := r.(*ticketRec); ok {
		// Whatever its version, a decoded ticket is what a request could
		// have made: 1..16 limits, the first Limit, a weight, and indexes iff held.
		names, w := tr.Names(), tr.Weighs()
		if store.CheckLimits(names) != nil || names[0] != tr.Limit || w > store.MaxSlots {
			t.Fatalf("decode(%q) accepted limits %q, weight %d", b, names, w)
		}
		if tr.State != store.Held && tr.Indexes != nil {
			t.Fatalf("decode(%q) accepted a %s ticket with indexes %v", b, tr.State, tr.Indexes)
		}
		for _, name := range names {
			if ix := tr.In(name); tr.State == store.Held && (len(ix) != w || !slices.IsSorted(ix) || ix[0] < 0 || ix[len(ix)-1] >= store.MaxSlots) {
				t.Fatalf("decode(%q) accepted indexes %v in %s of weight %d", b, ix, name, w)
			}
		}
	}
	if cr, ok := r.(*countsRec); ok {
		// Decoded counts are what Add could have made: buckets adding up to
		// each histogram's count, one wait per admission.
		if err := cr.Counts.Check(); err != nil || cr.Wait.Count != cr.Admitted {
			t.Fatalf("decode(%q) accepted counts %+v (Check: %v)", b, cr.Counts, err)
		}
	}
	if er, ok := r.(*eventRec); ok && (er.Waited < 0 || er.Held < 0) {
		t.Fatalf("decode(%q) accepted an event that waited %v, held %v", b, er.Waited, er.Held)
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
		for kind := range uint8(5) {
			f.Add(kind, encode(r))
		}
	}
	for _, s := range extraSeeds {
		f.Add(uint8(0), []byte(s))
		f.Add(uint8(3), []byte(s))
	}
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		var r record
		switch kind % 5 {
		case 0:
			r = &limitRec{}
		case 1:
			r = &idRec{}
		case 2:
			r = &tombRec{}
		case 3:
			r = &eventRec{}
		default:
			r = &countsRec{}
		}
		checkDecode(t, b, r)
	})
}

// FuzzStoredTicket writes arbitrary bytes as the value of waiting ticket "b"
// (fence 2) of limits x and y, behind held ticket "a" (fence 1) of x,
// straight into the file: its copy in x, and with both its copy in y too (a
// member who writes both copies alike). Then it runs every operation that
// reads it: none may panic, and when the value does not decode each fails
// with ErrCorrupt naming the file.
func FuzzStoredTicket(f *testing.F) {
	tmpl := filepath.Join(f.TempDir(), "template.db")
	clock := newClock()
	base := clock.Now()
	s, err := New(tmpl, Options{Clock: clock, NoSync: true})
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Enqueue(ctx, req("a", "x", 1)); err != nil {
		f.Fatal(err)
	}
	b := req("b", "", 1)
	b.Limits = []string{"x", "y"}
	if _, err := s.Enqueue(ctx, b); err != nil {
		f.Fatal(err)
	}
	template, err := os.ReadFile(tmpl)
	if err != nil {
		f.Fatal(err)
	}
	rawView(f, tmpl, func(tx *bolt.Tx) error {
		v := append([]byte(nil), tx.Bucket(bucketQueue).Bucket([]byte("x")).Get(u64key(2))...)
		f.Add(v, true)
		f.Add(v, false)
		return nil
	})
	for _, r := range seedRecords()[:7] {
		f.Add(encode(r), true)
		f.Add(encode(r), false)
	}
	for _, s := range extraSeeds {
		f.Add([]byte(s), true)
	}
	other := seedTicket()
	other.Limit, other.Limits = "y", []string{"y"} // decodes, but sits in the wrong limit
	f.Add(encode(other), false)
	other = seedTicket()
	other.ID = "zz" // decodes, but is not the id that points to it
	f.Add(encode(other), true)
	other = seedTicket()
	other.Fence = 7
	f.Add(encode(other), true)
	other = seedTicket()
	other.Limits = []string{"x", "y", "z"} // decodes, but has no copy in z
	f.Add(encode(other), true)
	other = seedTicket()
	other.Limits, other.Weight = []string{"x", "y"}, 2 // another weight than its copy in y
	f.Add(encode(other), false)

	f.Fuzz(func(t *testing.T, value []byte, both bool) {
		path := filepath.Join(t.TempDir(), "slots.db")
		if err := os.WriteFile(path, template, 0o600); err != nil {
			t.Fatal(err)
		}
		rawUpdate(t, path, func(tx *bolt.Tx) error {
			if both {
				if err := tx.Bucket(bucketQueue).Bucket([]byte("y")).Put(u64key(2), value); err != nil {
					return err
				}
			}
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
			{"Heads", func() error { _, err := store.Heads(ctx, s); return err }}, // b is the first waiter of both limits: read whole
			{"Renew(b)", func() error {
				_, err := s.Renew(ctx, store.Ticket{ID: "b", Limit: "x", Fence: 2}, testTTL)
				return err
			}},
			{"Reap(y)", func() error {
				_, err := s.Reap(ctx, store.ReapOptions{Limits: []string{"y"}, DryRun: true})
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
			if !corrupt || op.name == "Reap(y)" && !both {
				continue // y's own copy of b is intact: a read of y alone need not see x's
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
