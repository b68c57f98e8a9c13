package boltstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
	"github.com/slotctl/slotctl/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		TTL: 10 * time.Second,
		New: func(t *testing.T) storetest.Backend {
			path := filepath.Join(t.TempDir(), "slots.db")
			clock := boltstore.NewFakeClock(boltstore.Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()})
			open := func() store.Store {
				st, err := boltstore.New(path, boltstore.Options{Clock: clock, Timeout: 5 * time.Second})
				if err != nil {
					t.Fatalf("boltstore.New(%s): %v", path, err)
				}
				return st
			}
			return storetest.Backend{Store: open(), Advance: clock.Advance, Reopen: open}
		},
	})
}
