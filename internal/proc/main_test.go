package proc

import (
	"os"
	"testing"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// TestMain kills whatever the tests started that outlived them.
func TestMain(m *testing.M) { os.Exit(testguard.Main(m)) }

// owner is the judge with the authority of the owner's evidence as the old
// trust had it (the marker the job's own processes carry), for the tests of
// everything but that authority.
var owner = Judge{Authority: func(uid int, id string) (Marker, bool) {
	j, err := findJob(id, 0)
	return j.marker, err == nil && len(j.procs) > 0
}}

func hostname() string { h, _ := os.Hostname(); return h }
