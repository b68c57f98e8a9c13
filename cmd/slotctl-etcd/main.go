// Command slotctl-etcd is slotctl with the etcd client linked in: the
// binary that serves etcd stores (slotctl hands them to it). Installed
// beside slotctl; it serves the embedded store too.
package main

import (
	"context"
	"os"

	"github.com/slotctl/slotctl/cmd/internal/cli"
	"github.com/slotctl/slotctl/cmd/internal/etcdcli"
	"github.com/slotctl/slotctl/cmd/internal/pgcli"
	"github.com/slotctl/slotctl/cmd/internal/promtext"
	"github.com/slotctl/slotctl/internal/guard"
)

// Stamped by the release build (goreleaser ldflags); otherwise read from the
// module's build info.
var (
	version = ""
	commit  = ""
	date    = ""
)

func main() {
	guard.Main() // started as the guard of a job: be that, and only that
	cli.RegisterEtcd(etcdcli.Client)
	cli.RegisterMetrics(promtext.Write)
	cli.RegisterPostgres(pgcli.Open)
	f := cli.NewFactory(version, commit, date)
	f.ExitAfterMain = true
	os.Exit(cli.Main(context.Background(), os.Args[1:], f))
}
