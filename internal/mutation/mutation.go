// Package mutation names the known lease bugs (LEASES.md, LEASES-CATALOGUE.md
// §1) that a test can switch back on in the real code, so that the
// simulation in gate/sim can prove it catches each of them.
//
// Test-only: production code never sets a Set, and a nil Set has no bug
// switched on. The package is internal, so no other module can use it.
package mutation

import (
	"fmt"
	"slices"
	"strings"
)

// A Bug is one known defect that the design prevents.
type Bug string

// The store-side bugs live at their real location in store/boltstore, the
// supervisor-side ones in gate/holder (Config.Mutations), the protocol that
// slotctl run and the simulation both run.
const (
	// BlindReap: a reaper frees a slot for every ticket its earlier scan
	// listed, whether or not this reap deleted it, so two reapers free one
	// expired ticket twice (A2, duplicate reapers).
	BlindReap Bug = "blind-reap"
	// ReleaseCounter: a release that finds no ticket still frees a slot,
	// like a decrement of a counter beside the tickets (A4, A6).
	ReleaseCounter Bug = "release-counter"
	// ReleaseNoCompare: a release that finds its ticket gone removes
	// whoever holds its slot now: delete by slot, not compare-and-delete of
	// the caller's own ticket (A10, A3).
	ReleaseNoCompare Bug = "release-no-compare"
	// RenewExpired: a renewal of an expired ticket that no sweep removed yet
	// is accepted: expiry is not monotone (A7).
	RenewExpired Bug = "renew-expired"
	// StaleVerdict: a sweep judges expiry on the deadlines its store handle
	// read in an earlier scan, not on the record in the reaping transaction,
	// so a renewal that landed in between is not seen (A1, A8).
	StaleVerdict Bug = "stale-verdict"
	// NoTombstone: a removed ticket id is not remembered, so a retried or
	// late create brings it back (C5, S7).
	NoTombstone Bug = "no-tombstone"
	// WallClock: deadlines are written and judged on the wall clock, not on
	// the boot-time clock (D2).
	WallClock Bug = "wall-clock"

	// WaiterNotRenewed: the supervisor renews only once admitted, and counts
	// its lease from the admission it observed (C4).
	WaiterNotRenewed Bug = "waiter-not-renewed"
	// ReleaseBeforeExit: on a terminating signal the supervisor releases the
	// ticket first and stops the child after (C7).
	ReleaseBeforeExit Bug = "release-before-exit"
)

// All lists every Bug, store-side first.
func All() []Bug {
	return []Bug{BlindReap, ReleaseCounter, ReleaseNoCompare, RenewExpired, StaleVerdict, NoTombstone, WallClock,
		WaiterNotRenewed, ReleaseBeforeExit}
}

// InStore reports whether b is switched in the store (else in the holder).
func (b Bug) InStore() bool { return b != WaiterNotRenewed && b != ReleaseBeforeExit }

// A Set is the bugs switched on. The nil Set is production: none.
type Set map[Bug]bool

// Has reports whether b is switched on.
func (s Set) Has(b Bug) bool { return s[b] }

// Of is the Set of the given bugs.
func Of(bugs ...Bug) Set {
	s := Set{}
	for _, b := range bugs {
		s[b] = true
	}
	return s
}

// String lists the bugs switched on, comma-separated, in All's order.
func (s Set) String() string {
	var out []string
	for _, b := range All() {
		if s.Has(b) {
			out = append(out, string(b))
		}
	}
	return strings.Join(out, ",")
}

// Parse reads a comma-separated list of bug names ("" is none).
func Parse(list string) (Set, error) {
	s := Set{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(All(), Bug(name)) {
			return nil, fmt.Errorf("mutation %q: want one of %v", name, All())
		}
		s[Bug(name)] = true
	}
	return s, nil
}
