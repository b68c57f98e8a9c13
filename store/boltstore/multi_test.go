package boltstore

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// mreq is a request for a ticket of several limits and a weight; limits
// that do not exist are made with slots.
func mreq(id string, weight, slots int, limits ...string) store.EnqueueRequest {
	r := req(id, "", slots)
	r.Limits, r.Weight = limits, weight
	return r
}

func mustGet(t *testing.T, s *Store, id string) store.Ticket {
	t.Helper()
	tk, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return tk
}

func wantState(t *testing.T, s *Store, id string, want store.State) store.Ticket {
	t.Helper()
	tk := mustGet(t, s, id)
	if tk.State != want {
		t.Fatalf("ticket %s is %s, want %s", id, tk.State, want)
	}
	return tk
}

func mustRelease(t *testing.T, s *Store, tk store.Ticket) {
	t.Helper()
	if ok, err := s.Release(context.Background(), tk, store.Released); err != nil || !ok {
		t.Fatalf("Release(%s) = %v, %v", tk.ID, ok, err)
	}
}

// The closure (docs/leases.md §2.1 item 9): ticket ab of {a,b} waits behind
// a holder of a; ticket bc of {b,c} waits behind ab in b (FIFO: ab is
// older) though b and c have room. Releasing the holder of A settles A and, through ab, B and C:
// ab is admitted, and then bc too (B has two slots), in that one step.
func TestMultiClosureSettle(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetLimit(ctx, "b", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetLimit(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	holder := mustEnqueue(t, s, req("h", "a", 1))
	ab := mustEnqueue(t, s, mreq("ab", 1, 1, "a", "b"))
	bc := mustEnqueue(t, s, mreq("bc", 1, 1, "b", "c"))
	if holder.State != store.Held || ab.State != store.Waiting || bc.State != store.Waiting {
		t.Fatalf("before the release: h %s, ab %s, bc %s; want held, waiting, waiting", holder.State, ab.State, bc.State)
	}
	if ab.Position != 1 || bc.Position != 2 {
		t.Errorf("positions ab %d, bc %d; want 1 (in a) and 2 (in b, behind ab)", ab.Position, bc.Position)
	}
	mustRelease(t, s, holder)
	ab = wantState(t, s, "ab", store.Held)
	bc = wantState(t, s, "bc", store.Held)
	if got := ab.SlotsVar(); got != "a=0 b=0" {
		t.Errorf("ab holds %q, want a=0 b=0", got)
	}
	if got := bc.SlotsVar(); got != "b=1 c=0" {
		t.Errorf("bc holds %q, want b=1 c=0", got)
	}
	// Each admission is logged once in each of its limits.
	evs, err := s.Events(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	var admitted []string
	for _, e := range evs {
		if e.Kind == "admitted" {
			admitted = append(admitted, fmt.Sprintf("%s@%s:%d%v", e.Ticket, e.Limit, e.Slot, e.Limits))
		}
	}
	want := []string{"h@a:0[]", "ab@a:0[a b]", "ab@b:0[a b]", "bc@b:1[b c]", "bc@c:0[b c]"}
	if !slices.Equal(admitted, want) {
		t.Errorf("admitted events %q, want %q", admitted, want)
	}
}

// Admission is all-or-none: a ticket of {a,b} with b full stays waiting and
// takes nothing in a; a younger ticket of a alone does not pass it (strict
// FIFO across limits), and both are admitted once b frees a slot.
func TestMultiAllOrNone(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "a", 2); err != nil {
		t.Fatal(err)
	}
	hb := mustEnqueue(t, s, req("hb", "b", 1))
	ab := mustEnqueue(t, s, mreq("ab", 1, 1, "a", "b"))
	if ab.State != store.Waiting || ab.Slot != -1 || ab.Indexes != nil {
		t.Fatalf("ab = %+v, want waiting with no slot", ab)
	}
	a2 := mustEnqueue(t, s, req("a2", "a", 2))
	if a2.State != store.Waiting || a2.Position != 2 {
		t.Fatalf("a2 = %s at %d, want waiting behind ab (position 2)", a2.State, a2.Position)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range snap.Limits {
		if want := map[string]int{"a": 0, "b": 1}[l.Name]; l.Held != want {
			t.Errorf("limit %s holds %d slots, want %d", l.Name, l.Held, want)
		}
	}
	// Nothing of ab is held anywhere in the file.
	rawView(t, path, func(tx *bolt.Tx) error {
		for _, l := range []string{"a", "b"} {
			v := tx.Bucket(bucketQueue).Bucket([]byte(l)).Get(u64key(ab.Fence))
			if !strings.Contains(string(v), `"state":"waiting"`) {
				t.Errorf("ab's copy in %s: %s", l, v)
			}
		}
		return nil
	})
	mustRelease(t, s, hb)
	ab = wantState(t, s, "ab", store.Held)
	a2 = wantState(t, s, "a2", store.Held)
	if ab.SlotsVar() != "a=0 b=0" || a2.Slot != 1 {
		t.Errorf("ab holds %q, a2 slot %d; want a=0 b=0 and 1", ab.SlotsVar(), a2.Slot)
	}
}

// Weights count in slots: a ticket of weight 2 in a limit of 3 holds two
// indexes; a heavy head of weight 2 is not overtaken by a lighter ticket
// behind it; a release frees every index at once.
func TestMultiWeights(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	w2 := mustEnqueue(t, s, mreq("w2", 2, 3, "x"))
	if w2.State != store.Held || w2.Slot != 0 || !slices.Equal(w2.In("x"), []int{0, 1}) || w2.Weight != 2 {
		t.Fatalf("w2 = %+v, want held at 0,1 with weight 2", w2)
	}
	one := mustEnqueue(t, s, req("one", "x", 3))
	heavy := mustEnqueue(t, s, mreq("heavy", 2, 3, "x"))
	light := mustEnqueue(t, s, req("light", "x", 3))
	if one.State != store.Held || one.Slot != 2 || heavy.State != store.Waiting || light.State != store.Waiting {
		t.Fatalf("one %s@%d, heavy %s, light %s; want held@2, waiting, waiting", one.State, one.Slot, heavy.State, light.State)
	}
	snap, err := s.Snapshot(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if l := snap.Limits[0]; l.Held != 3 || l.Waiting != 2 {
		t.Errorf("limit x: %d held, %d waiting; want 3 slots, 2 tickets", l.Held, l.Waiting)
	}
	mustRelease(t, s, one) // one slot free: not enough for heavy; light must not pass it
	wantState(t, s, "heavy", store.Waiting)
	wantState(t, s, "light", store.Waiting)
	mustRelease(t, s, w2) // three free: heavy takes 0,1; light 2
	heavy = wantState(t, s, "heavy", store.Held)
	light = wantState(t, s, "light", store.Held)
	if !slices.Equal(heavy.In("x"), []int{0, 1}) || light.Slot != 2 {
		t.Errorf("heavy holds %v, light %d; want [0 1] and 2", heavy.In("x"), light.Slot)
	}
	evs, err := s.Events(ctx, "x", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Ticket == "heavy" && e.Kind == "admitted" && (e.Weight != 2 || !slices.Equal(e.Indexes, []int{0, 1}) || e.Limits != nil) {
			t.Errorf("heavy's admission event %+v, want weight 2, indexes [0 1], no limits", e)
		}
	}
	// A weight above a limit's size is refused, naming the limit.
	var we *store.WeightError
	if _, err := s.Enqueue(ctx, mreq("too", 4, 3, "x")); !errors.As(err, &we) || we.Limit != "x" {
		t.Errorf("weight 4 in x of 3: %v, want a WeightError", err)
	}
	if _, err := s.Enqueue(ctx, mreq("too2", 2, 1, "x", "new")); !errors.As(err, &we) || we.Limit != "new" {
		t.Errorf("weight 2 in a new limit of 1: %v, want a WeightError naming it", err)
	}
	if _, err := s.Snapshot(ctx, "new"); !errors.Is(err, store.ErrLimitNotFound) {
		t.Errorf("a refused request made its limit: %v", err)
	}
}

// Release, Cancel and Reap remove a ticket from all its limits at once, with
// one tombstone and an event in each; RemoveLimit with force removes every
// ticket naming the limit and settles the others they named.
func TestMultiRemoval(t *testing.T) {
	s, clock, path := newTestStore(t, Options{})
	ctx := context.Background()
	short := mreq("ab", 1, 1, "a", "b")
	short.TTL = time.Second
	ab := mustEnqueue(t, s, short)
	wa := mustEnqueue(t, s, req("wa", "a", 1))
	wb := mustEnqueue(t, s, req("wb", "b", 1))
	if ab.State != store.Held || wa.State != store.Waiting || wb.State != store.Waiting {
		t.Fatal("setup")
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var under []string
	for _, tk := range snap.Tickets {
		under = append(under, fmt.Sprintf("%s@%s:%d", tk.ID, tk.Limit, tk.Position))
	}
	if want := []string{"ab@a:0", "wa@a:1", "ab@b:0", "wb@b:1"}; !slices.Equal(under, want) {
		t.Errorf("snapshot lists %q, want %q", under, want)
	}
	// ab expires; a reap of b alone removes it from a too and admits the
	// waiters of both limits.
	clock.Advance(2 * time.Second)
	rm, err := s.Reap(ctx, store.ReapOptions{Limits: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rm) != 1 || rm[0].Ticket.ID != "ab" {
		t.Errorf("reap of b removed %+v, want ab alone", rm)
	}
	rawView(t, path, func(tx *bolt.Tx) error {
		for _, l := range []string{"a", "b"} {
			if v := tx.Bucket(bucketQueue).Bucket([]byte(l)).Get(u64key(ab.Fence)); v != nil {
				t.Errorf("ab still in %s after the reap", l)
			}
		}
		return nil
	})
	wantState(t, s, "wa", store.Held)
	wantState(t, s, "wb", store.Held)
	evs, err := s.Events(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	var reaped []string
	for _, e := range evs {
		if e.Kind == "reaped" {
			reaped = append(reaped, e.Ticket+"@"+e.Limit)
		}
	}
	if want := []string{"ab@a", "ab@b"}; !slices.Equal(reaped, want) {
		t.Errorf("reaped events %q, want %q", reaped, want)
	}
	rawView(t, path, func(tx *bolt.Tx) error {
		if tx.Bucket(bucketTombs).Get([]byte("ab")) == nil {
			t.Error("ab has no tombstone")
		}
		return nil
	})
	// Force-remove a limit: a ticket of {c,d} held goes entirely, and the
	// waiter of d behind it is admitted.
	cd := mustEnqueue(t, s, mreq("cd", 1, 1, "c", "d"))
	wd := mustEnqueue(t, s, req("wd", "d", 1))
	if cd.State != store.Held || wd.State != store.Waiting {
		t.Fatal("setup cd")
	}
	if err := s.RemoveLimit(ctx, "c", false); !errors.Is(err, store.ErrLimitInUse) {
		t.Errorf("RemoveLimit(c) without force: %v", err)
	}
	if err := s.RemoveLimit(ctx, "c", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "cd"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cd after its limit was removed: %v", err)
	}
	wantState(t, s, "wd", store.Held)
	// Release twice frees once.
	wd = mustGet(t, s, "wd")
	de := mustEnqueue(t, s, mreq("de", 1, 1, "d", "e"))
	mustRelease(t, s, wd)
	de = wantState(t, s, "de", store.Held)
	mustEnqueue(t, s, req("w2", "e", 1))
	mustRelease(t, s, de)
	if ok, err := s.Release(ctx, de, store.Released); ok || err != nil {
		t.Errorf("second release = %v, %v", ok, err)
	}
	wantState(t, s, "w2", store.Held)
	if _, err := s.Enqueue(ctx, mreq("de", 1, 1, "d", "e")); !errors.Is(err, store.ErrRemoved) {
		t.Errorf("re-enqueue of a released id: %v", err)
	}
}

// A waiter's renewal takes the quiet path only when a full settle would
// change nothing, over the closure of its limits: here waiter wb of b
// waits behind ab of {a,b}, and a has grown behind the store's back (no
// settle ran), so a settle of b reaches a through ab and admits both. A
// quiet check of b alone would see ab blocked by a limit it did not read.
func TestMultiRenewSettles(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "b", 2); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, s, req("ha", "a", 1))
	ab := mustEnqueue(t, s, mreq("ab", 1, 1, "a", "b"))
	wb := mustEnqueue(t, s, req("wb", "b", 2))
	if ab.State != store.Waiting || wb.State != store.Waiting {
		t.Fatal("setup")
	}
	if q, err := quietOf(t, path, s, "b"); err != nil || !q {
		t.Fatalf("quiet(b) before = %v, %v; want true", q, err)
	}
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLimits).Put([]byte("a"), encode(&limitRec{V: formatVersion, LimitRec: policy.LimitRec{Slots: 2}}))
	})
	if q, err := quietOf(t, path, s, "b"); err != nil || q {
		t.Errorf("quiet(b) with room in a = %v, %v; want false", q, err)
	}
	got, err := s.Renew(ctx, wb, testTTL)
	if err != nil || got.State != store.Held {
		t.Fatalf("Renew(wb) = %s, %v; want held", got.State, err)
	}
	wantState(t, s, "ab", store.Held)
	if q, err := quietOf(t, path, s, "b"); err != nil || !q {
		t.Errorf("quiet(b) after the settle = %v, %v; want true", q, err)
	}
}

func quietOf(t *testing.T, path string, s *Store, limits ...string) (bool, error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var q bool
	err = db.View(func(tx *bolt.Tx) error {
		x := &txn{s: s, tx: tx, now: s.now()}
		q, err = x.Settled(limits)
		return err
	})
	return q, err
}

// Copies of one ticket that differ, or a copy missing from a limit it
// names, are a corrupt store naming the file.
func TestMultiCopiesDiffer(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(b *bolt.Bucket, v []byte) error
	}{
		{"differ", func(b *bolt.Bucket, v []byte) error {
			return b.Put(u64key(1), []byte(strings.Replace(string(v), `"ttl_ns":10000000000`, `"ttl_ns":10000000001`, 1)))
		}},
		{"missing", func(b *bolt.Bucket, _ []byte) error { return b.Delete(u64key(1)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _, path := newTestStore(t, Options{})
			ctx := context.Background()
			mustEnqueue(t, s, mreq("ab", 1, 1, "a", "b"))
			rawUpdate(t, path, func(tx *bolt.Tx) error {
				b := tx.Bucket(bucketQueue).Bucket([]byte("b"))
				return c.change(b, append([]byte(nil), b.Get(u64key(1))...))
			})
			if c.name == "differ" {
				if _, err := s.Snapshot(ctx); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("Snapshot: %v, want ErrCorrupt", err)
				}
			}
			// A settle of a reads ab there and then in b (for "missing": not).
			if _, err := s.Enqueue(ctx, req("w", "a", 1)); !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("Enqueue in a: %v, want ErrCorrupt", err)
			}
			_, err := s.Release(ctx, store.Ticket{ID: "ab"}, store.Released)
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Errorf("Release: %v, want ErrCorrupt naming %s", err, path)
			}
		})
	}
}

