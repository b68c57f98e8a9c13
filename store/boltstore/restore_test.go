package boltstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/slotctl/slotctl/store"
)

// TestRestoredCopyStopsItsHolders: the store's file replaced by an older
// copy (a restored backup) while jobs run. A job admitted since the copy
// was taken finds its ticket waiting again there: its next renewal is lost
// (its job must stop; the store no longer counts its slot) and the ticket
// goes, rather than wait to be admitted with nobody behind it. The copy's
// stale holder leaves at its deadline, and the queue goes on.
func TestRestoredCopyStopsItsHolders(t *testing.T) {
	ctx := context.Background()
	s, clock, path := newTestStore(t, Options{})
	a := mustEnqueue(t, s, req("aaaa", "x", 1))
	b := mustEnqueue(t, s, req("bbbb", "x", 1))
	if a.State != store.Held || b.State != store.Waiting {
		t.Fatalf("a %s, b %s; want held, waiting", a.State, b.State)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(backup, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, a, store.Released); err != nil {
		t.Fatal(err)
	}
	b, err = s.Renew(ctx, b, testTTL)
	if err != nil || b.State != store.Held {
		t.Fatalf("b after a's release: %s, %v; want held", b.State, err)
	}

	// The restore: the copy renamed over the file, as a restore tool does.
	if err := os.Rename(backup, path); err != nil {
		t.Fatal(err)
	}
	_, err = s.Renew(ctx, b, testTTL)
	if !errors.Is(err, store.ErrLost) {
		t.Fatalf("renewal of b, held, waiting in the restored copy: %v; want ErrLost", err)
	}
	if _, err := s.Get(ctx, b.ID); !errors.Is(err, store.ErrRemoved) && !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of b after its lost renewal: %v; want it gone", err)
	}
	clock.Advance(testTTL / 2)
	c := mustEnqueue(t, s, req("cccc", "x", 1))
	if c.State != store.Waiting {
		t.Fatalf("c beside the copy's held a: %s; want waiting", c.State)
	}
	clock.Advance(testTTL/2 + 1)
	if _, err := s.Reap(ctx, store.ReapOptions{}); err != nil {
		t.Fatal(err)
	}
	if c, err = s.Get(ctx, c.ID); err != nil || c.State != store.Held {
		t.Errorf("c once the copy's a expired: %s, %v; want held", c.State, err)
	}
}
