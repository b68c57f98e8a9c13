package sim_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/testkit/diskfault"
	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/internal/testkit/sim"
)

// tmpfsDisk is a run's own small tmpfs, which a ballast file fills.
type tmpfsDisk struct{ dir string }

func (d tmpfsDisk) ballast() string { return filepath.Join(d.dir, ".ballast") }

// Fill takes every free byte: big writes first, then smaller ones into
// what is left of the last page.
func (d tmpfsDisk) Fill() error {
	f, err := os.OpenFile(d.ballast(), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for _, n := range []int{64 << 10, 4 << 10, 512, 1} {
		for {
			_, err := f.Write(buf[:n])
			if errors.Is(err, unix.ENOSPC) {
				break
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (d tmpfsDisk) Free() error { return os.Remove(d.ballast()) }

func (d tmpfsDisk) Errno() unix.Errno { return unix.ENOSPC }

// ext2Disk is a run's own ext2 file system on a loop device, whose device
// fails every write while broken (diskfault.Disk).
type ext2Disk struct{ d *diskfault.Disk }

func (d ext2Disk) Fill() error       { d.d.Break(); return nil }
func (d ext2Disk) Free() error       { d.d.Reattach(); return nil }
func (d ext2Disk) Errno() unix.Errno { return unix.EIO }

// TestSimDiskFull runs the simulation with the store's file on a small
// tmpfs of each run's own, which fills now and then (fault disk-full,
// diskfault.go): every write meets a real ENOSPC while it is full, and
// must fail whole (S45), with every other rule holding through it. Root
// only (a private mount namespace, as store/boltstore's TestDiskFaults);
// SLOTCTL_SIM_SEED=N replays one run there, with its trace.
func TestSimDiskFull(t *testing.T) {
	if !diskfault.InNamespace(t) {
		return
	}
	root := t.TempDir()
	// The test runs again in a child process, which sees the environment,
	// not the flags.
	seeds := envInt(t, "SLOTCTL_SIM_SEEDS", longtest.Pick(16, 120))
	first := uint64(envInt(t, "SLOTCTL_SIM_SEED0", 1))
	replay := os.Getenv("SLOTCTL_SIM_SEED") != ""
	if replay {
		first, seeds = uint64(envInt(t, "SLOTCTL_SIM_SEED", 1)), 1
	}
	base := config(t)
	start := time.Now()
	results := make([]sim.Result, seeds)
	var wg sync.WaitGroup
	var mu sync.Mutex
	next := 0
	for range 2 {
		wg.Go(func() {
			for {
				mu.Lock()
				k := next
				next++
				mu.Unlock()
				if k >= seeds {
					return
				}
				dir := filepath.Join(root, fmt.Sprint(k))
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Error(err)
					return
				}
				if err := unix.Mount("slotctl-sim", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=8m,mode=0700"); err != nil {
					t.Errorf("mount a tmpfs: %v", err)
					return
				}
				c := base
				c.Seed, c.Dir, c.Disk, c.Trace = first+uint64(k), dir, tmpfsDisk{dir}, replay
				results[k] = sim.Run(c)
				_ = unix.Unmount(dir, unix.MNT_DETACH)
			}
		})
	}
	wg.Wait()
	steps, fulls, refused := diskResults(t, "TestSimDiskFull", replay, results...)
	t.Logf("%d seeds × %d steps: %d steps in %v; the disk full %d times, failing %d writes whole (S45)",
		seeds, base.Steps, steps, time.Since(start).Round(time.Millisecond), fulls, refused)
	if seeds >= 8 && (fulls < seeds || refused < seeds) {
		t.Errorf("the disk was full %d times and failed %d writes in %d runs: want at least one of each a run", fulls, refused, seeds)
	}
}

// TestSimDiskEIO runs the simulation with the store's file on an ext2 file
// system of each run's own, on a loop device that fails every write now
// and then (fault disk-full, with diskfault.Disk.Break): each commit's
// fsync says EIO, and must fail whole (S45); mended (Reattach: what
// reached the disk, mounted anew, every store handle opened again), the
// file holds what it held before the device failed. The store syncs at
// every commit here (sim.NewBoltSync). Root only; runs one after another
// (the disk's calls fail the test on its own goroutine).
// SLOTCTL_SIM_SEED=N replays one run, with its trace.
func TestSimDiskEIO(t *testing.T) {
	if !diskfault.InNamespace(t) {
		return
	}
	seeds := envInt(t, "SLOTCTL_SIM_SEEDS", longtest.Pick(6, 60))
	first := uint64(envInt(t, "SLOTCTL_SIM_SEED0", 1))
	replay := os.Getenv("SLOTCTL_SIM_SEED") != ""
	if replay {
		first, seeds = uint64(envInt(t, "SLOTCTL_SIM_SEED", 1)), 1
	}
	base := config(t)
	base.Backend = sim.NewBoltSync
	root := t.TempDir()
	start := time.Now()
	var results []sim.Result
	for k := range seeds {
		dir := filepath.Join(root, fmt.Sprint(k))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		disk := diskfault.Ext2(t, dir, 16<<20)
		c := base
		c.Seed, c.Dir, c.Disk, c.Trace = first+uint64(k), dir, ext2Disk{disk}, replay
		results = append(results, sim.Run(c))
	}
	steps, fulls, refused := diskResults(t, "TestSimDiskEIO", replay, results...)
	t.Logf("%d seeds × %d steps: %d steps in %v; the device failed %d times, failing %d writes whole (S45)",
		seeds, base.Steps, steps, time.Since(start).Round(time.Millisecond), fulls, refused)
	if seeds >= 4 && (fulls < seeds || refused < seeds) {
		t.Errorf("the device failed %d times and failed %d writes in %d runs: want at least one of each a run", fulls, refused, seeds)
	}
}

// diskResults reports the runs' violations, each with its replay (and
// its trace when replaying), and sums their steps, disk faults and the
// writes those failed.
func diskResults(t *testing.T, test string, replay bool, results ...sim.Result) (steps, fulls, refused int) {
	t.Helper()
	for _, r := range results {
		steps += r.Stats.Steps
		fulls += r.Stats.DiskFulls
		refused += r.Stats.DiskRefused
		if v := r.Violation; v != nil {
			if replay {
				for _, l := range r.Trace {
					t.Log(l)
				}
			}
			t.Errorf("seed %d: %v\nreplay (root): SLOTCTL_SIM_SEED=%d SLOTCTL_SIM_STEPS=%d go test ./internal/testkit/sim -run %s -v", r.Config.Seed, v, r.Config.Seed, r.Config.Steps, test)
		}
	}
	return steps, fulls, refused
}
