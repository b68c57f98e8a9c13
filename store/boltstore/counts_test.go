package boltstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

func mustCounts(t testing.TB, s *Store, limit string) store.Counts {
	t.Helper()
	cs, err := s.Counts(context.Background(), limit)
	if err != nil {
		t.Fatalf("Counts(%q): %v", limit, err)
	}
	if len(cs) != 1 || cs[0].Limit != limit {
		t.Fatalf("Counts(%q) = %+v, want the counts of %q", limit, cs, limit)
	}
	return cs[0]
}

// Past store.MaxEvents events the log forgets its oldest, and the counts
// still count every run, never going back, through a reopen too
// (docs/leases.md §2.8). Real runs are logged first, then the log is filled up behind them
// straight in the file (5,000 real runs take ~15s), then more real runs
// push the first ones out of the log. The conformance case
// CountsSurvivePruning does it with real runs only on the stores that log
// fast enough.
func TestCountsSurvivePruning(t *testing.T) {
	s, clock, path := newTestStore(t, Options{NoSync: true})
	ctx := context.Background()
	run := func(i int) {
		tk := mustEnqueue(t, s, req(fmt.Sprintf("p%d", i), "p", 1))
		clock.Advance(time.Second)
		if _, err := s.Release(ctx, tk, store.Released); err != nil {
			t.Fatal(err)
		}
	}
	const first, filler, then = 200, store.MaxEvents - 100, 200
	for i := range first {
		run(i)
	}
	prev := mustCounts(t, s, "p")
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		b, meta := tx.Bucket(bucketEvents), tx.Bucket(bucketMeta)
		n, err := keyU64(meta.Get(keyEventSeq))
		if err != nil {
			return err
		}
		for range filler {
			n++
			e := eventRec{V: formatVersion, Event: store.Event{Seq: n, Kind: "admitted", Limit: "other", Ticket: fmt.Sprintf("f%d", n), Fence: n}}
			if err := b.Put(u64key(n), encode(&e)); err != nil {
				return err
			}
		}
		return meta.Put(keyEventSeq, u64key(n))
	})
	for i := range then {
		run(first + i)
		if i%50 == 49 {
			cur := mustCounts(t, s, "p")
			if cur.Admitted < prev.Admitted || cur.Released < prev.Released || cur.Hold.Count < prev.Hold.Count || cur.Hold.Sum < prev.Hold.Sum {
				t.Fatalf("after %d runs, counts %+v went back from %+v", first+i+1, cur, prev)
			}
			prev = cur
		}
	}
	evs := events(t, path)
	if len(evs) != store.MaxEvents {
		t.Fatalf("the log holds %d events, want the newest %d", len(evs), store.MaxEvents)
	}
	for _, e := range evs {
		if e.Ticket == "p0" {
			t.Fatalf("the first run's events are still in the log: %+v", e.Event)
		}
	}
	want := uint64(first + then)
	s2, err := New(path, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for _, st := range []*Store{s, s2} {
		c := mustCounts(t, st, "p")
		if c.Admitted != want || c.Released != want || c.Wait.Count != want || c.Hold.Count != want {
			t.Fatalf("counts after %d runs: %+v, want %d admitted, released, waits and holds", want, c, want)
		}
		if c.Hold.Sum != float64(want) || c.Hold.Buckets[1] != want { // each held 1s: the bucket (0.1, 1]
			t.Fatalf("hold histogram after %d runs of 1s: %+v", want, c.Hold)
		}
	}
}

// A store of the previous release (testdata/v1.db.gz) opens with zero
// counts, and counts from its first write on.
func TestCountsLegacyFile(t *testing.T) {
	s, clock, path := openLegacyFile(t)
	ctx := context.Background()
	if c := mustCounts(t, s, "legacy"); c.Admitted != 0 || c.Released != 0 || c.Wait.Count != 0 || c.Hold.Count != 0 || c.Wait.Buckets != nil {
		t.Fatalf("counts of a store of the previous format: %+v, want zero", c)
	}
	snap, err := s.Snapshot(ctx, "legacy")
	if err != nil {
		t.Fatal(err)
	}
	var held store.Ticket
	for _, tk := range snap.Tickets {
		if tk.State == store.Held {
			held = tk
			break
		}
	}
	clock.Advance(time.Second)
	if ok, err := s.Release(ctx, held, store.Released); err != nil || !ok {
		t.Fatalf("Release of legacy ticket %s: %v, %v", held.ID, ok, err)
	}
	c := mustCounts(t, s, "legacy")
	if c.Released != 1 || c.Hold.Count != 1 || c.Admitted != 1 || c.Wait.Count != 1 {
		t.Fatalf("counts after releasing a legacy holder (its waiter admitted): %+v, want 1 released, 1 hold, 1 admitted", c)
	}
	rawView(t, path, func(tx *bolt.Tx) error {
		if tx.Bucket(bucketCounts) == nil {
			t.Errorf("no %q bucket after the first write", bucketCounts)
		}
		return nil
	})
}

