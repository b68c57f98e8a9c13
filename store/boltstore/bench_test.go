package boltstore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
)

// BenchmarkEnqueueRelease is the uncontended path of one slotctl run: one
// enqueue that admits at once, one release.
func BenchmarkEnqueueRelease(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(fmt.Sprintf("nosync=%v", noSync), func(b *testing.B) {
			s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{NoSync: noSync})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				t, err := s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("t%d", i), Limit: "x", Slots: 1, TTL: 30 * time.Second})
				if err != nil || t.State != store.Held {
					b.Fatal(t.State, err)
				}
				if _, err := s.Release(ctx, t, store.Released); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEnqueueRelease2Limits is BenchmarkEnqueueRelease for a ticket of
// two limits (docs/leases.md §2.1 item 9): its one run should cost about
// what a run on one limit does (within 1.2x).
func BenchmarkEnqueueRelease2Limits(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(fmt.Sprintf("nosync=%v", noSync), func(b *testing.B) {
			s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{NoSync: noSync})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				t, err := s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("t%d", i), Limits: []string{"x", "y"}, Slots: 1, TTL: 30 * time.Second})
				if err != nil || t.State != store.Held {
					b.Fatal(t.State, err)
				}
				if _, err := s.Release(ctx, t, store.Released); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEnqueuePromoteRelease2Limits is the handoff of a two-limit mutex:
// BenchmarkEnqueuePromoteRelease with every ticket in limits x and y of one slot.
func BenchmarkEnqueuePromoteRelease2Limits(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(fmt.Sprintf("nosync=%v", noSync), func(b *testing.B) {
			s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{NoSync: noSync})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			two := []string{"x", "y"}
			holder, err := s.Enqueue(ctx, store.EnqueueRequest{ID: "h", Limits: two, Slots: 1, TTL: 30 * time.Second})
			if err != nil || holder.State != store.Held {
				b.Fatal(holder.State, err)
			}
			for i := 0; b.Loop(); i++ {
				w, err := s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("w%d", i), Limits: two, Slots: 1, TTL: 30 * time.Second})
				if err != nil || w.State != store.Waiting {
					b.Fatal(w.State, err)
				}
				if ok, err := s.Release(ctx, holder, store.Released); err != nil || !ok {
					b.Fatal(ok, err)
				}
				holder = w
			}
		})
	}
}

