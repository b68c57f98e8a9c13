package proc

import (
	"syscall"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
)

// A Host is the machine as one process (the reader) sees it: what the judge
// reads to prove a holder dead, and how it signals. The real one is this
// process's /proc (a nil Host in a Judge); the simulation
// (internal/testkit/sim) models one, so that the judge it drives is this
// package's own.
//
// Errors are the kernel's: a process that does not exist is an error
// wrapping fs.ErrNotExist from Stat and Environ and syscall.ESRCH from
// Kill; one that may not be signalled is syscall.EPERM.
type Host interface {
	// BootID is the id of the host's current boot.
	BootID() string
	// PidNS is the inode of the reader's pid namespace.
	PidNS() uint64
	// Hostname is the host's name, which other hosts may share.
	Hostname() string
	// TimeOffset is the reader's time namespace's boottime offset: the
	// kernel adds it to every start time Stat shows the reader.
	TimeOffset() time.Duration
	// Self is the reader's pid.
	Self() int
	// Pids lists the processes the reader can see.
	Pids() ([]int, error)
	// Stat is /proc/PID/stat as the reader reads it.
	Stat(pid int) (Stat, error)
	// Exited reports whether pid, read as st, and every other thread of it
	// have exited (zombies); Dying, whether each has exited or is exiting.
	Exited(pid int, st Stat) bool
	Dying(pid int, st Stat) bool
	// Environ is /proc/PID/environ: NUL-separated NAME=VALUE.
	Environ(pid int) ([]byte, error)
	// UID is the one uid pid runs as (real, effective, saved and
	// filesystem), -1 if they differ or cannot be read.
	UID(pid int) int
	// Kill is kill(2): pid < 0 names a process group, sig 0 only probes.
	Kill(pid int, sig syscall.Signal) error
	// SignalIf pins process pid (a pidfd), then sends sig only if check
	// still holds, so that a pid handed to another process meanwhile is
	// never hit. A process already gone, or that check no longer holds
	// for, is no error.
	SignalIf(pid int, sig syscall.Signal, check func() bool) error
}

// reader is a Host and the bugs switched on in how it is read
// (test-only, internal/mutation).
type reader struct {
	h   Host
	mut mutation.Set
}

// local reads this process's own host.
var local = reader{h: realHost{}}

// stat reads pid's /proc/PID/stat with its start time on the host's clock:
// a reader in a time namespace is shown the host's plus its offset.
func (r reader) stat(pid int) (Stat, error) {
	st, err := r.h.Stat(pid)
	if err != nil {
		return st, err
	}
	if !r.mut.Has(mutation.TimensIgnored) { // mutation (test-only): the offset left in
		st.Start = hostTicks(st.Start, r.h.TimeOffset())
	}
	return st, nil
}

// StartTime is the start time of process pid in clock ticks after boot, on
// the host's clock, as this judge's host shows it (see [StartTime]).
func (jd Judge) StartTime(pid int) (uint64, error) {
	st, err := jd.r().stat(pid)
	return st.Start, err
}

// SelfMarker is the marker of the judge's reader, as [SelfMarker] is this
// process's.
func (jd Judge) SelfMarker() (Marker, bool) {
	r := jd.r()
	m := Marker{Pid: r.h.Self(), PidNS: r.h.PidNS()}
	m.Start, _ = jd.StartTime(m.Pid)
	return m, m.Start != 0 && m.PidNS != 0
}

func (jd Judge) r() reader {
	if jd.Host == nil {
		return reader{h: realHost{}, mut: jd.Mutations}
	}
	return reader{h: jd.Host, mut: jd.Mutations}
}

// userHZ is the unit of /proc/PID/stat's start time (USER_HZ, which
// sysconf(_SC_CLK_TCK) reports): 100 on every architecture Linux runs Go on.
const userHZ = 100

// offsetTicks is a boottime offset in /proc/PID/stat's clock ticks. The
// kernel adds the reader's offset to every start time it shows there; an
// offset that is not a whole number of ticks (no tool sets one) is
// rounded down, as the kernel rounds the sum.
func offsetTicks(off time.Duration) int64 {
	t := int64(off / (time.Second / userHZ))
	if off < 0 && off%(time.Second/userHZ) != 0 {
		t--
	}
	return t
}

// hostTicks is a start time read in a time namespace with boottime offset
// off, on the host's clock: what a reader outside the namespace reads.
func hostTicks(start uint64, off time.Duration) uint64 {
	return uint64(int64(start) - offsetTicks(off))
}

// Stat is what slotctl reads of /proc/PID/stat.
type Stat struct {
	State byte   // field 3: R, S, D, Z (zombie), X (dead), ...
	Ppid  int    // field 4
	Pgrp  int    // field 5
	Flags uint64 // field 9: the kernel's flags (PF_EXITING: in exit, past running code)
	Start uint64 // field 22, clock ticks after boot
}
