package sim

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/internal/testkit/diskfault"
	"github.com/slotctl/slotctl/store"
)

// A failing disk (fault "disk-full"): the file system the store's file is
// on has no free block left, or its device fails every write, for a while,
// under running holders. The simulation does it for real, in a private
// mount namespace (diskfault_linux_test.go, root only). TestSimDiskFull
// gives each run a small tmpfs of its own, whose free space a ballast file
// takes (Disk.Fill) and gives back (Disk.Free); so that the very next
// commit needs a block, the free pages of the store's file and what lies
// past its last page become holes first (bbolt reads neither): every page
// a commit writes then needs a new block, and the write, not the
// simulation, says ENOSPC. TestSimDiskEIO gives each run an ext2 on a loop
// device (internal/testkit/diskfault): broken, it fails every write, so
// each commit's fsync says EIO (the store syncs there, NewBoltSync);
// mended, what reached the disk is mounted anew and every handle opened
// again, and the file must hold what it held before the device failed.
// While the device fails no other file fault acts (its rename, cut or
// deletion would not reach the disk either). A run without a Disk draws
// nothing for it: the fault is inert in TestSim.
//
// Every call that writes while the disk is full must fail whole (S45): the
// store's answer is store.ErrUnavailable naming the cause, never a
// corrupt store, and the file holds, key for key in every bucket, what it
// held before the call. Nothing ran, so the model learns nothing from it,
// as for a call refused by a held lock: a join that fails so ends the run
// before its child starts (S2 if it started one), a renewal that fails is
// tried again or the lease runs out (S2, S9), a reap or release that fails
// leaves its tickets to a later one (L1 counts from the start of the
// fault and again from its end: a full disk lasts at most diskFullMax,
// less than L1's bound).
// The store's real file system is the ground truth of what such a write
// does (store/boltstore TestDiskFaults: ENOSPC and EIO on every kind of
// write); this fault puts it under the protocol.

// A Disk is the file system under a run's store file, when the test can
// make its writes fail: nil for most runs.
type Disk interface {
	// Fill makes every write that needs a new block fail (ENOSPC: every
	// free byte taken), or every write the device gets (EIO: the device
	// fails, so fsync reports it).
	Fill() error
	// Free mends it: room again, or what reached the disk mounted anew on
	// a device that works (then every handle is opened again).
	Free() error
	// Errno is what a write says while it lasts: ENOSPC or EIO.
	Errno() unix.Errno
}

// NewBoltSync is NewBolt with fsync at every commit: a failing device
// tells a commit only there (a run on a Disk whose Errno is EIO).
func NewBoltSync(dir string, j Judges, mut mutation.Set) (Backend, error) {
	be, err := NewBolt(dir, j, mut)
	if err == nil {
		be.(*Bolt).opts.NoSync = false
	}
	return be, err
}

// diskFullMax bounds how long the disk stays full.
const diskFullMax = 15 * time.Second

// diskState is the fault's state in a run.
type diskState struct {
	rng   *rand.Rand
	until time.Duration // full until then, on the store's clock; 0: not full
	boot  string        // the boot until counts in
	dump  map[string]string
}

func newDiskRng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0xd15cf011)) }

// diskFull fills the run's disk now and then: a stream of its own.
func (s *sim) diskFull() bool {
	b, ok := s.be.(*Bolt)
	if s.cfg.Disk == nil || !s.cfg.Faults.Has(DiskFull) || !ok || s.disk.until != 0 || s.rs.cutUntil != 0 {
		return false
	}
	if s.disk.rng == nil {
		s.disk.rng = newDiskRng(s.cfg.Seed)
	}
	r := s.disk.rng
	if r.Float64() >= 0.01 {
		return false
	}
	// Mostly a moment (the next write or two), else up to diskFullMax.
	d := time.Duration(r.Int64N(int64(time.Second)))
	if r.IntN(2) == 0 {
		d = time.Duration(r.Int64N(int64(diskFullMax)))
	}
	if err := s.cfg.Disk.Errno(); err != unix.ENOSPC {
		// The device fails every write: nothing needs a new block.
	} else if err := holeFreePages(b.path); err != nil {
		s.fail("setup", "punch the store file's free pages: %v", err)
		return true
	}
	if err := s.cfg.Disk.Fill(); err != nil {
		s.fail("setup", "fill the disk: %v", err)
		return true
	}
	var err error
	if s.disk.dump, err = dumpFile(b.path); err != nil {
		s.fail("setup", "read the store file: %v", err)
		return true
	}
	s.disk.until, s.disk.boot = s.now().Mono+max(d, time.Microsecond), s.now().Boot
	s.m.storeDown()
	s.stats.DiskFulls++
	s.tracef("the disk fails writes (%v) for %v", s.cfg.Disk.Errno(), d)
	return true
}

