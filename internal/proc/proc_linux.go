package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown-boot"
	}
	return strings.TrimSpace(string(b))
})

// BootID is the kernel's id of the current boot; it changes at every reboot.
func BootID() string { return bootID() }

// Boottime is the time since boot on CLOCK_BOOTTIME: monotonic, counting
// through suspend, unmoved by setting the date. It is the host's: a time
// namespace's offset (unshare -T --boottime) is taken off, so that
// processes in different time namespaces of one boot compare deadlines on
// one clock.
func Boottime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_BOOTTIME): %v", err)) // cannot happen on Linux >= 2.6.39
	}
	return time.Duration(ts.Nano()) - bootOffset()
}

// bootOffset is this process's time namespace's CLOCK_BOOTTIME offset. A
// kernel without time namespaces has no timens_offsets file: no offset.
// An offset that cannot be read is a clock that cannot be trusted, so
// slotctl stops rather than judge deadlines on it.
var bootOffset = sync.OnceValue(func() time.Duration {
	b, err := os.ReadFile("/proc/self/timens_offsets")
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	if err != nil {
		panic(fmt.Sprintf("read /proc/self/timens_offsets: %v", err))
	}
	off, err := parseTimensOffsets(b)
	if err != nil {
		panic(fmt.Sprintf("/proc/self/timens_offsets: %v", err))
	}
	return off
})

// parseTimensOffsets reads the boottime line of a timens_offsets file
// ("boottime <secs> <nanosecs>", one line per clock); no such line is no
// offset.
func parseTimensOffsets(b []byte) (time.Duration, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "boottime" {
			continue
		}
		if len(f) != 3 {
			return 0, fmt.Errorf("malformed line %q", line)
		}
		secs, err1 := strconv.ParseInt(f[1], 10, 64)
		nsecs, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || nsecs < 0 || nsecs >= 1e9 || secs > maxOffsetSecs || secs < -maxOffsetSecs {
			return 0, fmt.Errorf("malformed line %q", line)
		}
		return time.Duration(secs)*time.Second + time.Duration(nsecs), nil
	}
	return 0, nil
}

// maxOffsetSecs bounds an offset read: a time namespace's clocks may be
// moved by at most ten years (the kernel's own bound is smaller).
const maxOffsetSecs = 10 * 366 * 24 * 3600

// PidNS is the inode of this process's pid namespace, 0 if unknown.
func PidNS() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}

// realHost is this process's host, read through /proc.
type realHost struct{}

func (realHost) BootID() string            { return BootID() }
func (realHost) PidNS() uint64             { return PidNS() }
func (realHost) TimeOffset() time.Duration { return bootOffset() }
func (realHost) Self() int                 { return os.Getpid() }
func (realHost) UID(pid int) int           { return procUID(pid) }

func (realHost) Hostname() string {
	h, _ := os.Hostname()
	return h
}

func (realHost) Pids() ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	pids := make([]int, 0, len(entries))
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func (realHost) Stat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return parseStat(b)
}

func (realHost) Exited(pid int, st Stat) bool { return exited(pid, st) }

// Dying: exited, or on its way there (every thread exiting). A process
// being killed is exiting a moment before it is a zombie, and reads then as
// one without an environment: it is gone, not a stranger.
func (realHost) Dying(pid int, st Stat) bool { return allTasks(pid, st, Stat.gone) }

func (realHost) Environ(pid int) ([]byte, error) {
	return os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
}

func (realHost) Kill(pid int, sig syscall.Signal) error { return unix.Kill(pid, sig) }

// SignalIf implements Host through a pidfd: it is opened first, then check
// runs, and the signal goes to the process the pidfd names, never to
// whatever has the pid by then. On a kernel without pidfds (before 5.3,
// or a seccomp filter that refuses pidfd_open) it checks and then kill(2)s
// the pid: a process that exits between the check and the kill, and whose
// pid is handed out again within that instant, would be hit (README,
// Security).
func (realHost) SignalIf(pid int, sig syscall.Signal, check func() bool) error {
	fd, err := pidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return nil // gone already
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
		// No pidfd_open: an old kernel, or a seccomp filter that refuses
		// it (pidfd_open itself checks no permission).
		if !check() {
			return nil
		}
		err = unix.Kill(pid, sig)
	case err != nil:
		return fmt.Errorf("pidfd_open(%d): %w", pid, err)
	default:
		defer unix.Close(fd)
		if !check() {
			return nil // exited, or the pid is another process's now: not ours
		}
		err = unix.PidfdSendSignal(fd, sig, nil, 0)
	}
	switch {
	case err == nil, errors.Is(err, unix.ESRCH):
		return nil
	case errors.Is(err, unix.EPERM):
		return errNotOurs
	}
	return err
}

func readStat(pid int) (Stat, error) { return local.stat(pid) }

// StartTime is the start time of process pid in clock ticks after boot
// (/proc/PID/stat field 22); with the boot id and pid it names one process
// for good, even after its pid is reused.
func StartTime(pid int) (uint64, error) { return Judge{}.StartTime(pid) }

