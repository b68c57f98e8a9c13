package boltstore

import (
	"context"
	"fmt"
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
