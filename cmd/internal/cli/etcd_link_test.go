package cli_test

// The test binary links the etcd client and the Prometheus encoder, as slotctl-etcd does: its etcd
// tests and scripts run in-process (TestMain's "slotctl" is this binary).
// An external test file, so that it may import etcdcli, which imports cli.

import (
	"github.com/slotctl/slotctl/cmd/internal/cli"
	"github.com/slotctl/slotctl/cmd/internal/etcdcli"
	"github.com/slotctl/slotctl/cmd/internal/pgcli"
	"github.com/slotctl/slotctl/cmd/internal/promtext"
)

func init() {
	cli.RegisterEtcd(etcdcli.Client)
	cli.RegisterMetrics(promtext.Write)
	cli.RegisterPostgres(pgcli.Open)
}