// parseStatStart takes field 22 of a /proc/PID/stat line.
func parseStatStart(b []byte) (uint64, error) {
	st, err := parseStat(b)
	return st.Start, err
}

// parseStat reads a /proc/PID/stat line; the command name (field 2) may
// hold spaces and parentheses, so fields count from the last ')'.
func parseStat(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("malformed stat line")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field 4 is f[1], 5 is f[2]; field 22 is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("malformed stat line: %d fields", len(f)+2)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return Stat{}, fmt.Errorf("malformed stat line: ppid %q", f[1])
	}
	pgrp, err := strconv.Atoi(f[2])
	if err != nil {
		return Stat{}, fmt.Errorf("malformed stat line: pgrp %q", f[2])
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("malformed stat line: flags %q", f[6])
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("malformed stat line: start time %q", f[19])
	}
	return Stat{State: f[0][0], Ppid: ppid, Pgrp: pgrp, Flags: flags, Start: start}, nil
}

// Liveness is what a probe can say of one process identity.
type Liveness int

// The answers of Identify.
const (
	Alive  Liveness = iota // running (or stopped), or cannot be told apart from running
	Gone                   // no such process, or it has exited (a zombie)
	Reused                 // the pid belongs to another process now: start times differ
)

// Identify probes the process (pid, start) on this host. EPERM means alive:
// a process we may not signal still exists. A pid whose start time differs
// is another process (the pid was reused), never a reason to signal it.
func Identify(pid int, start uint64) Liveness { return local.identify(pid, start) }

func (r reader) identify(pid int, start uint64) Liveness {
	if pid <= 0 {
		return Gone
	}
	if err := r.h.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return Gone
	}
	st, err := r.stat(pid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// It existed a moment ago; gone now, or hidden (hidepid): not proof.
		if errors.Is(r.h.Kill(pid, 0), unix.ESRCH) {
			return Gone
		}
		return Alive
	case err != nil:
		return Alive
	case start != 0 && st.Start != start:
		return Reused
	case r.h.Exited(pid, st):
		return Gone
	}
	return Alive
}

// running reports whether pid is a running (or stopped) process that
// started at start, as read from /proc: no guess on an error.
func running(pid int, start uint64) bool { return local.running(pid, start) }

func (r reader) running(pid int, start uint64) bool {
	st, err := r.stat(pid)
	return err == nil && st.Start == start && !r.h.Exited(pid, st)
}

// GroupEmpty reports whether process group pgid has no running member. A
// group of only zombies (exited, not yet reaped by a parent that may never
// do it) is empty. A member we may not signal, or cannot see, keeps it
// non-empty: only what can be proven counts.
func GroupEmpty(pgid int) bool { return local.groupEmpty(pgid) }

func (r reader) groupEmpty(pgid int) bool {
	if pgid <= 0 {
		return false
	}
	err := r.h.Kill(-pgid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true
	}
	if err != nil {
		return false // EPERM: a member exists that is not ours
	}
	pids, err := r.h.Pids()
	if err != nil {
		return false
	}
	for _, pid := range pids {
		st, err := r.stat(pid)
		if err != nil {
			continue
		}
		if st.Pgrp == pgid && !r.h.Exited(pid, st) {
			return false
		}
	}
	return true
}

// sameGroup reports whether process group pgid is still the group whose
// leader started at start: its leader is that process, or has exited (a
// group's id is not handed out again while any member lives).
func sameGroup(pgid int, start uint64) bool { return local.sameGroup(pgid, start) }

func (r reader) sameGroup(pgid int, start uint64) bool {
	st, err := r.stat(pgid)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	return start == 0 || st.Start == start
}

// KillGroup sends SIGKILL to process group pgid and waits up to wait for
// it to have no running member. It reports false when the group could not
// be signalled (not ours to kill) or did not empty in time.
func KillGroup(pgid int, wait time.Duration) bool {
	if err := unix.Kill(-pgid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return false
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(5 * time.Millisecond) {
		if GroupEmpty(pgid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// pfExiting is PF_EXITING in /proc/PID/stat's flags: the task is in
// exit(2), past the last of its own code; its memory (and so its
// environment) may be gone already.
const pfExiting = 0x4

// zombie: the task has exited ('Z'/'X').
func (st Stat) zombie() bool { return st.State == 'Z' || st.State == 'X' }

// gone: a zombie, or a task that is exiting.
func (st Stat) gone() bool { return st.zombie() || st.Flags&pfExiting != 0 }

// exited: a zombie ('Z'/'X') with no live thread. A leader that called
// pthread_exit shows 'Z' while its other threads run.
func exited(pid int, st Stat) bool { return allTasks(pid, st, Stat.zombie) }

// allTasks reports whether the process's leader (st) and each of its other
// threads is done.
func allTasks(pid int, st Stat, done func(Stat) bool) bool {
	if !done(st) {
		return false
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	for _, e := range tasks {
		if e.Name() == strconv.Itoa(pid) {
			continue
		}
		b, err := os.ReadFile(dir + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if ts, err := parseStat(b); err != nil || !done(ts) {
			return false
		}
	}
	return true
}
