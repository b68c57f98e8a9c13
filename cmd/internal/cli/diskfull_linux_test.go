//go:build linux

package cli

import (
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

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// diskFullScript runs in a mount namespace of its own (unshare -m), so the
// small tmpfs it mounts goes with it. It makes store b and runs a job on it
// while there is room, fills the file system, then runs a job on a fresh
// store a and on b; then frees the room and looks at both stores again.
// Everything it learns goes to files in $OUT, outside the tmpfs.
const diskFullScript = `
set -u
mount -t tmpfs -o size=512k slotctl-test "$D" || exit 90
cd "$D" && mkdir a b || exit 91
"$BIN" --store "$D/b/slots.db" run --limit x -- true || exit 92
dd if=/dev/zero of=fill bs=4k 2>/dev/null
for s in a b; do
	"$BIN" --store "$D/$s/slots.db" run --limit x --label "$(head -c 1000 /dev/zero | tr '\0' l)" -- touch "$OUT/ran-$s" 2> "$OUT/err-$s"
	echo $? > "$OUT/code-$s"
done
stat -c %s a/slots.db > "$OUT/size-a"
rm fill
for s in a b; do
	"$BIN" --store "$D/$s/slots.db" ls -o json > "$OUT/ls-$s" 2>&1 || echo "ls of $s failed" >> "$OUT/after"
	"$BIN" --store "$D/$s/slots.db" run --limit x -- true 2>> "$OUT/after" || echo "run on $s failed" >> "$OUT/after"
done
exit 0
`

// TestStoreDiskFull: a store on a full file system is exit 69 naming the
// store and the cause (no space left on device), not 70 "internal error";
// the child does not run, nothing is half-written (a fresh store's file
// stays empty, a store in use keeps what it had), and once there is room
// again both stores work. A real full tmpfs, mounted in a private mount
// namespace; skipped where this process may not mount one.
func TestStoreDiskFull(t *testing.T) {
	bin := lsBin(t)
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1) to mount a tmpfs in a private mount namespace")
	}
	dir, out := t.TempDir(), t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, unshare, "-m", "sh", "-c", diskFullScript)
	cmd.Env = append(os.Environ(), "BIN="+bin, "D="+mnt, "OUT="+out, "GORACE=atexit_sleep_ms=0", testguard.Test(t).Env())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	b, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && (ee.ExitCode() == 90 || ee.ExitCode() == 1 && strings.Contains(string(b), "unshare")):
		t.Skipf("cannot mount a tmpfs in a private mount namespace here: %s", b)
	case err != nil:
		t.Fatalf("the disk-full script: %v\n%s", err, b)
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(out, name))
		return string(b)
	}
	for _, s := range []string{"a", "b"} {
		path := filepath.Join(mnt, s, "slots.db")
		if code := strings.TrimSpace(read("code-" + s)); code != "69" {
			t.Errorf("store %s on a full disk: exit %s, want 69; stderr:\n%s", s, code, read("err-"+s))
		}
		stderr := read("err-" + s)
		t.Logf("store %s on a full disk: %s", s, strings.TrimSpace(stderr))
		if n := len(lines(stderr)); n != 1 || !strings.Contains(stderr, path) || !strings.Contains(stderr, "no space left on device") {
			t.Errorf("store %s on a full disk: want one line naming %s and the cause, got %d:\n%s", s, path, n, stderr)
		}
		if strings.Contains(stderr, "corrupt") || strings.Contains(stderr, "move the file aside") {
			t.Errorf("store %s on a full disk: the message calls a sound store corrupt:\n%s", s, stderr)
		}
		if _, err := os.Stat(filepath.Join(out, "ran-"+s)); err == nil {
			t.Errorf("store %s on a full disk: the child ran", s)
		}
		var snap struct {
			Tickets []json.RawMessage `json:"tickets"`
		}
		if err := json.Unmarshal([]byte(read("ls-"+s)), &snap); err != nil || len(snap.Tickets) != 0 {
			t.Errorf("store %s once there was room: ls -o json: %v, %d tickets, want none:\n%s", s, err, len(snap.Tickets), read("ls-"+s))
		}
	}
	if size := strings.TrimSpace(read("size-a")); size != "0" {
		t.Errorf("the fresh store's file after the full disk: %s bytes, want 0 (empty, not half initialised)", size)
	}
	if after := read("after"); after != "" {
		t.Errorf("once there was room again:\n%s", after)
	}
}
