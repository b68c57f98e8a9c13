// Package longtest tells the plain go test ./..., the fast suite a newcomer
// runs, from the long one that .ci/run runs: soaks, large simulation
// budgets, whole-binary builds, scale runs and multi-member clusters run
// only with SLOTCTL_LONG=1.
package longtest

import (
	"os"
	"testing"
)

// Var is the environment variable that runs the long tests: SLOTCTL_LONG=1.
const Var = "SLOTCTL_LONG"

// Enabled reports whether the long tests run.
func Enabled() bool { return os.Getenv(Var) == "1" }

// Skip skips a long test unless they run, saying what it is.
func Skip(t testing.TB, what string) {
	t.Helper()
	if !Enabled() {
		t.Skipf("%s: a long test; %s=1 runs it (.ci/run does)", what, Var)
	}
}

// Pick is short in the fast suite and long in the long one: a budget.
func Pick[T any](short, long T) T {
	if Enabled() {
		return long
	}
	return short
}
