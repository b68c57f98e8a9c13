package etcdstore_test

import (
	"flag"
	"os"
	"testing"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// TestMain lets the sleep-bound cases of the conformance suite run all at
// once: go test runs GOMAXPROCS parallel tests by default, which on a
// two-core machine would run the suite's cases (each sleeping through a
// few lease TTLs of a real etcd server) two at a time. An explicit
// -parallel is kept.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "64")
	}
	os.Exit(testguard.Main(m))
}