// diskFreed gives the disk its space back (its actor, the quiescent phase).
func (s *sim) diskFreed() {
	if s.disk.until == 0 {
		return
	}
	b := s.be.(*Bolt)
	was := s.disk.dump
	s.disk.until, s.disk.dump = 0, nil
	s.m.storeDown()
	if s.cfg.Disk.Errno() != unix.ENOSPC {
		s.letLockGo() // a stalled process's lock was on the old mount
	}
	if err := s.cfg.Disk.Free(); err != nil {
		s.fail("setup", "free the disk: %v", err)
		return
	}
	if s.cfg.Disk.Errno() == unix.ENOSPC {
		s.tracef("the disk has room again")
		return
	}
	// What reached the disk is what the file held before the device
	// failed, nothing of a commit it failed (S45).
	s.restart()
	now, err := dumpFile(b.path)
	switch {
	case err != nil:
		s.fail("S45", "the store file on the mended disk: %v", err)
	case was != nil:
		if d := diskfault.Diff(was, now); d != "" {
			s.fail("S45", "the store file on the mended disk is not what it held before the failed writes:\n%s", d)
		}
	}
	s.tracef("the disk is mended: what reached it mounted anew")
}

type diskActor struct{ s *sim }

func (a diskActor) wake() time.Duration { return a.s.due(a.s.disk.until, a.s.disk.boot) }
func (a diskActor) act()                { a.s.diskFreed() }

// fileReplaced: another fault deleted, replaced or cut the store's file
// while the disk is full: what the next failed write must leave is what
// the file holds now.
func (s *sim) fileReplaced() {
	b, ok := s.be.(*Bolt)
	if s.disk.until == 0 || !ok {
		return
	}
	if s.rs.cutUntil != 0 {
		s.disk.dump = nil // corrupt: every call fails as such, none on the disk
		return
	}
	var err error
	if s.disk.dump, err = dumpFile(b.path); err != nil {
		s.fail("setup", "read the store file: %v", err)
	}
}

// diskBroken: the device fails every write. No other file fault acts
// meanwhile: a rename, a cut or a deletion would not reach the disk
// either, and the mended disk would show the file as it was.
func (s *sim) diskBroken() bool { return s.disk.until != 0 && s.cfg.Disk.Errno() != unix.ENOSPC }

// due is at, on the clock of boot: at once if the host rebooted since.
func (s *sim) due(at time.Duration, boot string) time.Duration {
	if s.now().Boot != boot {
		return 0
	}
	return at
}

// storeDown: no reap can remove a ticket from now on (the disk full) or
// could until now (the disk has room again): L1 counts from each end.
func (m *model) storeDown() {
	now := m.s.now().Mono
	for _, t := range m.live {
		t.keptAt = max(t.keptAt, now)
	}
}

// writeCalls are the calls that write the store.
var writeCalls = []string{"enqueue", "renew", "release", "setchild", "reap", "setlimit", "setpolicy", "resize"}

// diskRefused checks a call made while the disk is full (S45) and reports
// whether it failed on the disk: then nothing ran, and the model is not
// told of it. A write that succeeded (a commit that found room) is the
// state the next one is judged against.
func (s *sim) diskRefused(o *op) bool {
	b, ok := s.be.(*Bolt)
	if s.disk.until == 0 || !ok || !slices.Contains(writeCalls, o.kind) {
		return false
	}
	onDisk := errors.Is(o.err, store.ErrUnavailable) && strings.Contains(o.err.Error(), s.cfg.Disk.Errno().Error())
	if o.err != nil && !onDisk {
		return false // the model judges it (S12: a full disk is no corrupt store)
	}
	if s.disk.dump == nil {
		return onDisk // the file is cut short (restore.go)
	}
	now, err := dumpFile(b.path)
	if err != nil {
		s.fail("S45", "the store file after %s by %s on a full disk: %v", o.kind, o.who, err)
		return onDisk
	}
	if !onDisk {
		s.disk.dump = now
		return false
	}
	s.stats.DiskRefused++
	s.tracef("%s by %s fails on the disk", o.kind, o.who)
	if d := diskfault.Diff(s.disk.dump, now); d != "" {
		s.fail("S45", "%s by %s failed on the disk (%v) and changed the store's file:\n%s", o.kind, o.who, o.err, d)
	}
	return true
}

// dumpFile reads every key of every bucket of the store's file, straight
// from bbolt; a missing or empty file is an empty store.
func dumpFile(path string) (map[string]string, error) { return diskfault.Dump(path) }
