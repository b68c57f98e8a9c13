package boltstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
)

// TestQuietWaiters: a waiter not yet in line renews nothing and is never
// judged late; the settle that brings it into line gives it a whole lease
// and rings its bell; an admission gives a quiet waiter a whole lease.
func TestQuietWaiters(t *testing.T) {
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	h := mustEnqueue(t, s, req("h", "x", 1))
	w1 := mustEnqueue(t, s, req("w1", "x", 1))
	w2 := mustEnqueue(t, s, req("w2", "x", 1))
	w3 := mustEnqueue(t, s, req("w3", "x", 1))
	if w1.Quiet || !w2.Quiet || !w3.Quiet {
		t.Fatalf("quiet: w1 %v w2 %v w3 %v, want false true true (w1 is in line)", w1.Quiet, w2.Quiet, w3.Quiet)
	}
	b2, err := s.Watch(ctx, "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()

	// Three TTLs go by; only h and w1 renew.
	for range 6 {
		clock.Advance(testTTL / 2)
		var err error
		if h, err = s.Renew(ctx, h, testTTL); err != nil {
			t.Fatal(err)
		}
		if w1, err = s.Renew(ctx, w1, testTTL); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Reap(ctx, store.ReapOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w2", "w3"} {
		got, err := s.Get(ctx, id)
		if err != nil {
			t.Fatalf("Get %s after 3 TTLs without a renewal: %v; a quiet waiter is never judged late", id, err)
		}
		if !got.Quiet || got.Expired() {
			t.Errorf("%s: quiet %v, expired %v; want quiet, not expired", id, got.Quiet, got.Expired())
		}
	}

	// w1 leaves: w2 comes into line, with a whole lease, and is woken.
	if _, err := s.Cancel(ctx, w1); err != nil {
		t.Fatal(err)
	}
	if !rang(b2, time.Second) {
		t.Errorf("w2's bell did not ring as it came into line")
	}
	got, err := s.Get(ctx, "w2")
	if err != nil {
		t.Fatal(err)
	}
	if got.Quiet || got.Remaining != testTTL {
		t.Errorf("w2 in line: quiet %v, remaining %v; want false, %v", got.Quiet, got.Remaining, testTTL)
	}
	if got, _ := s.Get(ctx, "w3"); !got.Quiet {
		t.Errorf("w3 is no longer quiet, but is not in line")
	}

	// w2 renews late: accepted, as its ticket is still here (it holds no slot).
	clock.Advance(testTTL + time.Second)
	if _, err := s.Renew(ctx, got, testTTL); err != nil {
		t.Errorf("a waiting ticket's late renewal, its ticket still stored: %v", err)
	}

	// h's slot frees: w2 is admitted (it renews), and w3 comes into line.
	if _, err := s.Release(ctx, h, store.Released); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, "w3"); got.Quiet || got.Remaining != testTTL {
		t.Errorf("w3 in line: quiet %v, remaining %v; want false, %v", got.Quiet, got.Remaining, testTTL)
	}
}

// TestQuietWaiterAdmittedWithAWholeLease: a quiet waiter admitted by a
// release (several slots freed at once) holds with a whole lease from its
// admission, though it never renewed.
func TestQuietWaiterAdmittedWithAWholeLease(t *testing.T) {
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	h := mustEnqueue(t, s, store.EnqueueRequest{ID: "h", Limit: "x", Slots: 2, Weight: 2, TTL: testTTL, Holder: store.Holder{Host: "h", Pid: 42}})
	mustEnqueue(t, s, req("w1", "x", 2))
	mustEnqueue(t, s, req("w2", "x", 2))
	w3 := mustEnqueue(t, s, req("w3", "x", 2))
	if !w3.Quiet {
		t.Fatalf("w3 is not quiet behind two waiters in line")
	}
	var err error
	for range 6 {
		// h renews in time; w1 and w2 do not, and nobody vouches for them.
		clock.Advance(testTTL / 2)
		if h, err = s.Renew(ctx, h, testTTL); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Release(ctx, h, store.Released); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "w3")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.Held || got.Remaining != testTTL {
		t.Errorf("w3: %s, remaining %v; want held with a whole lease (%v)", got.State, got.Remaining, testTTL)
	}
	for _, id := range []string{"w1", "w2"} {
		if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get %s, in line and a TTL late with nobody vouching: %v, want ErrNotFound", id, err)
		}
	}
}

