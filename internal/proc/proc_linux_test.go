package proc

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestParseStatStart(t *testing.T) {
	// A command name with spaces and a ')' must not shift the fields.
	line := []byte("4242 (evil ) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100")
	got, err := parseStatStart(line)
	if err != nil || got != 987654 {
		t.Fatalf("parseStatStart = %d, %v; want 987654", got, err)
	}
	if _, err := parseStatStart([]byte("1 (x) S 1 2")); err == nil {
		t.Fatal("short stat line accepted")
	}
	if _, err := parseStatStart([]byte("garbage")); err == nil {
		t.Fatal("garbage accepted")
	}
}

func TestStartTimeTellsProcessesApart(t *testing.T) {
	self, err := StartTime(os.Getpid())
	if err != nil || self == 0 {
		t.Fatalf("StartTime(self) = %d, %v", self, err)
	}
	again, _ := StartTime(os.Getpid())
	if again != self {
		t.Fatalf("start time of one process changed: %d then %d", self, again)
	}
	cmd := exec.Command("sleep", "0.2")
	time.Sleep(20 * time.Millisecond) // at least one clock tick after ours
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	child, err := StartTime(cmd.Process.Pid)
	if err != nil || child < self {
		t.Fatalf("StartTime(child) = %d, %v; want >= %d", child, err, self)
	}
	if _, err := StartTime(1 << 30); err == nil {
		t.Fatal("StartTime of a pid that cannot exist succeeded")
	}
}

func TestClocks(t *testing.T) {
	if BootID() == "" || BootID() != BootID() {
		t.Fatalf("BootID = %q, not stable", BootID())
	}
	a := Boottime()
	time.Sleep(10 * time.Millisecond)
	if b := Boottime(); b-a < 10*time.Millisecond {
		t.Fatalf("Boottime advanced %v over a 10ms sleep", b-a)
	}
	if PidNS() == 0 {
		t.Fatal("PidNS unknown on Linux")
	}
}
