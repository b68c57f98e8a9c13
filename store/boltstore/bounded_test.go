package boltstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
	"github.com/slotctl/slotctl/store/policy"
	"github.com/slotctl/slotctl/store/storetest"
)

// bounded is a bbolt backend whose steps have room for only a few
// removals or admissions (policy.Bounded), as etcd's have for one
// transaction's 128 operations: every settle, reap, forced limit removal
// and supersede of the conformance suite is then split over several
// steps, and must answer as the unbounded store does.
type bounded struct {
	policy.Backend
	room int
}

func (b bounded) Update(ctx context.Context, fn func(policy.Tx) error) error {
	return b.Backend.Update(ctx, func(tx policy.Tx) error { return fn(&boundedTx{Tx: tx, room: b.room}) })
}

func (b bounded) Events(ctx context.Context, limit string, n int) ([]store.Event, error) {
	er, ok := b.Backend.(policy.EventReader)
	if !ok {
		return nil, fmt.Errorf("%s keeps no events", b.Backend)
	}
	return er.Events(ctx, limit, n)
}

// boundedTx counts the tickets a step writes; past room it has no room
// for another.
type boundedTx struct {
	policy.Tx
	room, used int
}

func (t *boundedTx) Fits(policy.Rec) bool { return t.used < t.room }

func (t *boundedTx) Put(r policy.Rec) error {
	t.used++
	return t.Tx.Put(r)
}

func (t *boundedTx) Delete(r policy.Rec) error {
	t.used++
	return t.Tx.Delete(r)
}

// boundedOf is st (a bbolt store) with steps of room for two tickets'
// writes.
func boundedOf(st store.Store, judge store.Judge) store.Store {
	return policy.New(bounded{Backend: st.(*boltstore.Store).Backend(), room: 2}, policy.Options{Judge: judge})
}

// boundedBackend is b with its stores bounded.
func boundedBackend(b storetest.Backend, judge store.Judge) storetest.Backend {
	reopen, skewed := b.Reopen, b.Skewed
	b.Store = boundedOf(b.Store, judge)
	b.Reopen = func() store.Store { return boundedOf(reopen(), judge) }
	b.Skewed = func(d time.Duration) store.Store { return boundedOf(skewed(d), judge) }
	return b
}

// TestConformanceBounded runs the conformance suite on bbolt with steps
// of room for two tickets' writes.
func TestConformanceBounded(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		TTL:          10 * time.Second,
		New:          func(t *testing.T) storetest.Backend { return boundedBackend(newBackend(t, nil), nil) },
		NewWithJudge: func(t *testing.T, j store.Judge) storetest.Backend { return boundedBackend(newBackend(t, j), j) },
		NewLegacy:    func(t *testing.T) storetest.Backend { return boundedBackend(newLegacy(t), nil) },
	})
}
