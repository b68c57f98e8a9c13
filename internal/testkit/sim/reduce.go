package sim

import (
	"fmt"
	"strings"

	"github.com/slotctl/slotctl/internal/mutation"
)

// Reduce looks for a shorter, simpler run that breaks the same rule as r:
// the fewest steps first (a violation in the random phase replays with the
// step budget cut to its step), then without each fault kind in turn, keeping
// every cut that still fails. newDir gives each trial run its own store
// directory. The result is the smallest failing run found, with its trace.
func Reduce(r Result, newDir func() string) Result {
	if r.Violation == nil {
		return r
	}
	rule := r.Violation.Rule
	try := func(c Config) (Result, bool) {
		c.Dir, c.Trace = newDir(), false
		res := Run(c)
		return res, res.Violation != nil && res.Violation.Rule == rule
	}
	best := r
	cfg := r.Config
	shorten := func(res Result) {
		best = res
		cfg = res.Config
		if v := res.Violation; v.Step <= cfg.Steps {
			cfg.Steps = v.Step
			return
		}
		// Found in the quiescent phase: look for a shorter random phase.
		for n := cfg.Steps / 2; n >= 1; n /= 2 {
			c := cfg
			c.Steps = n
			res2, ok := try(c)
			if !ok {
				break
			}
			best, cfg = res2, res2.Config
		}
	}
	shorten(r)
	for _, f := range AllFaults() {
		if !cfg.Faults.Has(f) {
			continue
		}
		c := cfg
		c.Faults = FaultSet{}
		for _, g := range AllFaults() {
			if g != f && cfg.Faults.Has(g) {
				c.Faults[g] = true
			}
		}
		if res, ok := try(c); ok {
			shorten(res)
		}
	}
	cfg.Dir, cfg.Trace = newDir(), true
	final := Run(cfg)
	if final.Violation == nil || final.Violation.Rule != rule {
		return best // cannot happen for a deterministic run; keep what failed
	}
	return final
}

// Replay is the command that replays a run.
func Replay(c Config) string {
	var b strings.Builder
	b.WriteString("go test ")
	if m := mutation.String(c.Mutations); m != "" {
		b.WriteString("-tags slotctl_mutations ") // -mutations needs it
	}
	fmt.Fprintf(&b, "./internal/testkit/sim -run 'TestSim$' -seed %d -steps %d", c.Seed, c.Steps)
	if c.Faults != nil {
		f := c.Faults.String()
		if f == "" {
			f = "none"
		}
		fmt.Fprintf(&b, " -faults %s", f)
	}
	if m := mutation.String(c.Mutations); m != "" {
		fmt.Fprintf(&b, " -mutations %s", m)
	}
	b.WriteString(" -simtrace -v")
	return b.String()
}

// Report is a failing run as a person reads it: the seed and the rule, the
// reduced run's trace (the last lines, if long), and the command that
// replays it.
func Report(orig, reduced Result, tail int) string {
	var b strings.Builder
	v := orig.Violation
	fmt.Fprintf(&b, "seed %d: %v\n", orig.Config.Seed, v)
	rc := reduced.Config
	fmt.Fprintf(&b, "reduced to %d steps (violation at step %d) with faults %q", rc.Steps, reduced.Violation.Step, rc.Faults.String())
	if m := mutation.String(rc.Mutations); m != "" {
		fmt.Fprintf(&b, ", mutations %s", m)
	}
	b.WriteString(":\n")
	tr := reduced.Trace
	if tail > 0 && len(tr) > tail {
		fmt.Fprintf(&b, "  ... %d earlier steps (see -simtrace)\n", len(tr)-tail)
		tr = tr[len(tr)-tail:]
	}
	for _, l := range tr {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "replay: %s\n", Replay(rc))
	return b.String()
}
