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

// TestDeletedFileLogsNoLost: the store's file deleted under a running job,
// whose holder then says its lease was lost. The new file has no such
// limit: nothing is logged, so that the limit, made again, has a log its
// counters tally (no "lost" it did not count).
func TestDeletedFileLogsNoLost(t *testing.T) {
	ctx := context.Background()
	s, _, path := newTestStore(t, Options{})
	a := mustEnqueue(t, s, req("aaaa", "x", 1))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Release(ctx, a, store.Lost); err != nil || ok {
		t.Fatalf("Release(lost) of a ticket the new file never had: %v, %v; want false, nil", ok, err)
	}
	mustEnqueue(t, s, req("bbbb", "x", 1))
	evs, err := s.Events(ctx, "x", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == string(store.Lost) {
			t.Errorf("x, made again, logs %s's lost from before it was: %+v", e.Ticket, e)
		}
	}
	cs, err := s.Counts(ctx, "x")
	if err != nil || len(cs) != 1 || cs[0].Lost != 0 || cs[0].Admitted != 1 {
		t.Errorf("counts of x: %+v, %v; want its one admission", cs, err)
	}
}
