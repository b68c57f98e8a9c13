package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// TestScript runs the end-to-end scripts in testdata/script against the
// slotctl binary that TestMain puts on PATH.
func TestScript(t *testing.T) {
	slotctlPath(t)
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup:               scriptSetup,
		Condition:           scriptCondition,
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitfile": cmdWaitfile,
			"exitcode": cmdExitcode,
			"etcd":     cmdEtcd,
		},
	})
}

// scriptSetup gives every script its own home, config and state directories
// and store, and none of an ancestor slotctl's job variables.
func scriptSetup(env *testscript.Env) error {
	work := env.WorkDir
	drop := []string{"SLOTCTL_TICKET", "SLOTCTL_LIMIT", "SLOTCTL_FENCE", "SLOTCTL_SLOT", "SLOTCTL_SLOTS", "SLOTCTL_CONFIG", "SLOTCTL_TTL", "SLOTCTL_STORE", "SLOTCTL_STORE_TIMEOUT",
		"GITHUB_RUN_ID", "GITHUB_REPOSITORY", "GITHUB_SERVER_URL", "CI_JOB_URL", "BUILDKITE_BUILD_URL", "BUILD_URL"} // the CI's URL is the script's to set
	drop = append(drop, ciEnvVars...) // and so are its other variables
	vars := env.Vars[:0:0]
	for _, kv := range env.Vars {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(drop, k) {
			vars = append(vars, kv)
		}
	}
	env.Vars = vars
	env.Setenv("HOME", filepath.Join(work, "home"))
	env.Setenv("XDG_CONFIG_HOME", filepath.Join(work, "home", ".config"))
	env.Setenv("XDG_STATE_HOME", filepath.Join(work, "home", ".local", "state"))
	// A named store's directory must exist: slotctl makes only the default's.
	if err := os.Mkdir(filepath.Join(work, "state"), 0o700); err != nil {
		return err
	}
	env.Setenv("SLOTCTL_STORE", filepath.Join(work, "state", "slots.db"))
	if env.Getenv("GORACE") == "" {
		// Under -race, each slotctl would otherwise sleep 1s at exit.
		env.Setenv("GORACE", "atexit_sleep_ms=10")
	}
	etcdScriptSetup(env)
	guardScript(env)
	return nil
}

// scriptLimit bounds a script: past it, every process the script started is
// killed, so that a script stuck on one (a background wait, a pipe held by
// a grandchild) fails with its log instead of at the package's timeout.
const scriptLimit = 3 * time.Minute

// guardScript puts the script's processes in a scope of their own, killed
// at its end or at scriptLimit, whichever comes first.
func guardScript(env *testscript.Env) {
	s := testguard.Root().Sub()
	k, v, _ := strings.Cut(s.Env(), "=")
	env.Setenv(k, v)
	name := filepath.Base(env.WorkDir)
	timer := time.AfterFunc(scriptLimit, func() {
		if left := s.Kill(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "script %s still ran after %v: killed %v\n", name, scriptLimit, left)
		}
	})
	env.Defer(func() {
		timer.Stop()
		s.Kill()
	})
}

// scriptCondition adds [root]: permission checks do not apply to uid 0.
func scriptCondition(cond string) (bool, error) {
	switch cond {
	case "root":
		return os.Geteuid() == 0, nil
	}
	return false, errors.New("unknown condition " + strconv.Quote(cond))
}

// waitfile PATH [TIMEOUT]: poll until PATH exists; fail after TIMEOUT (default 10s).
func cmdWaitfile(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! waitfile")
	}
	if len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: waitfile PATH [TIMEOUT]")
	}
	timeout := 10 * time.Second
	if len(args) == 2 {
		d, err := time.ParseDuration(args[1])
		if err != nil {
			ts.Fatalf("waitfile: bad timeout %q: %v", args[1], err)
		}
		timeout = d
	}
	path := ts.MkAbs(args[0])
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("waitfile: %s did not appear within %s", args[0], timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exitcode N cmd args...: run cmd and require exit status N exactly.
// stdout and stderr are kept for the next stdout/stderr checks.
func cmdExitcode(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! exitcode")
	}
	if len(args) < 2 {
		ts.Fatalf("usage: exitcode N cmd [args...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("exitcode: bad exit code %q", args[0])
	}
	cmd := args[1:]
	if cmd[0] == "exec" { // allow "exitcode N exec cmd ..." for readability
		cmd = cmd[1:]
		if len(cmd) == 0 {
			ts.Fatalf("usage: exitcode N [exec] cmd [args...]")
		}
	}
	err = ts.Exec(cmd[0], cmd[1:]...)
	got := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("exitcode: %s: %v", cmd[0], err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("exitcode: %s exited %d, want %d", cmd[0], got, want)
	}
}
