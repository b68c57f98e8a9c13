package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/store"
)

func mustResize(t *testing.T, s *Store, tk store.Ticket, w int) store.Ticket {
	t.Helper()
	got, err := s.Resize(context.Background(), tk, w)
	if err != nil {
		t.Fatalf("Resize(%s, %d): %v", tk.ID, w, err)
	}
	return got
}

// A ticket of one limit grows from weight 1 (stored without limits, weight
// or indexes) to 3, taking the lowest free indexes, and shrinks back to 1,
// stored again as a ticket of one limit and weight 1 is; each change logs a
// "resized" event with the new weight, and a restart (a new handle on the
// file) reads what was written.
func TestResizeOneLimit(t *testing.T) {
	s, clock, path := newTestStore(t, Options{})
	ctx := context.Background()
	a := mustEnqueue(t, s, req("a", "cpu", 6))
	b := mustEnqueue(t, s, req("b", "cpu", 6))
	mustRelease(t, s, a) // b holds 1; 0 is free
	b = mustResize(t, s, b, 3)
	if b.Weight != 3 || b.Slot != 0 || !slices.Equal(b.In("cpu"), []int{0, 1, 2}) {
		t.Fatalf("grown: weight %d, slot %d, indexes %v; want 3, 0, [0 1 2]", b.Weight, b.Slot, b.In("cpu"))
	}
	s2, err := New(path, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s2, "b"); got.Weight != 3 || !slices.Equal(got.In("cpu"), []int{0, 1, 2}) {
		t.Errorf("after a restart: weight %d, indexes %v; want 3, [0 1 2]", got.Weight, got.In("cpu"))
	}
	snap, err := s2.Snapshot(ctx, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Limits[0].Held != 3 {
		t.Errorf("snapshot holds %d slots, want 3", snap.Limits[0].Held)
	}
	b = mustResize(t, s2, b, 1)
	if b.Weight != 0 || b.Slot != 0 || b.Indexes != nil || b.Limits != nil {
		t.Errorf("shrunk to 1: %+v, want weight 0, slot 0, no indexes, no limits", b)
	}
	rawView(t, path, func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketQueue).Bucket([]byte("cpu")).Get(u64key(b.Fence))
		if bytes.Contains(v, []byte(`"weight"`)) || bytes.Contains(v, []byte(`"indexes"`)) {
			t.Errorf("a ticket of one limit and weight 1 stored as %s: want no weight, no indexes", v)
		}
		return nil
	})
	var sizes []int
	for _, e := range events(t, path) {
		if e.Kind == store.Resized {
			sizes = append(sizes, e.Weight)
		}
	}
	if !slices.Equal(sizes, []int{3, 0}) {
		t.Errorf("resized events of weights %v, want [3 0] (0: one slot)", sizes)
	}
	// Nothing to change: no event.
	mustResize(t, s2, b, 1)
	if n := len(events(t, path)); n != 5 {
		t.Errorf("%d events, want 5 (2 admitted, released, 2 resized, nothing for a resize to the same weight)", n)
	}
}

// A shrink frees the ticket's highest indexes and admits, in the same
// step, the waiters it makes room for.
func TestResizeShrinkPromotes(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	r := req("big", "cpu", 4)
	r.Weight = 4
	big := mustEnqueue(t, s, r)
	w := mustEnqueue(t, s, req("w", "cpu", 4))
	r = req("w2", "cpu", 4)
	r.Weight = 2
	w2 := mustEnqueue(t, s, r)
	if big.State != store.Held || w.State != store.Waiting || w2.State != store.Waiting {
		t.Fatalf("big %s, w %s, w2 %s; want held, waiting, waiting", big.State, w.State, w2.State)
	}
	big = mustResize(t, s, big, 2) // frees 2 and 3: w takes 2; w2 (2 slots) does not fit
	if !slices.Equal(big.In("cpu"), []int{0, 1}) {
		t.Errorf("big holds %v after the shrink, want [0 1]", big.In("cpu"))
	}
	if got := wantState(t, s, "w", store.Held); got.Slot != 2 {
		t.Errorf("w holds slot %d, want 2", got.Slot)
	}
	wantState(t, s, "w2", store.Waiting)
	// A growth waits for the waiter: nothing changes, and no error.
	if got := mustResize(t, s, big, 4); got.Weight != 2 {
		t.Errorf("grown past a waiter to weight %d, want 2", got.Weight)
	}
	mustResize(t, s, big, 1) // frees 1: with 3 free, w2 takes 1 and 3
	if got := wantState(t, s, "w2", store.Held); !slices.Equal(got.In("cpu"), []int{1, 3}) {
		t.Errorf("w2 holds %v, want [1 3]", got.In("cpu"))
	}
}

