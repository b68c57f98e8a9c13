// Command slotctl gates shell jobs, cron jobs and CI steps behind named
// concurrency limits.
package main

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
	os.Exit(Main(context.Background(), os.Args[1:], NewFactory(version, commit, date)))
}
