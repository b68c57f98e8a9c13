//go:build linux

package guard

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// TestMain runs the binary as a guard, or as a supervisor for
// TestSupervisorKilled, when started as one.
func TestMain(m *testing.M) {
	Main()
	if os.Getenv("GUARDTEST_SUPERVISOR") != "" {
		os.Exit(supervise())
	}
	os.Exit(testguard.Main(m))
}

// escapes is a job whose processes leave its group and session in every
// way a job does: setsid, a double fork, env -i (which drops the test
// guard's mark, so the tests kill by pid), nohup. Each sleeper prints its
// pid; the script then says "ready" and waits.
const escapes = `
setsid sh -c 'echo $$; exec sleep 300' &
(sh -c 'echo $$; exec sleep 300' &) 
env -i sh -c 'echo $$; exec sleep 300' &
nohup sh -c 'echo $$; exec sleep 300' 2>/dev/null &
sleep 0.2; echo ready; wait`

// supervise is the helper process: it starts the escapes job under a
// guard, passes on the job's output, and waits to be killed.
func supervise() int {
	r, w, err := os.Pipe()
	if err != nil {
		return 70
	}
	j, err := Start(Config{Path: "/bin/sh", Args: []string{"sh", "-c", escapes}, Env: os.Environ(),
		Files: []*os.File{os.Stdin, w, os.Stderr}, OwnGroup: true})
	if err != nil {
		fmt.Println("error", err)
		return 70
	}
	w.Close()
	fmt.Printf("guard %d\n", j.GuardPid())
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fmt.Println(sc.Text())
	}
	<-j.Gone()
	return 0
}

// readJob reads pids until "ready".
func readJob(t *testing.T, sc *bufio.Scanner) []int {
	t.Helper()
	var pids []int
	for sc.Scan() {
		line := sc.Text()
		if line == "ready" {
			return pids
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(line, "guard "))
		if err != nil {
			t.Fatalf("helper said %q", line)
		}
		pids = append(pids, pid)
	}
	t.Fatalf("helper ended before ready: %v", sc.Err())
	return nil
}

func startTimes(t *testing.T, pids []int) map[int]string {
	t.Helper()
	m := map[int]string{}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("process %d is not running: %v", pid, err)
		}
		m[pid] = string(b[strings.LastIndexByte(string(b), ')'):])
		m[pid] = strings.Fields(m[pid])[20]
	}
	return m
}

// running lists those of the processes (pid: start time) still running.
func running(procs map[int]string) []int {
	var out []int
	for pid, start := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')'):]))
		if f[20] == start && f[1] != "Z" {
			out = append(out, pid)
		}
	}
	return out
}

