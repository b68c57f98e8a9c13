package cli

import (
	"context"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/internal/testguard"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// TestMain makes this test binary double as slotctl: scripts and process
// tests find "slotctl" on PATH (testscript puts a copy there). As a test
// binary, it kills whatever its tests started that outlived them.
func TestMain(m *testing.M) {
	testscript.Main(guarded{m}, map[string]func(){
		"slotctl": func() {
			f := NewFactory("v0.0.0-test", "testcommit", "2026-01-01T00:00:00Z")
			if off, err := time.ParseDuration(os.Getenv("SLOTCTLTEST_CLOCK_OFFSET")); err == nil {
				f.StoreClock = offsetClock(off)
			}
			if host := os.Getenv("SLOTCTLTEST_HOST"); host != "" {
				// Another host sharing the store (etcd): its own name and boot id.
				f.Identity = func() store.Holder { return testIdentity(host, os.Getenv("SLOTCTLTEST_BOOT")) }
			}
			os.Exit(Main(context.Background(), os.Args[1:], f))
		},
	})
}

// guarded runs the tests under testguard, the scripts 8 at a time: a script
// spends its time waiting on the processes it started, and go test's
// default (one per CPU) would run the 50 scripts two at a time on a
// two-core machine. An explicit -parallel is kept.
type guarded struct{ m *testing.M }

func (g guarded) Run() int {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "8")
	}
	return testguard.Main(g.m)
}

// offsetClock is the host's boot-time clock shifted by a duration, so that a
// script can make leases look expired to one slotctl process without sleeping
// (SLOTCTLTEST_CLOCK_OFFSET=1h). Only the test binary reads that variable.
type offsetClock time.Duration

func (o offsetClock) Now() boltstore.Instant {
	return boltstore.Instant{Boot: proc.BootID(), Mono: proc.Boottime() + time.Duration(o), Wall: time.Now().Add(time.Duration(o))}
}
