//go:build linux

// Package proctest starts real processes for tests of proof of death: every
// process started is killed (with its group, when it leads one) and reaped
// in the test's cleanup, and every wait on the kernel is bounded.
package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Settle bounds any wait for the kernel to catch up.
const Settle = 5 * time.Second

// A Kid is a real child process of the test.
type Kid struct {
	Cmd   *exec.Cmd
	Pid   int
	Start uint64 // its start time, clock ticks after boot (/proc/PID/stat field 22)
	Group bool   // leads its own process group (pgid == pid)

	once   sync.Once
	waited atomic.Bool
	err    error
}

// Spawn starts name args with env added to the test's environment, in its
// own process group when group is set, and registers its killing and
// reaping.
func Spawn(t testing.TB, group bool, env []string, name string, args ...string) *Kid {
	t.Helper()
	cmd := exec.Command(name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	if group {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	k := &Kid{Cmd: cmd, Pid: cmd.Process.Pid, Group: group}
	t.Cleanup(func() {
		if !k.Reaped() { // not reaped: the pid (and group id) are still ours
			k.signal(unix.SIGKILL)
		}
		_ = k.Wait()
	})
	_, start, err := stat(k.Pid)
	if err != nil || start == 0 {
		t.Fatalf("start time of %d: %d, %v", k.Pid, start, err)
	}
	k.Start = start
	return k
}

// Wait reaps the child (once) and returns what exec.Cmd.Wait did.
func (k *Kid) Wait() error {
	k.once.Do(func() { k.err = k.Cmd.Wait(); k.waited.Store(true) })
	return k.err
}

// Reaped reports whether Wait has reaped it.
func (k *Kid) Reaped() bool { return k.waited.Load() }

// Kill SIGKILLs it (its group too when it leads one) and reaps it: a
// supervisor killed.
func (k *Kid) Kill() {
	k.signal(unix.SIGKILL)
	_ = k.Wait()
}

func (k *Kid) signal(sig unix.Signal) {
	if k.Group {
		_ = unix.Kill(-k.Pid, sig)
	}
	_ = k.Cmd.Process.Signal(sig)
}

// GonePid is the pid and start time of a process that exited and was reaped.
func GonePid(t testing.TB) (int, uint64) {
	t.Helper()
	k := Spawn(t, false, nil, "sleep", "30")
	k.Kill()
	return k.Pid, k.Start
}

// EmptyGroup is the id and leader start time of a process group whose only
// member exited and was reaped.
func EmptyGroup(t testing.TB) (int, uint64) {
	t.Helper()
	k := Spawn(t, true, nil, "sleep", "30")
	k.Kill()
	return k.Pid, k.Start
}

// Job starts the job of ticket id as slotctl runs one (see JobOf), under a
// supervisor that is gone already: an orphaned job.
func Job(t testing.TB, id string) *Kid {
	t.Helper()
	pid, start := GonePid(t)
	return JobOf(t, id, SupervisorVar(pid, start))
}

// SupervisorVar is the SLOTCTL_SUPERVISOR variable that a supervisor (pid,
// start) in this process's pid namespace exports to its job.
func SupervisorVar(pid int, start uint64) string {
	var st unix.Stat_t
	_ = unix.Stat("/proc/self/ns/pid", &st)
	return fmt.Sprintf("SLOTCTL_SUPERVISOR=%d:%d:%d", pid, start, st.Ino)
}

// JobOf starts the job of ticket id as slotctl runs one: its own process
// group, SLOTCTL_TICKET and env in its environment, with a grandchild (sh -c
// 'sleep 30 & wait'); it returns once both run. Its supervisor is not the
// test. Cleanup kills the group and reaps all of it, the grandchild too (the
// test process becomes a subreaper for that).
func JobOf(t testing.TB, id string, env ...string) *Kid {
	t.Helper()
	if err := subreaper(); err != nil {
		t.Logf("PR_SET_CHILD_SUBREAPER: %v (killed grandchildren stay zombies)", err)
	}
	k := Spawn(t, true, append([]string{"SLOTCTL_TICKET=" + id}, env...), "sh", "-c", "sleep 30 & wait")
	for deadline := time.Now().Add(Settle); len(Members(k.Pid)) < 2; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("job group %d: running members %v after %v, want sh and sleep", k.Pid, Members(k.Pid), Settle)
		}
	}
	var grandkids []int
	for _, m := range Members(k.Pid) {
		if m != k.Pid {
			grandkids = append(grandkids, m)
		}
	}
	t.Cleanup(func() { // runs before Spawn's: kill the group, then reap all of it
		if !k.Reaped() {
			_ = unix.Kill(-k.Pid, unix.SIGKILL)
		}
		_ = k.Wait() // sh has exited: its children are ours now (subreaper)
		// Until the whole group is gone: a member still dying would be
		// seen by the next test (the same ticket id, another supervisor).
		for deadline := time.Now().Add(Settle); ; time.Sleep(time.Millisecond) {
			for _, g := range grandkids {
				ReapOrphan(g)
			}
			if len(Members(k.Pid)) == 0 || time.Now().After(deadline) {
				break
			}
		}
	})
	return k
}

// Subreaper makes the test process adopt its orphaned grandchildren, so that
// the members of a killed job are reaped, not left as zombies.
func Subreaper() error { return subreaper() }

// subreaper makes the test process adopt its orphaned grandchildren, so
// that the members of a killed job are reaped, not left as zombies.
var subreaper = sync.OnceValue(func() error { return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) })

// ReapOrphan reaps pid, a grandchild adopted by this (subreaper) process once
// its parent exited; it gives up when pid is not its child (reaped by its
// own parent already) or after Settle.
func ReapOrphan(pid int) {
	for deadline := time.Now().Add(Settle); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if wpid, err := unix.Wait4(pid, nil, unix.WNOHANG, nil); wpid == pid || err != nil {
			return
		}
	}
}

// Members lists the running (non-zombie) members of process group pgid.
func Members(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, _, err := stat(pid); err == nil && f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			out = append(out, pid)
		}
	}
	return out
}

// stat reads /proc/PID/stat: its fields from the third (state) on, and the
// start time.
func stat(pid int) ([]string, uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // f[0] is field 3
	if len(f) < 20 {
		return nil, 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	start, err := strconv.ParseUint(f[22-3], 10, 64)
	return f, start, err
}