func killAll(procs map[int]string) {
	for _, pid := range running(procs) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// TestSupervisorKilled: a SIGKILLed supervisor leaves nothing of its job
// running, wherever its processes went — without the guard, every one of
// the escapes outlives it (the parent-death signal reaches only the
// command itself).
func TestSupervisorKilled(t *testing.T) {
	s := testguard.Test(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GUARDTEST_SUPERVISOR=1", s.Env())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	pids := readJob(t, sc)
	if len(pids) != 5 {
		t.Fatalf("helper said %v, want the guard and 4 sleepers", pids)
	}
	procs := startTimes(t, pids)
	t.Cleanup(func() { killAll(procs) })

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// Bounded for a loaded machine; the guard acts at once (a benchmark
	// measures how fast).
	deadline := time.Now().Add(20 * time.Second)
	for len(running(procs)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("20s after the supervisor was killed, still running: %v (guard %d)", running(procs), pids[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startJob starts script under a guard from this process.
func startJob(t *testing.T, script string, stdout *os.File) *Job {
	t.Helper()
	s := testguard.Test(t)
	j, err := Start(Config{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Env: append(os.Environ(), s.Env()),
		Files: []*os.File{os.Stdin, stdout, os.Stderr}, OwnGroup: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		j.Signal(syscall.SIGKILL)
		<-j.Gone()
	})
	return j
}

func waitFor(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not within 30s", what)
	}
}

// TestGoneWaitsForTheWholeJob: the command's exit is not the job's end
// while a process it started, in another session and ignoring SIGTERM,
// still runs; a SIGTERM to the job reaches it, a SIGKILL ends it.
func TestGoneWaitsForTheWholeJob(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	j := startJob(t, `setsid sh -c 'trap "echo term" TERM; echo started; while :; do sleep 0.05; done' & exit 3`, w)
	w.Close()
	sc := bufio.NewScanner(r)
	if !sc.Scan() || sc.Text() != "started" {
		t.Fatalf("job said %q, want started", sc.Text())
	}
	waitFor(t, j.Exited(), "the command's exit")
	if ws := j.Status(); !ws.Exited() || ws.ExitStatus() != 3 {
		t.Fatalf("status %v, want exit 3", ws)
	}
	select {
	case <-j.Gone():
		t.Fatal("the job is reported gone while a process of it runs")
	case <-time.After(100 * time.Millisecond):
	}
	j.Signal(syscall.SIGTERM)
	if !sc.Scan() || sc.Text() != "term" {
		t.Fatalf("job said %q, want term (SIGTERM to the process that left the session)", sc.Text())
	}
	select {
	case <-j.Gone():
		t.Fatal("the job is reported gone while a process of it runs")
	case <-time.After(100 * time.Millisecond):
	}
	j.Signal(syscall.SIGKILL)
	waitFor(t, j.Gone(), "the job's end after SIGKILL")
	if err := j.Err(); err != nil {
		t.Fatalf("Err: %v", err)
	}
}

// TestGoneAtOnce: a job that leaves nothing is gone with its command.
func TestGoneAtOnce(t *testing.T) {
	j := startJob(t, `kill -9 $$`, os.Stdout)
	waitFor(t, j.Gone(), "the job's end")
	if ws := j.Status(); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("status %v, want killed by SIGKILL", ws)
	}
}

// TestStartErrors: what exec says of the command comes back as its errno.
func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	notExec := dir + "/script"
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want error
	}{
		{dir + "/missing", syscall.ENOENT},
		{notExec, syscall.EACCES},
	} {
		_, err := Start(Config{Path: tc.path, Args: []string{"x"}, Env: os.Environ(), Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}, OwnGroup: true})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.path, err, tc.want)
		}
	}
}

// TestFilesAndGroups: extra descriptors reach the command at 3 and up, the
// guard's socket does not; off a terminal the command leads its own group,
// on one it shares the caller's.
func TestFilesAndGroups(t *testing.T) {
	for _, own := range []bool{true, false} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		xr, xw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		s := testguard.Test(t)
		j, err := Start(Config{Path: "/bin/sh", Args: []string{"sh", "-c", `echo extra >&3; ls -l /proc/$$/fd | grep -c socket:; ps -o pgid= -p $$`},
			Env: append(os.Environ(), s.Env()), Files: []*os.File{os.Stdin, w, os.Stderr, xw}, OwnGroup: own})
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		xw.Close()
		waitFor(t, j.Gone(), "the job's end")
		b := make([]byte, 100)
		n, _ := xr.Read(b)
		if string(b[:n]) != "extra\n" {
			t.Errorf("fd 3 got %q", b[:n])
		}
		out := make([]byte, 200)
		n, _ = r.Read(out)
		f := strings.Fields(string(out[:n]))
		if len(f) != 2 || f[0] != "0" {
			t.Errorf("own group %v: sockets and group %q, want no socket (the guard's is not the command's)", own, out[:n])
			continue
		}
		pgid, _ := strconv.Atoi(f[1])
		if own && pgid != j.Pid() || !own && pgid != syscall.Getpgrp() {
			t.Errorf("own group %v: the command's group is %d (its pid %d, ours %d)", own, pgid, j.Pid(), syscall.Getpgrp())
		}
		r.Close()
		xr.Close()
	}
}

