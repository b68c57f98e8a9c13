package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// kreq is a request for a ticket of key in limit (one slot when it is made).
func kreq(id, limit, key string) store.EnqueueRequest {
	r := req(id, limit, 1)
	r.Key = key
	r.Holder.Host, r.Holder.Pid, r.Holder.URL = "host-"+id, 100, "https://ci.example/runs/"+id
	return r
}

func superseding(r store.EnqueueRequest) store.EnqueueRequest { r.Supersede = true; return r }
func replacing(r store.EnqueueRequest) store.EnqueueRequest   { r.Replace = true; return r }
func atMost(r store.EnqueueRequest, n int) store.EnqueueRequest {
	r.MaxWaiting = &n
	return r
}

// wantSuperseded checks that id is gone as superseded by by, through Get and Renew.
func wantSuperseded(t *testing.T, s *Store, id, by string) {
	t.Helper()
	ctx := context.Background()
	_, err := s.Get(ctx, id)
	var se *store.SupersededError
	if !errors.Is(err, store.ErrNotFound) || !errors.As(err, &se) || se.ID != id || se.By.Ticket != by {
		t.Fatalf("Get(%s) = %v, want ErrNotFound and a SupersededError by %s", id, err, by)
	}
	if se.By.Host != "host-"+by || se.By.Pid != 100 || se.By.URL != "https://ci.example/runs/"+by {
		t.Errorf("successor of %s = %+v, want the run of %s", id, se.By, by)
	}
	_, err = s.Renew(ctx, store.Ticket{ID: id, Fence: 1}, testTTL)
	se = nil
	if !errors.Is(err, store.ErrLost) || !errors.As(err, &se) || se.By.Ticket != by {
		t.Fatalf("Renew(%s) = %v, want ErrLost and a SupersededError by %s", id, err, by)
	}
}

func eventsOf(t *testing.T, path, kind string) []store.Event {
	t.Helper()
	var out []store.Event
	for _, e := range events(t, path) {
		if e.Kind == kind {
			out = append(out, e.Event)
		}
	}
	return out
}

// Supersede (docs/leases.md §2.1 item 10) removes only the older waiting
// tickets of the same key that share a limit; a held one of the key, a
// waiter of another key, and one of the key in another limit stay.
func TestSupersedeOnlyOlderWaitersOfKeyInLimit(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	h := mustEnqueue(t, s, kreq("h", "x", "main"))
	mustEnqueue(t, s, kreq("w1", "x", "main"))
	mustEnqueue(t, s, kreq("w2", "x", "dev"))
	mustEnqueue(t, s, kreq("w3", "y", "main"))
	mustEnqueue(t, s, kreq("w4", "x", "Main")) // keys compare exactly
	m := kreq("w5", "", "main")                // of x and z: shares x
	m.Limits = []string{"z", "x"}
	mustEnqueue(t, s, m)
	n := mustEnqueue(t, s, superseding(kreq("n", "x", "main")))
	if n.State != store.Waiting || n.Key != "main" || n.Position != 3 {
		t.Fatalf("n = %s, key %q, position %d; want waiting third (behind w2, w4), key main", n.State, n.Key, n.Position)
	}
	wantSuperseded(t, s, "w1", "n")
	wantSuperseded(t, s, "w5", "n")
	for _, id := range []string{"w2", "w4"} {
		wantState(t, s, id, store.Waiting)
	}
	wantState(t, s, "w3", store.Held) // alone in y
	if got := wantState(t, s, "h", store.Held); got.Stop != nil {
		t.Errorf("held h got a stop request %+v from a supersede", got.Stop)
	}
	var got []string
	for _, e := range eventsOf(t, path, "superseded") {
		if e.By != "n" {
			t.Errorf("superseded event %+v: By %q, want n", e, e.By)
		}
		got = append(got, e.Ticket+"/"+e.Limit)
	}
	if want := []string{"w1/x", "w5/z", "w5/x"}; !slices.Equal(got, want) {
		t.Errorf("superseded events %v, want %v", got, want)
	}
	// The removed id is not created again.
	if _, err := s.Enqueue(context.Background(), kreq("w1", "x", "main")); !errors.Is(err, store.ErrRemoved) {
		t.Errorf("re-Enqueue of superseded w1: %v, want ErrRemoved", err)
	}
	mustRelease(t, s, h)
	wantState(t, s, "w2", store.Held)
}