// TestLateWaiterKeptWhileAlive: a waiter in line whose renewals are late
// (a busy machine) keeps its place while its supervisor provably lives, and
// loses it once nothing vouches for it; a late holder is never kept so.
func TestLateWaiterKeptWhileAlive(t *testing.T) {
	alive := map[string]bool{"w": true, "h": true}
	s, clock, _ := newTestStore(t, Options{Alive: func(t store.Ticket) bool { return alive[t.ID] }})
	ctx := context.Background()
	h := mustEnqueue(t, s, req("h", "x", 1))
	mustEnqueue(t, s, req("w", "x", 1))
	clock.Advance(testTTL + time.Second)
	if _, err := s.Reap(ctx, store.ReapOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "h"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get h, a holder a TTL late: %v, want ErrNotFound (only the TTL judges a holder)", err)
	}
	got, err := s.Get(ctx, "w")
	if err != nil {
		t.Fatalf("Get w, late but provably alive: %v", err)
	}
	if got.State != store.Held {
		t.Errorf("w is %s after h's removal, want held", got.State)
	}
	_ = h
	if got.Remaining != testTTL {
		t.Errorf("w admitted late: remaining %v, want a whole lease (%v)", got.Remaining, testTTL)
	}
	// w2 is in line and nothing vouches for it; w3 behind it is quiet.
	mustEnqueue(t, s, req("w2", "x", 1))
	mustEnqueue(t, s, req("w3", "x", 1))
	clock.Advance(testTTL + time.Second)
	if _, err := s.Renew(ctx, got, testTTL); err == nil {
		t.Errorf("a held ticket renewed a TTL late: want ErrLost")
	}
	if _, err := s.Get(ctx, "w2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get w2, in line, a TTL late, nothing vouching: %v, want ErrNotFound", err)
	}
	if got, err := s.Get(ctx, "w3"); err != nil || got.State != store.Held {
		t.Errorf("Get w3: %s, %v; want held: it was quiet, then admitted by the settle that removed w and w2", got.State, err)
	}
}

// TestQuietWaiterOfAPreviousBoot: quiet is a rule of this boot; a waiter of
// a previous boot is dead, quiet or not: its late renewal is refused and a
// settle removes it.
func TestQuietWaiterOfAPreviousBoot(t *testing.T) {
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	mustEnqueue(t, s, req("h", "x", 1))
	mustEnqueue(t, s, req("w1", "x", 1))
	w2 := mustEnqueue(t, s, req("w2", "x", 1))
	if !w2.Quiet {
		t.Fatal("w2 is not quiet")
	}
	clock.Set(Instant{Boot: "b2", Mono: 5 * time.Second, Wall: time.Now().Add(time.Minute)})
	if _, err := s.Renew(ctx, w2, testTTL); !errors.Is(err, store.ErrLost) {
		t.Errorf("Renew of a quiet waiter of a previous boot: %v, want ErrLost", err)
	}
	if _, err := s.Reap(ctx, store.ReapOptions{}); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Tickets) != 0 {
		t.Errorf("%d tickets of a previous boot left after a reap, want 0", len(snap.Tickets))
	}
}

// TestRateSpentWakesTheNextHead: the admission that spends a limit's rate
// rings the waiter it leaves first, so that it waits for the window to
// open (gate.Entry.Expiry) rather than for a renewal; a quiet waiter
// renews nothing at all.
func TestRateSpentWakesTheNextHead(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "x", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetPolicy(ctx, "x", store.PolicyChange{Rate: &store.Rate{N: 2, Per: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, s, req("first", "x", 5))
	mustEnqueue(t, s, req("w1", "x", 5)) // spends the rate: admitted, nobody left waiting to ring
	w2 := mustEnqueue(t, s, req("w2", "x", 5))
	if w2.State != store.Waiting {
		t.Fatalf("w2 %s, want waiting: the rate is spent", w2.State)
	}
	// Raise the rate by one: w2 is admitted and spends it again, leaving w3 first.
	w3 := mustEnqueue(t, s, req("w3", "x", 5))
	b3, err := s.Watch(ctx, "w3")
	if err != nil {
		t.Fatal(err)
	}
	defer b3.Close()
	if _, err := s.SetPolicy(ctx, "x", store.PolicyChange{Rate: &store.Rate{N: 3, Per: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "w2"); err != nil || got.State != store.Held {
		t.Fatalf("w2: %v %v, want held once the rate allows a third", got.State, err)
	}
	if !rang(b3, time.Second) {
		t.Errorf("w3's bell did not ring when w2's admission spent the rate and left it first")
	}
	if got, err := s.Get(ctx, w3.ID); err != nil || got.State != store.Waiting || got.Position != 1 {
		t.Fatalf("w3: %v position %d %v, want first waiting", got.State, got.Position, err)
	}
}
