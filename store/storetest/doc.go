// Package storetest is the conformance suite of the [store.Store] contract.
//
// Every backend runs the same cases, unchanged, from its own test file:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			TTL: 10 * time.Second,
//			New: func(t *testing.T) storetest.Backend {
//				clock := boltstore.NewFakeClock(...)
//				st, err := boltstore.New(filepath.Join(t.TempDir(), "slots.db"), boltstore.Options{Clock: clock})
//				...
//				return storetest.Backend{Store: st, Advance: clock.Advance, Reopen: ...}
//			},
//		})
//	}
//
// Time only moves through [Backend.Advance]: a fake clock for the embedded
// bbolt store, a real sleep for a store whose clock is a server's (etcd). The
// suite never reads the wall clock to judge a lease, and all leases use
// [Harness.TTL].
//
// Each case is one subtest, named after the rule it checks (SPEC §4.1, §4.2
// and LEASES.md), and each fails on a store that breaks that rule: FIFO
// promotion, held <= slots, unique slot indexes, one slot freed per removal,
// compare-and-delete release, monotone expiry, tombstones for removed ids,
// sweeps on Enqueue, renewal of waiters, resize and pause, limit removal,
// snapshots, watches, input validation, durability across a reopen, and
// concurrent use.
//
// The suite's own tests (mem_test.go) run it against an in-memory reference
// store, which must pass, and against that store with one planted bug at a
// time (a counter beside the tickets, no tombstones, renewal of expired
// leases, a check-then-act race, ...), each of which must fail its case.
//
// The tickets the suite writes name a holder on another host
// ("storetest.invalid") with no boot id, so no backend can prove them dead:
// they leave only by release or by expiry.
package storetest