// Two handles (two processes' stores on one file) enqueue superseding
// tickets of one key at once: each enqueue decides in its own transaction,
// so exactly one of them, the newest, is left waiting and every other one
// is superseded by a ticket that came after it.
func TestSupersedeRacingHandles(t *testing.T) {
	a, clock, path := newTestStore(t, Options{})
	b, err := New(path, Options{Clock: clock, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mustEnqueue(t, a, kreq("h", "x", "main"))
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			if _, err := s.Enqueue(context.Background(), superseding(kreq(fmt.Sprintf("r%02d", i), "x", "main"))); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	snap, err := a.Snapshot(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	var waiting []store.Ticket
	for _, tk := range snap.Tickets {
		if tk.State == store.Waiting {
			waiting = append(waiting, tk)
		}
	}
	if len(waiting) != 1 {
		var ids []string
		for _, tk := range waiting {
			ids = append(ids, tk.ID)
		}
		t.Fatalf("%d waiting tickets of key main after %d superseding enqueues, want 1: %q", len(waiting), n, ids)
	}
	last := waiting[0]
	fences := map[string]uint64{}
	for _, e := range events(t, path) {
		fences[e.Ticket] = e.Fence
	}
	sup := eventsOf(t, path, "superseded")
	if len(sup) != n-1 {
		t.Fatalf("%d superseded events, want %d", len(sup), n-1)
	}
	for i := range n {
		id := fmt.Sprintf("r%02d", i)
		if id == last.ID {
			continue
		}
		_, err := a.Get(context.Background(), id)
		var se *store.SupersededError
		if !errors.As(err, &se) {
			t.Fatalf("Get(%s) = %v, want superseded", id, err)
		}
		by, err := a.Get(context.Background(), se.By.Ticket)
		if err == nil && by.ID != last.ID {
			t.Errorf("%s superseded by %s, which is live but not the last waiter %s", id, se.By.Ticket, last.ID)
		}
	}
	for _, e := range sup {
		if fences[e.By] != 0 && fences[e.By] <= e.Fence {
			t.Errorf("%s (fence %d) superseded by older %s (fence %d)", e.Ticket, e.Fence, e.By, fences[e.By])
		}
	}
	// The last waiter's fence is the highest issued: nobody newer came.
	if last.Fence != n+1 {
		t.Errorf("last waiter %s has fence %d, want %d (the newest)", last.ID, last.Fence, n+1)
	}
}

// Replace (docs/leases.md §2.1 item 10): the held ticket of the key gets a
// stop request naming the new ticket, which waits for it even where there is
// room; the request is in the record, so it survives the store being closed
// and opened again; Renew returns it; the release lets the new one in.
func TestReplaceStopSurvivesRestart(t *testing.T) {
	s, clock, path := newTestStore(t, Options{})
	ctx := context.Background()
	h := mustEnqueue(t, s, kreq("h", "x", "deploy"))
	if _, err := s.SetLimit(ctx, "x", 2); err != nil { // room beside h: the new one still waits
		t.Fatal(err)
	}
	mustEnqueue(t, s, kreq("o", "x", "other"))
	n := mustEnqueue(t, s, replacing(kreq("n", "x", "deploy")))
	if n.State != store.Waiting || !slices.Equal(n.Replaces, []string{"h"}) {
		t.Fatalf("n = %s, replaces %q; want waiting, replacing h", n.State, n.Replaces)
	}
	want := store.Successor{Ticket: "n", Host: "host-n", Pid: 100, URL: "https://ci.example/runs/n"}
	if got := wantState(t, s, "h", store.Held); got.Stop == nil || *got.Stop != want {
		t.Fatalf("h.Stop = %+v, want %+v", got.Stop, want)
	}
	if got := wantState(t, s, "o", store.Held); got.Stop != nil {
		t.Errorf("o of another key got a stop request %+v", got.Stop)
	}
	rep := eventsOf(t, path, "replaced")
	if len(rep) != 1 || rep[0].Ticket != "h" || rep[0].By != "n" {
		t.Errorf("replaced events %+v, want one of h by n", rep)
	}
	s.Close()
	s, err := New(path, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := wantState(t, s, "h", store.Held); got.Stop == nil || *got.Stop != want {
		t.Fatalf("after reopening h.Stop = %+v, want %+v", got.Stop, want)
	}
	if got := wantState(t, s, "n", store.Waiting); !slices.Equal(got.Replaces, []string{"h"}) {
		t.Fatalf("after reopening n.Replaces = %q, want [h]", got.Replaces)
	}
	r, err := s.Renew(ctx, h, testTTL)
	if err != nil || r.Stop == nil || *r.Stop != want {
		t.Fatalf("Renew(h) = %+v, %v; want the ticket with its stop request", r.Stop, err)
	}
	// A second replace overwrites the request; both wait for h.
	mustEnqueue(t, s, replacing(kreq("n2", "x", "deploy")))
	wantSuperseded(t, s, "n", "n2")
	if got := wantState(t, s, "h", store.Held); got.Stop == nil || got.Stop.Ticket != "n2" {
		t.Fatalf("h.Stop = %+v after a second replace, want n2", got.Stop)
	}
	mustRelease(t, s, h)
	if got := wantState(t, s, "n2", store.Held); got.Stop != nil {
		t.Errorf("n2 admitted with a stop request %+v", got.Stop)
	}
}

// The bells (docs/leases.md §2.1 item 10): a superseded waiter's bell rings
// (and is deleted with its ticket); a held ticket whose holder keeps its
// bell open while the job runs is rung when it gets a stop request, and its
// bell stays.
func TestBellsRingOnSupersedeAndStop(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	ctx := context.Background()
	watch := func(id string) store.Bell {
		b, err := s.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	hb := watch("h")
	mustEnqueue(t, s, kreq("h", "x", "k"))
	if !rang(hb, time.Second) {
		t.Fatal("h's bell did not ring on its admission")
	}
	if _, err := os.Lstat(bellPath(path, "h")); err != nil {
		t.Fatalf("held h's bell after admission: %v, want kept", err)
	}
	// A later Watch of the same user sweeps old bells without a reader:
	// never the one a holder keeps open, however long its job runs.
	defer func(age time.Duration) { sweepAge = age }(sweepAge)
	sweepAge = 0
	wb := watch("w")
	sweepAge = time.Minute
	if _, err := os.Lstat(bellPath(path, "h")); err != nil {
		t.Fatalf("held h's open bell after another Watch swept: %v, want kept", err)
	}
	mustEnqueue(t, s, kreq("w", "x", "k"))
	if rang(wb, 50*time.Millisecond) || rang(hb, 50*time.Millisecond) {
		t.Fatal("a bell rang on a plain enqueue")
	}
	start := time.Now()
	mustEnqueue(t, s, superseding(kreq("n", "x", "k")))
	if !rang(wb, time.Second) {
		t.Fatal("superseded w's bell did not ring within 1s")
	}
	t.Logf("superseded waiter's bell rang %v after the enqueue began", time.Since(start))
	if rang(hb, 100*time.Millisecond) {
		t.Error("h's bell rang on a supersede, which asks it nothing")
	}
	if _, err := os.Lstat(bellPath(path, "w")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("superseded w's bell: %v, want removed", err)
	}
	start = time.Now()
	mustEnqueue(t, s, replacing(kreq("r", "x", "k")))
	if !rang(hb, time.Second) {
		t.Fatal("held h's bell did not ring within 1s of its stop request")
	}
	t.Logf("held ticket's bell rang %v after the replacing enqueue began", time.Since(start))
	if _, err := os.Lstat(bellPath(path, "h")); err != nil {
		t.Errorf("held h's bell after its stop request: %v, want kept", err)
	}
}

// MaxWaiting (docs/leases.md §2.1 item 10) counts the waiters left after
// the supersede: with one slot held and one waiter of the key, a newer run
// of the key takes the waiter's place within --max-waiting 1; a run of
// another key is refused, naming the limit and the counts; one admitted at
// once is never refused.
func TestMaxWaitingAfterSupersede(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	mustEnqueue(t, s, kreq("h", "x", "main"))
	mustEnqueue(t, s, kreq("w1", "x", "main"))
	mustEnqueue(t, s, atMost(superseding(kreq("w2", "x", "main")), 1))
	wantSuperseded(t, s, "w1", "w2")
	_, err := s.Enqueue(ctx, atMost(kreq("o", "x", "dev"), 1))
	var qf *store.QueueFullError
	if !errors.Is(err, store.ErrQueueFull) || !errors.As(err, &qf) || *qf != (store.QueueFullError{Limit: "x", Waiting: 1, Max: 1}) {
		t.Fatalf("Enqueue(o, max 1) = %v, want a QueueFullError of x: 1 waiting, at most 1", err)
	}
	if _, err := s.Get(ctx, "o"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("refused o: Get = %v, want not found", err)
	}
	if tk := mustEnqueue(t, s, atMost(kreq("y1", "y", ""), 0)); tk.State != store.Held {
		t.Errorf("y1 with max 0 on an empty limit is %s, want held", tk.State)
	}
	// Counted in each limit: z has room, x has one waiter.
	m := atMost(kreq("m", "", "dev"), 1)
	m.Limits = []string{"z", "x"}
	_, err = s.Enqueue(ctx, m)
	if !errors.As(err, &qf) || qf.Limit != "x" {
		t.Fatalf("Enqueue(m of z and x, max 1) = %v, want x full", err)
	}
}

// A refused enqueue writes nothing: not the ticket, not the supersede of the
// waiter, not the stop request of the holder, not its new limit.
func TestRefusalWritesNothing(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	ctx := context.Background()
	mustEnqueue(t, s, kreq("h", "x", "main"))
	mustEnqueue(t, s, kreq("w1", "x", "main"))
	mustEnqueue(t, s, kreq("w2", "x", "dev"))
	dump := func() []byte {
		var out bytes.Buffer
		rawView(t, path, func(tx *bolt.Tx) error {
			var walk func(b *bolt.Bucket, depth int) error
			walk = func(b *bolt.Bucket, depth int) error {
				return b.ForEach(func(k, v []byte) error {
					fmt.Fprintf(&out, "%d %q=%q\n", depth, k, v)
					if v == nil {
						return walk(b.Bucket(k), depth+1)
					}
					return nil
				})
			}
			return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
				fmt.Fprintf(&out, "bucket %q\n", name)
				return walk(b, 1)
			})
		})
		return out.Bytes()
	}
	before := dump()
	r := atMost(replacing(kreq("n", "", "main")), 1)
	r.Limits = []string{"x", "new"}
	_, err := s.Enqueue(ctx, r)
	var qf *store.QueueFullError
	if !errors.As(err, &qf) || qf.Limit != "x" || qf.Waiting != 1 {
		t.Fatalf("Enqueue = %v, want x full with 1 waiting (w2; w1 superseded)", err)
	}
	if after := dump(); !bytes.Equal(before, after) {
		t.Fatalf("a refused enqueue changed the file:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	wantState(t, s, "w1", store.Waiting)
	if got := wantState(t, s, "h", store.Held); got.Stop != nil {
		t.Errorf("refused replace left a stop request %+v", got.Stop)
	}
	// The id was never written: it is not removed either.
	if _, err := s.Get(ctx, "n"); err == nil || errors.As(err, new(*store.SupersededError)) {
		t.Errorf("Get(n) = %v, want plain not found", err)
	}
}

// A ticket of several limits supersedes in each of them and its successor
// names it: the successor is checked like a request (host printable).
func TestSupersedeRefusesUnprintableHost(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	r := superseding(kreq("n", "x", "k"))
	r.Holder.Host = "a\x1bb"
	if _, err := s.Enqueue(context.Background(), r); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Enqueue with host %q = %v, want ErrInvalid", r.Holder.Host, err)
	}
}

// A replace asks at most policy.MaxReplaces held tickets to stop, the most a
// record lists: one that would ask more is refused and writes nothing,
// rather than writing a record no reader accepts.
func TestReplaceBounded(t *testing.T) {
	ctx := context.Background()
	for _, held := range []int{policy.MaxReplaces, policy.MaxReplaces + 1} {
		s, _, _ := newTestStore(t, Options{NoSync: true})
		if _, err := s.SetLimit(ctx, "x", held); err != nil {
			t.Fatal(err)
		}
		for i := range held {
			mustEnqueue(t, s, kreq(fmt.Sprintf("h%d", i), "x", "k"))
		}
		mustEnqueue(t, s, kreq("w", "x", "k"))
		n, err := s.Enqueue(ctx, replacing(kreq("n", "x", "k")))
		if held > policy.MaxReplaces {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("a replace of %d held tickets = %v, want ErrInvalid", held, err)
			}
			wantState(t, s, "w", store.Waiting)
			if got := mustGet(t, s, "h0"); got.Stop != nil {
				t.Errorf("h0.Stop = %+v after a refused replace, want none", got.Stop)
			}
			continue
		}
		if err != nil || len(n.Replaces) != held || n.State != store.Waiting {
			t.Fatalf("a replace of %d held tickets = %d replaced, %s, %v; want all, waiting", held, len(n.Replaces), n.State, err)
		}
		mustGet(t, s, "n") // its record reads back
	}
}
