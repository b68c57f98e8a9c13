// Command slotctl-guard is the guard slotctl starts each job under
// (internal/guard): the subreaper of the job's processes, which kills them
// all if slotctl dies. It links nothing else, so it starts in a
// millisecond; installed beside slotctl, slotctl uses it, and otherwise
// starts its own executable as the guard.
package main

import (
	"fmt"
	"os"

	"github.com/slotctl/slotctl/internal/guard"
)

func main() {
	guard.Main()
	fmt.Fprintln(os.Stderr, "slotctl-guard: started by slotctl run for each job, not by hand")
	os.Exit(64)
}
