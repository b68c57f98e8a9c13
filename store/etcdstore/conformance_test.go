package etcdstore_test

import (
	"context"
	"fmt"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
	"github.com/slotctl/slotctl/store/storetest"
)

// The store contract's suite runs, unchanged, against a real etcd server in
// this process. The server's clock is real, so time moves by sleeping; the
// cases run in parallel, each under its own key prefix, and Advance waits
// for the server to revoke what expired (the test server checks every 10ms,
// a production one every 500ms).
//
// etcd grants leases in whole seconds, 2s at least; the suite's tickets
// have 5s. Two cases look at a lease ε = TTL/100 = 50ms before its deadline
// and need ε to cover a few round trips, which on a loaded two-core machine
// can take tens of milliseconds: they run in TestConformanceTight, without
// the others, kept awake while they sleep.
var tight = map[string]bool{"RenewAfterScanWins": true, "LiveHolderKeptUntilTTL": true}

func TestConformance(t *testing.T) {
	runConformance(t, conformanceTTL(), func(c string) bool { return !tight[c] })
}

func TestConformanceTight(t *testing.T) {
	runConformance(t, conformanceTTL(), func(c string) bool { return tight[c] })
}

// conformanceTTL is the tickets' TTL: the suite's cases take several round
// trips between a ticket's renewals, each several times slower under the
// race detector, and a case's own steps must not outlast its leases.
func conformanceTTL() time.Duration {
	if raceEnabled {
		return 10 * time.Second
	}
	return 5 * time.Second
}

func runConformance(t *testing.T, ttl time.Duration, want func(string) bool) {
	if testing.Short() {
		t.Skip("the etcd conformance suite sleeps through lease TTLs; skipped with -short")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	var n atomic.Int32
	newBackend := func(t *testing.T, judge store.Judge) storetest.Backend {
		if c := path.Base(t.Name()); !want(c) {
			t.Skipf("case %s runs in the other conformance test (see conformance_test.go)", c)
		}
		t.Parallel()
		base := etcdstore.Options{
			Endpoints: []string{srv.Endpoint},
			Prefix:    fmt.Sprintf("/conformance/%d", n.Add(1)),
			Dead:      judge,
		}
		var mu sync.Mutex
		var opened []*etcdstore.Store
		open := func(o etcdstore.Options) *etcdstore.Store {
			st, err := etcdstore.New(o)
			if err != nil {
				t.Fatalf("etcdstore.New: %v", err)
			}
			mu.Lock()
			opened = append(opened, st)
			mu.Unlock()
			return st
		}
		t.Cleanup(func() {
			mu.Lock()
			defer mu.Unlock()
			for _, st := range opened {
				st.Close()
			}
		})
		first := open(base)
		advance := srv.Advance
		if tight[path.Base(t.Name())] {
			// Alone on the machine, and looking within ε of deadlines: keep
			// the server and this client awake while time passes.
			advance = func(d time.Duration) {
				srv.AdvanceWarm(d, func() { _, _ = first.Get(context.Background(), "warm") })
			}
		}
		return storetest.Backend{
			Store:   first,
			Advance: advance,
			Reopen:  func() store.Store { return open(base) },
			Skewed: func(d time.Duration) store.Store {
				return open(etcdstore.WithSkew(base, d, first))
			},
		}
	}
	storetest.Run(t, storetest.Harness{
		TTL:          ttl,
		New:          func(t *testing.T) storetest.Backend { return newBackend(t, nil) },
		NewWithJudge: newBackend,
	})
}
