package pgstore_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/pgstore"
	"github.com/slotctl/slotctl/store/policy"
	"github.com/slotctl/slotctl/store/storetest"
)

// newBackend opens a store on a new database whose clock the test moves:
// every handle reads a clock that stands still but for Advance (plus its
// own skew), so that what a case asserts about leases does not depend on
// how fast a loaded machine runs it. TestServerClockJudges checks the
// server's own clock.
func newBackend(t *testing.T, judge store.Judge) storetest.Backend {
	return newBackendAt(t, judge, testURL(t))
}

func newBackendAt(t *testing.T, judge store.Judge, url string) storetest.Backend {
	var offset atomic.Int64
	base := time.Now()
	open := func(skew time.Duration) store.Store {
		st, err := pgstore.Open(context.Background(), url, pgstore.Options{Judge: judge,
			Now: func() time.Time { return base.Add(time.Duration(offset.Load()) + skew) }})
		if err != nil {
			t.Fatalf("pgstore.Open: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	return storetest.Backend{
		Store:   open(0),
		Advance: func(d time.Duration) { offset.Add(int64(d)) },
		Reopen:  func() store.Store { return open(0) },
		Skewed:  open,
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		TTL:          10 * time.Second,
		New:          func(t *testing.T) storetest.Backend { return newBackend(t, nil) },
		NewWithJudge: newBackend,
		NewLegacy:    newLegacy,
		// 10,000 steps take half a minute here: a long-suite case.
		ManyEvents: longtest.Enabled(),
	})
}

// newLegacy is Harness.NewLegacy: the fixture written as rows of tickets
// of one limit and weight 1 in their short form (no limits, weight or
// indexes), its leases running from the store's now.
func newLegacy(t *testing.T) storetest.Backend {
	be := newBackend(t, nil)
	ctx := context.Background()
	// The first step makes the tables; the fixture goes in beside them.
	if _, err := be.Store.SetLimit(ctx, storetest.LegacyLimit, 2); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, be.Store.String())
	snap, err := be.Store.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := snap.Now // the store's clock
	for i, id := range storetest.LegacyIDs {
		r := policy.Rec{ID: id, Limit: storetest.LegacyLimit, State: store.Held, Fence: uint64(i + 1), Slot: i,
			TTL: 10 * time.Second, DeadlineBoot: "postgres", DeadlineMono: time.Duration(now.UnixNano()) + 10*time.Second,
			Created: now, Admitted: now, Holder: storetest.LegacyHolder}
		if i == 2 {
			r.State, r.Slot, r.Admitted = store.Waiting, -1, time.Time{}
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO slotctl_tickets (fence, id, limits, rec) VALUES ($1, $2, $3, $4::jsonb)`,
			int64(r.Fence), id, []string{r.Limit}, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `SELECT setval('slotctl_fence', $1)`, len(storetest.LegacyIDs)); err != nil {
		t.Fatal(err)
	}
	return be
}
