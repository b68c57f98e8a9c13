package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/slotctl/slotctl/internal/testkit/pgtest"
)

// pgScripts are the scripts that take whatever store SLOTCTL_STORE names
// (no bbolt file, clock or permission of their own): TestScriptPostgres
// runs them again on PostgreSQL.
var pgScripts = []string{
	"acquire_basic", "bad_input_newer", "limit_cmds", "limit_pause", "log_basic", "release_basic", "release_multi",
	"run_busy", "run_estimate", "run_exit_codes", "run_fifo", "run_nested_multi",
	"run_newer_first", "run_signals", "run_slots_conflict", "run_two_slots", "stats_basic",
	"sched_aging", "sched_bad_input", "sched_fair", "sched_priority", "sched_rate",
}

// TestScriptPostgres runs pgScripts with SLOTCTL_STORE a new PostgreSQL
// database each.
func TestScriptPostgres(t *testing.T) {
	slotctlPath(t)
	urls := map[string]string{}
	files := make([]string, len(pgScripts))
	for i, name := range pgScripts {
		urls[name] = pgtest.URL(t)
		files[i] = filepath.Join("testdata", "script", name+".txtar")
	}
	testscript.Run(t, testscript.Params{
		Files:               files,
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(env *testscript.Env) error {
			if err := scriptSetup(env); err != nil {
				return err
			}
			// The work directory is named after the script: script-NAME.
			name := strings.TrimPrefix(filepath.Base(env.WorkDir), "script-")
			url, ok := urls[name]
			if !ok {
				return os.ErrNotExist
			}
			env.Setenv("SLOTCTL_STORE", url)
			return nil
		},
		Condition: scriptCondition,
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitfile": cmdWaitfile,
			"exitcode": cmdExitcode,
		},
	})
}
