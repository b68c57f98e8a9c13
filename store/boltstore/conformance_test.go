package boltstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
	"github.com/slotctl/slotctl/store/storetest"
)

// skewedClock reads another clock plus an offset: the store's clock as a
// second process, whose reading is ahead, sees it.
type skewedClock struct {
	c boltstore.Clock
	d time.Duration
}

func (k skewedClock) Now() boltstore.Instant {
	i := k.c.Now()
	i.Mono += k.d
	i.Wall = i.Wall.Add(k.d)
	return i
}

func newBackend(t *testing.T, judge store.Judge) storetest.Backend {
	path := filepath.Join(t.TempDir(), "slots.db")
	clock := boltstore.NewFakeClock(boltstore.Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()})
	open := func(c boltstore.Clock) store.Store {
		st, err := boltstore.New(path, boltstore.Options{Clock: c, Timeout: 5 * time.Second, Dead: judge})
		if err != nil {
			t.Fatalf("boltstore.New(%s): %v", path, err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	return storetest.Backend{
		Store:   open(clock),
		Advance: clock.Advance,
		Reopen:  func() store.Store { return open(clock) },
		Skewed:  func(d time.Duration) store.Store { return open(skewedClock{clock, d}) },
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		TTL:          10 * time.Second,
		New:          func(t *testing.T) storetest.Backend { return newBackend(t, nil) },
		NewWithJudge: newBackend,
	})
}
