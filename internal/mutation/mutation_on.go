//go:build slotctl_mutations

package mutation

import (
	"fmt"
	"slices"
	"strings"
)

// Enabled reports whether this build can switch bugs on (the build tag
// slotctl_mutations).
const Enabled = true

// A Bug is one known defect that the design prevents.
type Bug string

// InStore reports whether b is switched in the store (else in the holder,
// the death judge or the simulation).
func (b Bug) InStore() bool {
	switch b {
	case WaiterNotRenewed, ReleaseBeforeExit, HoldAndWait, LateLossGrace, DrainBlind, GuardUntold, MonotonicDeadline, HoldNotAdopted,
		HostNameIdentity, TimensIgnored, ReplayedKill, PdeathsigOnly, ForegroundUndrained, OrphansLeft:
		return false
	}
	return true
}

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

// InStore is the part of s switched in the store.
func InStore(s Set) Set {
	out := Set{}
	for b, on := range s {
		if on && b.InStore() {
			out[b] = true
		}
	}
	return out
}

// String lists the bugs switched on, comma-separated, in All's order.
func String(s Set) string {
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
