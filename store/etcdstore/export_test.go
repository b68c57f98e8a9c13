package etcdstore

import "time"

// WithSkew returns o for a second handle beside like (tests only): it shares
// like's knowledge of lease send times, and its dry-run reaps read every
// lease skew later, as a reaper whose clock is ahead would.
func WithSkew(o Options, skew time.Duration, like *Store) Options {
	o.skew, o.clock = skew, like.leases
	return o
}