// The meta format moves to 2 at the first write; a store written by the
// previous release (testdata/v1.db: made by slotctl at c26f0f3) opens and works.
func TestFormatUpgrade(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	mustEnqueue(t, s, req("a", "x", 1))
	rawView(t, path, func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyFormat); string(v) != "2" {
			t.Errorf("format %q, want 2", v)
		}
		return nil
	})
}

// openLegacyFile copies testdata/v1.db.gz, a store written by slotctl of
// the previous release (c26f0f3: "slotctl run --limit legacy --slots 2" four
// times: one run done, two holding, one waiting), and returns a store on it
// whose clock reads the boot its leases run in, 5s before the first expires.
func openLegacyFile(t *testing.T) (*Store, *FakeClock, string) {
	t.Helper()
	gz, err := os.Open("testdata/v1.db.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer gz.Close()
	zr, err := gzip.NewReader(gz)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "slots.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var boot string
	var first time.Duration
	rawView(t, path, func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyFormat); string(v) != "1" {
			t.Fatalf("testdata/v1.db has format %q, want 1", v)
		}
		return tx.Bucket(bucketQueue).Bucket([]byte("legacy")).ForEach(func(_, v []byte) error {
			var m map[string]any
			if err := json.Unmarshal(v, &m); err != nil {
				return err
			}
			if m["v"] != 1.0 || m["limits"] != nil {
				t.Fatalf("testdata/v1.db holds a record that is not of version 1: %s", v)
			}
			boot = m["deadline_boot"].(string)
			if d := time.Duration(m["deadline_mono_ns"].(float64)); first == 0 || d < first {
				first = d
			}
			return nil
		})
	})
	clock := NewFakeClock(Instant{Boot: boot, Mono: first - 5*time.Second, Wall: time.Now()})
	s, err := New(path, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return s, clock, path
}