// A counts record the store could not have written is ErrCorrupt naming
// the file, for Counts and for the write that would count in it: never
// read as zero and overwritten.
func TestCountsCorrupt(t *testing.T) {
	for name, v := range map[string]string{
		"undecodable":          `{"v":2,"limit":"x","admitted":`,
		"buckets do not add":   `{"v":2,"limit":"x","admitted":1,"wait":{"buckets":[2,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"count":1,"sum":0}}`,
		"waits not admissions": `{"v":2,"limit":"x","admitted":3,"wait":{"buckets":[1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"count":1,"sum":0}}`,
		"another limit":        `{"v":2,"limit":"y"}`,
		"version 1":            `{"v":1,"limit":"x"}`,
		"negative sum":         `{"v":2,"limit":"x","hold":{"buckets":[1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"count":1,"sum":-1}}`,
	} {
		t.Run(name, func(t *testing.T) {
			s, _, path := newTestStore(t, Options{NoSync: true})
			ctx := context.Background()
			if _, err := s.SetLimit(ctx, "x", 1); err != nil {
				t.Fatal(err)
			}
			rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketCounts).Put([]byte("x"), []byte(v)) })
			_, err := s.Counts(ctx, "x")
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Counts of a hostile record: %v, want ErrCorrupt naming %s", err, path)
			}
			if _, err := s.Enqueue(ctx, req("a", "x", 1)); !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Enqueue counting into a hostile record: %v, want ErrCorrupt", err)
			}
			rawView(t, path, func(tx *bolt.Tx) error {
				if got := string(tx.Bucket(bucketCounts).Get([]byte("x"))); got != v {
					t.Errorf("the hostile record was overwritten: %s", got)
				}
				return nil
			})
		})
	}
}

// An event is counted in the transaction that logs it: when the write
// fails after the event was logged (here: the second limit of a ticket is
// corrupt), neither the event nor its count lands.
func TestCountsRolledBackWithEvent(t *testing.T) {
	s, _, path := newTestStore(t, Options{NoSync: true})
	ctx := context.Background()
	a := mustEnqueue(t, s, req("a", "x", 1))
	before := mustCounts(t, s, "x")
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketLimits).Put([]byte("x"), []byte(`{"v":9}`)) })
	if _, err := s.Release(ctx, a, store.Released); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Release with a corrupt limit record: %v, want ErrCorrupt", err)
	}
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLimits).Put([]byte("x"), encode(&limitRec{V: formatVersion, LimitRec: policy.LimitRec{Slots: 1}}))
	})
	after := mustCounts(t, s, "x")
	if after.Released != before.Released || after.Hold.Count != before.Hold.Count {
		t.Fatalf("counts %+v after a failed release, want %+v as before", after, before)
	}
	if _, err := s.Release(ctx, a, store.Released); err != nil {
		t.Fatal(err)
	}
	if c := mustCounts(t, s, "x"); c.Released != 1 || c.Hold.Count != 1 {
		t.Fatalf("counts after the release: %+v, want 1 released, 1 hold", c)
	}
}

// Counts left without their limit (written by hand: removing a limit
// deletes its counts) do not pass to a limit made under that name: it
// counts from zero, made by SetLimit or by an enqueue.
func TestCountsOfNewLimitStartAtZero(t *testing.T) {
	s, _, path := newTestStore(t, Options{NoSync: true})
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "x", 1); err != nil { // creates the file and its buckets
		t.Fatal(err)
	}
	left := `{"v":2,"limit":"%s","admitted":7,"released":7,"wait":{"buckets":[7,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"count":7,"sum":0}}`
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		for _, n := range []string{"set", "enq"} {
			if err := tx.Bucket(bucketCounts).Put([]byte(n), fmt.Appendf(nil, left, n)); err != nil {
				return err
			}
		}
		return nil
	})
	if _, err := s.SetLimit(ctx, "set", 1); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, s, req("a", "enq", 1))
	if c := mustCounts(t, s, "set"); c.Admitted != 0 || c.Released != 0 {
		t.Errorf("counts of a limit made by SetLimit over counts left behind: %+v, want zero", c)
	}
	if c := mustCounts(t, s, "enq"); c.Admitted != 1 || c.Released != 0 {
		t.Errorf("counts of a limit made by an enqueue over counts left behind: %+v, want its one admission", c)
	}
}
