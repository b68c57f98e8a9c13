//go:build linux

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/diskfault"
	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// diskFaultBin passes the tests' slotctl, built by the parent, to the test
// run again in its mount namespace.
const diskFaultBin = "SLOTCTL_DISKFAULT_BIN"

// TestStoreDiskIOError: slotctl run on a store whose disk fails every
// write (EIO from fsync: the device behind the file system fails) exits 69
// with one line naming the store and the cause, never 70 or "corrupt"; the
// job never starts, and the store is as it was, both as the failing mount
// shows it and on the disk. On a working disk with what the broken one
// held, the store works. A real failing device (internal/testkit/diskfault:
// ext2 on a loop device whose memfd is sealed against writes), in a private
// mount namespace; skipped where the kernel refuses one.
func TestStoreDiskIOError(t *testing.T) {
	if os.Getenv(diskFaultBin) == "" {
		if testing.Short() {
			t.Skip("runs processes; skipped with -short")
		}
		t.Setenv(diskFaultBin, slotctlPath(t))
	}
	if !diskfault.InNamespace(t) {
		return
	}
	bin, out := os.Getenv(diskFaultBin), t.TempDir()
	mnt := t.TempDir()
	disk := diskfault.Ext2(t, mnt, 4<<20)
	dir := filepath.Join(mnt, "s")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "slots.db")
	scope := testguard.Test(t)
	slotctl := func(args ...string) (code int, stdout, stderr string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--store", path}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + out, "GORACE=atexit_sleep_ms=0", scope.Env()}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case ctx.Err() != nil:
			t.Fatalf("slotctl %v: did not end within a minute (killed)", args)
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		return code, o.String(), e.String()
	}
	tickets := func(when string) int {
		t.Helper()
		code, stdout, stderr := slotctl("ls", "-o", "json")
		var snap struct {
			Tickets []json.RawMessage `json:"tickets"`
		}
		if err := json.Unmarshal([]byte(stdout), &snap); code != 0 || err != nil {
			t.Fatalf("%s: ls -o json: exit %d, %v:\n%s%s", when, code, err, stdout, stderr)
		}
		return len(snap.Tickets)
	}

	if code, _, stderr := slotctl("run", "--limit", "x", "--", "true"); code != 0 {
		t.Fatalf("run on the working disk: exit %d: %s", code, stderr)
	}
	disk.Break()
	ran := filepath.Join(out, "ran")
	code, _, stderr := slotctl("run", "--limit", "x", "--", "touch", ran)
	t.Logf("run on the failing disk: exit %d: %s", code, strings.TrimSpace(stderr))
	if code != exitUnavailable {
		t.Errorf("run on the failing disk: exit %d, want %d", code, exitUnavailable)
	}
	if n := len(lines(stderr)); n != 1 || !strings.Contains(stderr, path) || !strings.Contains(stderr, "input/output error") {
		t.Errorf("run on the failing disk: want one line naming %s and the cause, got %d:\n%s", path, n, stderr)
	}
	if strings.Contains(stderr, "corrupt") || strings.Contains(stderr, "move the file aside") {
		t.Errorf("run on the failing disk: the message calls a sound store corrupt:\n%s", stderr)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("run on the failing disk: the job ran")
	}
	if n := tickets("on the failing disk"); n != 0 {
		t.Errorf("on the failing disk: %d tickets, want none: the failed run left its ticket", n)
	}
	disk.Reattach()
	if n := tickets("on the disk after the fault"); n != 0 {
		t.Errorf("on the disk after the fault: %d tickets, want none", n)
	}
	if code, _, stderr := slotctl("run", "--limit", "x", "--", "touch", ran); code != 0 {
		t.Errorf("run on a working disk with what the failing one held: exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Error("run on a working disk: the job did not run")
	}
}