// A growth takes what is free in every limit of the ticket, never more than
// a limit holds, and rewrites every copy of the ticket the same.
func TestResizeGrowMulti(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "a", 4); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetLimit(ctx, "b", 3); err != nil {
		t.Fatal(err)
	}
	hb := mustEnqueue(t, s, req("hb", "b", 3))
	ab := mustEnqueue(t, s, mreq("ab", 1, 1, "a", "b"))
	ab = mustResize(t, s, ab, 4) // a has 3 more, b 1 more
	if ab.Weight != 2 || ab.SlotsVar() != "a=0,1 b=1,2" {
		t.Errorf("grown to weight %d holding %q, want 2 holding a=0,1 b=1,2", ab.Weight, ab.SlotsVar())
	}
	mustRelease(t, s, hb)
	ab = mustResize(t, s, ab, 10) // capped by b's 3 slots
	if ab.Weight != 3 || ab.SlotsVar() != "a=0,1,2 b=0,1,2" {
		t.Errorf("grown to weight %d holding %q, want 3 holding a=0,1,2 b=0,1,2", ab.Weight, ab.SlotsVar())
	}
	ab = mustResize(t, s, ab, 1)
	if ab.Weight != 0 || ab.SlotsVar() != "a=0 b=0" {
		t.Errorf("shrunk to weight %d holding %q, want 0 holding a=0 b=0", ab.Weight, ab.SlotsVar())
	}
	rawView(t, path, func(tx *bolt.Tx) error {
		q := tx.Bucket(bucketQueue)
		va, vb := q.Bucket([]byte("a")).Get(u64key(ab.Fence)), q.Bucket([]byte("b")).Get(u64key(ab.Fence))
		if !bytes.Equal(va, vb) {
			t.Errorf("copies differ:\n%s\n%s", va, vb)
		}
		return nil
	})
	if _, err := s.Snapshot(ctx); err != nil {
		t.Errorf("Snapshot after the resizes: %v", err)
	}
}

// Only the holder's live ticket can be resized: gone, another fence or
// expired is ErrLost (and changes nothing); waiting, or a weight below 1,
// ErrInvalid.
func TestResizeRefused(t *testing.T) {
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	h := mustEnqueue(t, s, req("h", "cpu", 1))
	w := mustEnqueue(t, s, req("w", "cpu", 1))
	for _, c := range []struct {
		tk   store.Ticket
		w    int
		want error
	}{
		{h, 0, store.ErrInvalid},
		{h, -1, store.ErrInvalid},
		{w, 2, store.ErrInvalid},
		{func() store.Ticket { o := h; o.Fence++; return o }(), 2, store.ErrLost},
		{func() store.Ticket { o := h; o.ID = "nobody"; return o }(), 2, store.ErrLost},
	} {
		if _, err := s.Resize(ctx, c.tk, c.w); !errors.Is(err, c.want) {
			t.Errorf("Resize(%s fence %d, %d) = %v, want %v", c.tk.ID, c.tk.Fence, c.w, err, c.want)
		}
	}
	clock.Advance(testTTL + time.Second)
	if _, err := s.Resize(ctx, h, 1); !errors.Is(err, store.ErrLost) {
		t.Errorf("Resize of an expired ticket = %v, want ErrLost", err)
	}
	mustRelease(t, s, h)
	if _, err := s.Resize(ctx, h, 1); !errors.Is(err, store.ErrLost) {
		t.Errorf("Resize of a released ticket = %v, want ErrLost", err)
	}
}

// BenchmarkResize is a jobserver's cycle on a limit of 16 slots with 8
// other holders: grow by one, shrink by one (two transactions). A jobserver
// resizes when its build takes or returns tokens, so one cycle should cost
// about what an enqueue and release do (BenchmarkEnqueueRelease).
//
//	go test ./store/boltstore -run '^$' -bench 'Resize|EnqueueRelease$' -count 5
func BenchmarkResize(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(fmt.Sprintf("nosync=%v", noSync), func(b *testing.B) {
			s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{NoSync: noSync})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for i := range 8 {
				if _, err := s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("o%d", i), Limit: "x", Slots: 16, TTL: time.Hour}); err != nil {
					b.Fatal(err)
				}
			}
			t, err := s.Enqueue(ctx, store.EnqueueRequest{ID: "j", Limit: "x", Slots: 16, TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if t, err = s.Resize(ctx, t, 2); err != nil || t.Weighs() != 2 {
					b.Fatal(t.Weighs(), err)
				}
				if t, err = s.Resize(ctx, t, 1); err != nil || t.Weighs() != 1 {
					b.Fatal(t.Weighs(), err)
				}
			}
		})
	}
}

// A resize that changes nothing (the weight it has; a growth behind a
// waiter; a growth in a full limit) commits nothing: the file is the same
// bytes after it. A jobserver asking for more finds that most of the time.
func TestResizeNoChangeWritesNothing(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	r := req("a", "cpu", 2)
	a := mustEnqueue(t, s, r)
	b := mustEnqueue(t, s, req("b", "cpu", 2))
	r = req("w", "cpu", 2)
	r.Weight = 2
	mustEnqueue(t, s, r)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tk   store.Ticket
		w    int
		what string
	}{{a, 1, "the weight it has"}, {a, 2, "a growth behind a waiter and in a full limit"}, {b, 3, "a growth in a full limit, past its size"}} {
		if got := mustResize(t, s, c.tk, c.w); got.Weighs() != 1 {
			t.Fatalf("%s: weight %d, want 1", c.what, got.Weighs())
		}
		after, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(before, after) {
			t.Fatalf("%s: the file changed", c.what)
		}
	}
	mustResize(t, s, mustGet(t, s, "a"), 1)
	mustRelease(t, s, a) // a change commits: the waiter is admitted
	after, _ := os.ReadFile(path)
	if bytes.Equal(before, after) {
		t.Fatal("the file is the same after a release: the comparison proves nothing")
	}
}
