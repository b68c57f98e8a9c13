// Command slotctl gates shell jobs, cron jobs and CI steps behind named
// concurrency limits.
//
// It has no etcd client: given an etcd store it replaces itself with
// slotctl-etcd (cmd/slotctl-etcd), the same command with the client,
// installed beside it or on PATH. The command itself is cmd/internal/cli.
package main

// The checked-in completion scripts and man pages come from the command tree;
// CI fails when they are stale. Run go generate ./... after changing any help.
//go:generate go run . completion bash -o ../../completions/slotctl.bash
//go:generate go run . completion zsh -o ../../completions/slotctl.zsh
//go:generate go run . completion fish -o ../../completions/slotctl.fish
//go:generate go run -tags gendocs . man --dir ../../man

import (
	"context"
	"os"

	"github.com/slotctl/slotctl/cmd/internal/cli"
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
	guard.Main()                   // started as the guard of a job: be that, and only that
	cli.ExecEtcdEarly(os.Args[1:]) // an etcd store: become slotctl-etcd now
	f := cli.NewFactory(version, commit, date)
	f.ExitAfterMain = true
	os.Exit(cli.Main(context.Background(), os.Args[1:], f))
}