// A store written by the previous release opens and works: its tickets read
// as one limit, weight 1; its events read; a release promotes its waiter;
// a ticket of two limits joins its queue; the file moves to format 2.
func TestLegacyFile(t *testing.T) {
	s, _, path := openLegacyFile(t)
	ctx := context.Background()
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Limits) != 1 || snap.Limits[0].Name != "legacy" || snap.Limits[0].Slots != 2 || snap.Limits[0].Held != 2 || snap.Limits[0].Waiting != 1 {
		t.Fatalf("limits %+v, want legacy: 2 slots, 2 held, 1 waiting", snap.Limits)
	}
	var held, waiting []store.Ticket
	for _, tk := range snap.Tickets {
		if tk.Weight != 0 || tk.Indexes != nil {
			t.Errorf("legacy ticket %+v has a weight or indexes", tk)
		}
		if got := mustGet(t, s, tk.ID); got.Limits != nil || got.Weight != 0 || got.Indexes != nil || got.Slot != tk.Slot {
			t.Errorf("legacy ticket %+v has limits, weight or indexes", got)
		}
		if tk.State == store.Held {
			held = append(held, tk)
		} else {
			waiting = append(waiting, tk)
		}
	}
	if len(held) != 2 || held[0].Slot != 0 || held[1].Slot != 1 || held[0].Holder.Label != "first" || len(waiting) != 1 || waiting[0].Holder.Label != "third" {
		t.Fatalf("tickets %+v", snap.Tickets)
	}
	evs, err := s.Events(ctx, "legacy", 10)
	if err != nil || len(evs) != 4 || evs[0].Kind != "admitted" || evs[1].Kind != "released" {
		t.Fatalf("legacy events %+v, %v; want admitted, released, admitted, admitted", evs, err)
	}
	if got, err := s.Renew(ctx, waiting[0], testTTL); err != nil || got.State != store.Waiting || got.Position != 1 {
		t.Fatalf("Renew(third) = %+v, %v", got, err)
	}
	two := mustEnqueue(t, s, mreq("two", 1, 1, "legacy", "other"))
	if two.State != store.Waiting || two.Position != 2 {
		t.Fatalf("two = %s at %d, want waiting behind third", two.State, two.Position)
	}
	mustRelease(t, s, held[0])
	third := wantState(t, s, waiting[0].ID, store.Held)
	wantState(t, s, "two", store.Waiting)
	if third.Slot != 0 {
		t.Errorf("third holds %d, want 0", third.Slot)
	}
	mustRelease(t, s, held[1])
	if two = wantState(t, s, "two", store.Held); two.SlotsVar() != "legacy=1 other=0" {
		t.Errorf("two holds %q, want legacy=1 other=0", two.SlotsVar())
	}
	rawView(t, path, func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyFormat); string(v) != "2" {
			t.Errorf("format %q after a write, want 2", v)
		}
		v := tx.Bucket(bucketQueue).Bucket([]byte("legacy")).Get(u64key(third.Fence))
		if !strings.HasPrefix(string(v), `{"v":2,`) {
			t.Errorf("third rewritten as %s, want version 2", v)
		}
		return nil
	})
	evs, err = s.Events(ctx, "", 100)
	if err != nil || len(evs) != 4+5 {
		t.Errorf("events %+v, %v; want the 4 old ones and 5 new", evs, err)
	}
}
