package cli

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/slotctl/slotctl/internal/guard"
	"github.com/slotctl/slotctl/internal/testkit/pgtest"
	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// TestMain kills whatever the tests started that outlived them
// (testguard), puts the slotctl that the scripts and process tests run
// first on PATH (slotctlPath builds it when a test first needs it), and
// runs the scripts 8 at a time: a script spends its time waiting on the
// processes it started, and go test's default (one per CPU) would run the
// 50 scripts two at a time on a two-core machine. An explicit -parallel is
// kept.
func TestMain(m *testing.M) {
	guard.Main() // the in-process runs start their jobs under this binary as guard
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "8")
	}
	dir, err := os.MkdirTemp("", "slotctl-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testSlotctl.dir = dir
	os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	code := testguard.Main(pgtest.Run(m)) // pgtest: the PostgreSQL scripts' server, stopped after the tests
	os.RemoveAll(dir)
	os.Exit(code)
}

// testSlotctl is the slotctl of the tests: testdata/slotctl, this package
// with the tests' hooks, built once into dir.
var testSlotctl struct {
	dir  string
	once sync.Once
	err  error
}

// slotctlPath builds the tests' slotctl (once) and returns its path. It is
// built with the race detector when this test binary has it, so that the
// processes the tests start are checked as the tests are.
func slotctlPath(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(testSlotctl.dir, "slotctl")
	testSlotctl.once.Do(func() {
		args := []string{"build", "-o", bin}
		if raceBuild {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "./testdata/slotctl")...).CombinedOutput()
		if err != nil {
			testSlotctl.err = fmt.Errorf("go build ./testdata/slotctl: %v\n%s", err, out)
			return
		}
		// Beside it, as the packages install it: the processes the tests
		// start run their jobs under it (the in-process runs under this
		// binary, started again as the guard).
		args[2] = filepath.Join(testSlotctl.dir, "slotctl-guard")
		if out, err := exec.Command("go", append(args, "../../slotctl-guard")...).CombinedOutput(); err != nil {
			testSlotctl.err = fmt.Errorf("go build ./cmd/slotctl-guard: %v\n%s", err, out)
		}
	})
	if testSlotctl.err != nil {
		t.Fatal(testSlotctl.err)
	}
	return bin
}
