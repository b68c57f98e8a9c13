//go:build linux

package testguard

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// A job that forks, leaves its group and its session: everything of it is
// found by its mark and killed; nothing outside the scope is.
func TestKillFindsTheWholeTree(t *testing.T) {
	s := Test(t)
	other := exec.Command("sleep", "60")
	other.Env = append(os.Environ(), Root().Sub().Env())
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()

	job := exec.Command("sh", "-c", "sleep 60 & setsid sleep 60 & (sleep 60 &) ; echo ok; wait")
	job.Env = append(os.Environ(), s.Env())
	out, err := job.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := out.Read(buf); err != nil {
		t.Fatal(err)
	}
	// setsid and the subshell may still be starting, and a process in the
	// middle of exec reads with an empty environment: wait for three sleeps
	// by name, not for a count that a forking setsid or subshell can fill.
	deadline := time.Now().Add(10 * time.Second)
	for sleeps(s.Running()) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.Running(); len(got) != 4 || sleeps(got) != 3 {
		t.Fatalf("scope runs %d processes, want sh and three sleeps: %v", len(got), got)
	}
	killed := s.Kill()
	_ = job.Wait()
	if len(killed) != 4 {
		t.Errorf("killed %v, want 4 processes", killed)
	}
	if left := s.Running(); len(left) != 0 {
		t.Errorf("still running after Kill: %v", left)
	}
	if st, _ := os.ReadFile("/proc/" + strconv.Itoa(other.Process.Pid) + "/stat"); len(st) == 0 || strings.Contains(string(st), ") Z ") {
		t.Errorf("a process of another scope was killed")
	}
}

func sleeps(ps []Proc) int {
	n := 0
	for _, p := range ps {
		if p.Argv == "sleep 60" {
			n++
		}
	}
	return n
}

func TestCarries(t *testing.T) {
	for _, c := range []struct {
		env  string
		want bool
	}{
		{"A=1\x00SLOTCTLTEST_GUARD=7-9\x00", true},
		{"SLOTCTLTEST_GUARD=7-9.3.1", true},
		{"SLOTCTLTEST_GUARD=7-99", false},
		{"SLOTCTLTEST_GUARD=7-", false},
		{"X_SLOTCTLTEST_GUARD=7-9", false},
		{"", false},
	} {
		if got := carries([]byte(c.env), []byte("SLOTCTLTEST_GUARD=7-9")); got != c.want {
			t.Errorf("carries(%q) = %v, want %v", c.env, got, c.want)
		}
	}
}

// Main fails a run whose test left a process behind, names it, and kills
// it: the test binary is run again as a child whose one test starts a
// sleep and returns.
func TestMainFailsOnALeftover(t *testing.T) {
	if os.Getenv("TESTGUARD_LEAVE") != "" {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(os.Getenv("TESTGUARD_LEAVE"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
			t.Fatal(err)
		}
		return // the sleep outlives the test
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	child := exec.Command(os.Args[0], "-test.run=^TestMainFailsOnALeftover$", "-test.count=1")
	child.Env = append(os.Environ(), "TESTGUARD_LEAVE="+pidFile)
	out, err := child.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("the child's run exited %v, want 1 (a process outlived its test); output:\n%s", err, out)
	}
	if !strings.Contains(string(out), "1 processes outlived the tests") || !strings.Contains(string(out), "sleep 60") {
		t.Errorf("the child's run does not name the sleep it left:\n%s", out)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.ReadFile("/proc/" + string(b) + "/stat"); err == nil && !strings.Contains(string(st), ") Z ") {
		t.Errorf("the leftover sleep %s still runs", b)
	}
}
