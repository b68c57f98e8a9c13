//go:build slotctl_mutations

package sim_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/internal/testkit/diskfault"
	"github.com/slotctl/slotctl/internal/testkit/sim"
)

// TestSimDiskMutation: a bbolt store that takes a write whose commit
// failed on a full disk for done (mutation.CommitIgnored) is caught, at
// the recorded seed and step, by what its caller then believes that the
// store does not hold (an operator's resize of a limit); the same seed
// runs clean without it. Root only (a
// tmpfs of its own in a private mount namespace, as TestSimDiskFull).
func TestSimDiskMutation(t *testing.T) {
	if !diskfault.InNamespace(t) {
		return
	}
	const seed, step, rule = 1, 127, "S1" // an operator's resize believed, which the full disk refused
	run := func(muts mutation.Set, steps int) sim.Result {
		dir := filepath.Join(t.TempDir(), "run")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("slotctl-sim", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=8m,mode=0700"); err != nil {
			t.Skipf("mount a tmpfs: %v", err)
		}
		defer unix.Unmount(dir, unix.MNT_DETACH)
		return sim.Run(sim.Config{Seed: seed, Steps: steps, Mutations: muts, Dir: dir, Disk: tmpfsDisk{dir}})
	}
	r := run(mutation.Of(mutation.CommitIgnored), step)
	if v := r.Violation; v == nil || v.Rule != rule || v.Step != step {
		t.Errorf("commit-ignored at seed %d: %v, want %s at step %d", seed, v, rule, step)
	}
	if r := run(nil, 500); r.Violation != nil {
		t.Errorf("seed %d without the bug: %v", seed, r.Violation)
	}
}
