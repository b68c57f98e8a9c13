// Command slotctl gates shell jobs, cron jobs and CI steps behind named
// concurrency limits.
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
)

// Stamped by the release build (goreleaser ldflags); otherwise read from the
// module's build info.
var (
	version = ""
	commit  = ""
	date    = ""
)

func main() {
	execEtcdEarly(os.Args[1:]) // a noetcd build on an etcd store: become slotctl-etcd now
	os.Exit(Main(context.Background(), os.Args[1:], NewFactory(version, commit, date)))
}
