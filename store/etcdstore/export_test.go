package etcdstore

import (
	"time"

	"github.com/slotctl/slotctl/store"
)

// WithSkew returns o for a second handle beside like (tests only): it shares
// like's knowledge of lease send times, and its dry-run reaps read every
// lease skew later, as a reaper whose clock is ahead would.
func WithSkew(o Options, skew time.Duration, like *Store) Options {
	o.skew, o.clock = skew, like.leases
	return o
}

// BellDone is closed once the goroutine of a bell made by Watch has ended.
func BellDone(b store.Bell) <-chan struct{} { return b.(*bell).done }
