package boltstore

import (
	"sync"
	"time"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store/policy"
)

// An Instant is a reading of the store's clock: the boot it was taken in, the
// time since that boot (which keeps counting through suspend, and which
// setting the date does not move), and the wall time for display.
type Instant = policy.Instant

// Clock reads the store's clock. Deadlines are judged only with it.
type Clock interface {
	Now() Instant
}

// SystemClock is the host's boot-time clock with its boot id.
type SystemClock struct{}

// Now reads CLOCK_BOOTTIME and the boot id (see [proc.Boottime]).
func (SystemClock) Now() Instant {
	return Instant{Boot: proc.BootID(), Mono: proc.Boottime(), Wall: time.Now()}
}

// FakeClock is a clock that moves only when told; for tests and simulation.
// It is safe for concurrent use.
type FakeClock struct {
	mu sync.Mutex
	i  Instant
}

// NewFakeClock returns a fake clock reading i.
func NewFakeClock(i Instant) *FakeClock { return &FakeClock{i: i} }

// Now returns the fake instant.
func (c *FakeClock) Now() Instant {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.i
}

// Advance moves the fake clock forward by d, on both the boot and the wall clock.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.i.Mono += d
	c.i.Wall = c.i.Wall.Add(d)
}

// Set replaces the reading, e.g. to step the wall clock or change the boot.
func (c *FakeClock) Set(i Instant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.i = i
}