// BenchmarkRenew is one renewal of a held ticket.
func BenchmarkRenew(b *testing.B) {
	s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	t, err := s.Enqueue(ctx, store.EnqueueRequest{ID: "r", Limit: "x", Slots: 1, TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.Renew(ctx, t, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetView is one read transaction, what a waiter's poll costs.
func BenchmarkGetView(b *testing.B) {
	s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	t, err := s.Enqueue(ctx, store.EnqueueRequest{ID: "g", Limit: "x", Slots: 1, TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.Get(ctx, t.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnqueuePromoteRelease is the contended path: a limit of one slot
// is held; each iteration enqueues a waiter and releases the holder, which
// promotes that waiter in the same transaction (it holds for the next round).
func BenchmarkEnqueuePromoteRelease(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(fmt.Sprintf("nosync=%v", noSync), func(b *testing.B) {
			s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{NoSync: noSync})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			holder, err := s.Enqueue(ctx, store.EnqueueRequest{ID: "h", Limit: "x", Slots: 1, TTL: 30 * time.Second})
			if err != nil || holder.State != store.Held {
				b.Fatal(holder.State, err)
			}
			for i := 0; b.Loop(); i++ {
				w, err := s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("w%d", i), Limit: "x", Slots: 1, TTL: 30 * time.Second})
				if err != nil || w.State != store.Waiting {
					b.Fatal(w.State, err)
				}
				if ok, err := s.Release(ctx, holder, store.Released); err != nil || !ok {
					b.Fatal(ok, err)
				}
				holder = w
			}
		})
	}
}

// bench10k fills a store with 10,000 tickets across 100 limits of 2 slots
// (2 held and 98 waiting each, a one-hour TTL), written by the fake clock,
// and returns that clock. NoSync: building it is not what is measured.
func bench10k(b *testing.B, path string) *FakeClock {
	b.Helper()
	clock := NewFakeClock(Instant{Boot: "bench-boot", Mono: time.Hour, Wall: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	s, err := New(path, Options{Clock: clock, NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	for l := range 100 {
		limit := fmt.Sprintf("limit-%03d", l)
		for i := range 100 {
			_, err := s.Enqueue(ctx, store.EnqueueRequest{
				ID: fmt.Sprintf("%08x%024x", l*100+i, l*7919+i), Limit: limit, Slots: 2, TTL: time.Hour,
				Holder: store.Holder{Host: "build-host-07", Pid: 10000 + l*100 + i, User: "ci",
					Argv: []string{"make", "-C", "/srv/ci/" + limit, "-j4", fmt.Sprintf("job=%d", i)}},
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Logf("built a store of 10,000 tickets in %s", time.Since(start).Round(time.Millisecond))
	return clock
}

func copyFile(b *testing.B, from, to string) {
	b.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkReap10kExpired is one reap of every limit (what `slotctl reap`
// does) on a store whose 10,000 tickets (100 limits) have all expired: one
// transaction, fsync on, that removes them all (with events and tombstones).
// Each iteration starts from a fresh copy of the store; copying is not timed.
func BenchmarkReap10kExpired(b *testing.B) {
	dir := b.TempDir()
	golden := filepath.Join(dir, "golden.db")
	clock := bench10k(b, golden)
	clock.Advance(2 * time.Hour) // every lease (1h) has run out
	ctx := context.Background()
	path := filepath.Join(dir, "slots.db")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		os.Remove(path)
		copyFile(b, golden, path)
		s, err := New(path, Options{Clock: clock})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		removed, err := s.Reap(ctx, store.ReapOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if len(removed) != 10000 {
			b.Fatalf("reaped %d tickets, want 10000", len(removed))
		}
	}
}

// BenchmarkSnapshot10k is one Snapshot of all limits (what `slotctl ls`
// reads) on 10,000 live tickets across 100 limits.
func BenchmarkSnapshot10k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "slots.db")
	clock := bench10k(b, path)
	s, err := New(path, Options{Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		snap, err := s.Snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(snap.Tickets) != 10000 || len(snap.Limits) != 100 {
			b.Fatalf("snapshot has %d tickets in %d limits, want 10000 in 100", len(snap.Tickets), len(snap.Limits))
		}
	}
}

// BenchmarkHeads10k is store.Heads of all limits (what slotctl metrics
// reads) on BenchmarkSnapshot10k's store: the held tickets and first
// waiter of each limit decoded, the other waiters counted.
func BenchmarkHeads10k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "slots.db")
	clock := bench10k(b, path)
	s, err := New(path, Options{Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		snap, err := store.Heads(ctx, s)
		if err != nil {
			b.Fatal(err)
		}
		if len(snap.Limits) != 100 || snap.Limits[0].Waiting+snap.Limits[0].Held != 100 {
			b.Fatalf("heads of %d limits, the first with %+v", len(snap.Limits), snap.Limits[0])
		}
	}
}

// BenchmarkDecodeTicket is one stored ticket decoded and checked as a
// queue's reader decodes it (decodeTicket: the fast reader), against
// encoding/json alone on the same bytes.
func BenchmarkDecodeTicket(b *testing.B) {
	r := seedTicket()
	r.Holder.Argv = []string{"make", "-C", "/srv/ci/limit-001", "-j4", "job=12"}
	uid := uint32(1000)
	r.BellUID = &uid
	v := encode(r)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var t ticketRec
			if err := decodeTicket(v, &t); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var t ticketRec
			if err := json.Unmarshal(v, &t); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkWaiterQueue is what one queued waiter costs the store per wake-up,
// by queue length: its poll (Get) and its renewal (Renew, which sweeps the
// limit), for the last of n waiters behind one holder. fsync on.
func BenchmarkWaiterQueue(b *testing.B) {
	for _, n := range []int{1, 200} {
		s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		var last store.Ticket
		for i := range n + 1 {
			last, err = s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("q%04d", i), Limit: "x", Slots: 1, TTL: time.Hour,
				Holder: store.Holder{Host: "build-host-07", Pid: 10000 + i, User: "ci", Argv: []string{"make", "-j4", fmt.Sprintf("job=%d", i)}}})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("get/waiters=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if t, err := s.Get(ctx, last.ID); err != nil || t.Position != n {
					b.Fatal(t.Position, err)
				}
			}
		})
		b.Run(fmt.Sprintf("renew/waiters=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Renew(ctx, last, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAdmit1000 is the admission step under each order: a limit of
// one slot with 1,000 waiters; each iteration releases the holder (whose
// settle admits the next waiter by the limit's order) and enqueues one
// more waiter, so that 1,000 always wait. fsync on.
func BenchmarkAdmit1000(b *testing.B) {
	for _, pol := range []store.Policy{{}, {Order: store.ByPriority}, {Order: store.Fair}} {
		b.Run(pol.String(), func(b *testing.B) {
			s, err := New(filepath.Join(b.TempDir(), "slots.db"), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			enqueue := func(i int) store.Ticket {
				t, err := s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("w%d", i), Limit: "x", Slots: 1, TTL: time.Hour,
					Priority: i % 7, Share: fmt.Sprint("user", i%13), Holder: store.Holder{Host: "h", Pid: 1000 + i, User: "ci"}})
				if err != nil {
					b.Fatal(err)
				}
				return t
			}
			holder := enqueue(0)
			if _, err := s.SetPolicy(ctx, "x", store.PolicyChange{Order: &pol.Order}); err != nil {
				b.Fatal(err)
			}
			for i := 1; i <= 1000; i++ {
				enqueue(i)
			}
			for i := 1001; b.Loop(); i++ {
				if ok, err := s.Release(ctx, holder, store.Released); err != nil || !ok {
					b.Fatal(ok, err)
				}
				enqueue(i)
				b.StopTimer() // finding the new holder is not the admission
				snap, err := store.Heads(ctx, s, "x")
				if err != nil || len(snap.Tickets) == 0 || snap.Tickets[0].State != store.Held {
					b.Fatal(snap.Tickets, err)
				}
				holder = snap.Tickets[0]
				b.StartTimer()
			}
		})
	}
}