// TestPrepared: a guard started before its command waits for it; given
// it, it runs it with the environment sent (here larger than one
// datagram), and closed without one it exits having started nothing.
func TestPrepared(t *testing.T) {
	s := testguard.Test(t)
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	p, err := Prepare(Config{Env: append(os.Environ(), s.Env()), Files: files, OwnGroup: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Close() // returns once the guard has exited

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, err = Prepare(Config{Env: append(os.Environ(), s.Env()), Files: []*os.File{os.Stdin, w, os.Stderr}, OwnGroup: true})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	big := strings.Repeat("x", 3*specChunk)
	j, err := p.Start("/bin/sh", []string{"sh", "-c", `printf '%s %s' "${#BIG}" "$A"`}, append(os.Environ(), s.Env(), "BIG="+big, "A=1", "A=2"), "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, j.Gone(), "the job's end")
	out := make([]byte, 100)
	n, _ := r.Read(out)
	if want := fmt.Sprintf("%d 2", len(big)); string(out[:n]) != want {
		t.Errorf("the command printed %q, want %q (the whole environment, the later of two A=)", out[:n], want)
	}
}

// TestGuardThatDoesNotAnswer: a guard that never says it started the
// command (stopped, or another program) fails the start after StartWait,
// and is killed.
func TestGuardThatDoesNotAnswer(t *testing.T) {
	s := testguard.Test(t)
	exe := t.TempDir() + "/mute"
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexec sleep 300\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { StartWait = d }(StartWait)
	StartWait = 200 * time.Millisecond
	_, err := Start(Config{Path: "/bin/true", Args: []string{"true"}, Env: append(os.Environ(), s.Env()),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}, OwnGroup: true, Exe: exe})
	if err == nil {
		t.Fatal("started under a guard that never answered")
	}
	if left := s.Running(); len(left) > 0 {
		t.Errorf("the mute guard still runs: %v", left)
	}
}

// TestLeaseEnd: a job whose supervisor stops telling its guard of renewals
// is stopped by the guard at the lease's end, SIGKILLed if it ignores
// SIGTERM; while the leases keep coming, it runs on.
func TestLeaseEnd(t *testing.T) {
	j := startJob(t, `trap "" TERM; while :; do sleep 0.05; done`, os.Stdout)
	for range 10 {
		j.Lease(2*time.Second, 3*time.Second) // ample room for a loaded machine
		time.Sleep(30 * time.Millisecond)
	}
	select {
	case <-j.Gone():
		t.Fatal("the job was stopped while its lease was renewed")
	default:
	}
	j.Lease(50*time.Millisecond, 150*time.Millisecond)
	waitFor(t, j.Gone(), "the job's end after its lease's")
	if ws := j.Status(); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("status %v, want killed by SIGKILL (it ignores SIGTERM)", ws)
	}
}

// TestLastWordAfterUnreadLease: a guard that exits with a lease message of
// slotctl's unread makes the kernel report ECONNRESET before the guard's
// queued last message; the job's exit must still be read, not taken for a
// guard that died alone.
func TestLastWordAfterUnreadLease(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "slotctl"), os.NewFile(uintptr(fds[1]), "guard")
	defer mine.Close()
	j := &Job{conn: mine}
	if _, err := mine.Write([]byte(msgLease + " 1000 2000")); err != nil {
		t.Fatal(err)
	}
	if _, err := theirs.Write([]byte(msgLast + " 0")); err != nil {
		t.Fatal(err)
	}
	theirs.Close() // the lease still unread
	kind, arg, err := j.read()
	if err != nil || kind != msgLast || arg != 0 {
		t.Fatalf("read = %q %d %v, want %q 0 <nil>", kind, arg, err, msgLast)
	}
	if _, _, err := j.read(); err == nil {
		t.Fatal("read after the guard's last message and exit: no error")
	}
}
