//go:build linux

package pgtest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// startable: a server may be started here (one that dies with the binary).
func startable() error { return nil }

// procAttr makes initdb and postgres run as cred (nil: as this process),
// in a process group of their own (a terminal's ^C reaches the test binary,
// whose death ends them), and SIGKILLed when the thread that started them
// ends (Pdeathsig: set by Go after the credentials change, which would
// clear it).
func procAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}

// writeOwner names this process in dir's ownerFile: its pid and start
// time (a later process with the same pid is not it).
func writeOwner(dir string) error {
	st, err := startTime(os.Getpid())
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ownerFile), fmt.Appendf(nil, "%d %d\n", os.Getpid(), st), 0o600)
}

// startTime is a process's start time (clock ticks after boot: field 22
// of /proc/PID/stat); an error if there is no such process, or it is a
// zombie.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, the state
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d is dead", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// sweep removes the server directories under tmp whose test binary and
// postmaster are both gone (killed: Main did not remove them), and their
// shared memory segments.
func sweep(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not made by pgtest, or being made
		}
		var pid int
		var st uint64
		if _, err := fmt.Sscan(string(b), &pid, &st); err != nil {
			continue
		}
		if now, err := startTime(pid); err == nil && now == st {
			continue // its binary runs
		}
		data := filepath.Join(dir, "data")
		if pm := postmaster(data); pm != 0 {
			if _, err := startTime(pm); err == nil {
				continue // its postmaster, or a process with its pid, runs
			}
		}
		if removeSegment(data) {
			continue // backends of the dead postmaster are still going
		}
		cleanDir(dir)
	}
}

// postmaster is the pid in data's postmaster.pid, 0 if none.
func postmaster(data string) int {
	lines := pidFile(data)
	if len(lines) < 1 {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(lines[0]))
	return pid
}

// pidFile is the lines of data's postmaster.pid (line 1: the postmaster's
// pid; line 7: the shared memory segment's key and id).
func pidFile(data string) []string {
	f, err := os.Open(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// removeSegment removes the System V shared memory segment (a small one:
// the server's memory is an anonymous mapping) that a killed postmaster
// left, as postmaster.pid in data names it, unless processes are still
// attached to it: then it reports busy. A server that shut down removed
// its own segment and its postmaster.pid.
func removeSegment(data string) (busy bool) {
	lines := pidFile(data)
	if len(lines) < 7 {
		return false
	}
	f := strings.Fields(lines[6])
	if len(f) != 2 {
		return false
	}
	key, err1 := strconv.ParseUint(f[0], 10, 32)
	id, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return false
	}
	var d unix.SysvShmDesc
	if _, err := unix.SysvShmCtl(id, unix.IPC_STAT, &d); err != nil || uint32(d.Perm.Key) != uint32(key) {
		return false // gone, or another segment now has that id
	}
	if d.Nattch != 0 {
		return true
	}
	_, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	return false
}
