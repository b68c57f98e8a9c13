// Command slotctl, as the tests of cmd/internal/cli run it: slotctl-etcd
// (the etcd client and the Prometheus encoder linked in) with hooks
// that only the tests set. TestMain builds it once and puts it first on
// PATH. A binary of its own rather than the test binary itself: every start
// of the test binary runs the init of all that the tests link (an embedded
// etcd server among them), twice the CPU of a slotctl start, and the
// scripts and process tests start slotctl thousands of times.
package main

import (
	"context"
	"os"
	"os/user"
	"strconv"
	"time"

	"github.com/slotctl/slotctl/cmd/internal/cli"
	"github.com/slotctl/slotctl/cmd/internal/etcdcli"
	"github.com/slotctl/slotctl/cmd/internal/pgcli"
	"github.com/slotctl/slotctl/cmd/internal/promtext"
	"github.com/slotctl/slotctl/internal/guard"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

func main() {
	guard.Main()
	cli.RegisterEtcd(etcdcli.Client)
	cli.RegisterMetrics(promtext.Write)
	cli.RegisterPostgres(pgcli.Open)
	f := cli.NewFactory("v0.0.0-test", "testcommit", "2026-01-01T00:00:00Z")
	if off, err := time.ParseDuration(os.Getenv("SLOTCTLTEST_CLOCK_OFFSET")); err == nil {
		// The host's boot-time clock shifted, so that a script can make
		// leases look expired to one slotctl process without sleeping.
		f.StoreClock = offsetClock(off)
	}
	if host := os.Getenv("SLOTCTLTEST_HOST"); host != "" {
		// Another host sharing the store (etcd): its own name and boot id.
		boot := os.Getenv("SLOTCTLTEST_BOOT")
		f.Identity = func() store.Holder { return identity(host, boot) }
	}
	if n, err := strconv.Atoi(os.Getenv("SLOTCTLTEST_CPUS")); err == nil && n > 0 {
		// A host of n CPUs: the jobserver tests size builds beyond this machine's.
		f.CPUs = func() int { return n }
	}
	os.Exit(cli.Main(context.Background(), os.Args[1:], f))
}

type offsetClock time.Duration

func (o offsetClock) Now() boltstore.Instant {
	return boltstore.Instant{Boot: proc.BootID(), Mono: proc.Boottime() + time.Duration(o), Wall: time.Now().Add(time.Duration(o))}
}

// identity is this process under another host name and boot id
// (SLOTCTLTEST_HOST, SLOTCTLTEST_BOOT): two slotctl processes on one machine
// then look like two hosts sharing an etcd limit, and neither can prove the
// other dead.
func identity(host, boot string) store.Holder {
	h := store.Holder{Host: host, BootID: proc.BootID(), PidNS: proc.PidNS(), Pid: os.Getpid()}
	if boot != "" {
		h.BootID = boot
	}
	h.PidStart, _ = proc.StartTime(h.Pid)
	if u, err := user.Current(); err == nil {
		h.User = u.Username
	} else {
		h.User = strconv.Itoa(os.Getuid())
	}
	return h
}
