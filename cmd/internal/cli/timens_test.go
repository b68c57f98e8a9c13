//go:build linux

package cli

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Case 5: CLOCK_BOOTTIME (and every /proc start time) is offset in a time
// namespace while the boot id stays the same. A bbolt store's deadlines are
// on the host's clock whichever namespace writes or reads them: a run and
// a reap inside `unshare -T --boottime 3600` see a live holder outside as
// live, a holder inside a namespace set back 10 minutes is not taken for
// expired outside, and once it dies its slot comes back at once, on proof
// of death, not at a deadline on a clock off by the offset. (Before, the
// first run reaped the live holder as "expired 59m ago", and so did the
// run outside.)
func TestTimeNamespaceSharesTheClock(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for a time namespace")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("needs unshare(1)")
	}
	if out, err := exec.Command(unshare, "--time", "--fork", "--boottime", "1", "true").CombinedOutput(); err != nil {
		t.Skipf("no time namespaces here (util-linux unshare --time --boottime): %v: %s", err, out)
	}
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	inside := func(name, offset string, args ...string) *ptProc {
		return e.startProgram(ctx, name, unshare, append([]string{"--time", "--fork", "--boottime", offset, e.bin}, args...)...)
	}

	// A live holder outside; a run and a reap inside, an hour ahead.
	h := e.start(ctx, "holder-a", "run", "--limit", "a", "--slots", "1", "--ttl", "30s", "--", "sh", "-c", "touch held-a; exec sleep 60")
	ptWaitFor(t, "holder-a's child", 10*time.Second, func() bool { return ptExists(e.path("held-a")) })
	if code := inside("run-a", "3600", "run", "--limit", "a", "--wait", "0", "--", "true").wait(t, 30*time.Second); code != exitBusy {
		t.Errorf("a run an hour ahead, beside a live holder: exit %d, want %d (busy)", code, exitBusy)
	}
	r := inside("reap-a", "3600", "reap")
	if code := r.wait(t, 30*time.Second); code != 0 {
		t.Errorf("reap an hour ahead: exit %d: %s", code, r.stderr())
	}
	if out, _ := os.ReadFile(e.path("reap-a.stdout")); strings.Contains(string(out), "reaped") {
		t.Errorf("reap an hour ahead took a live holder's slot: %s", out)
	}
	select {
	case <-h.done:
		t.Errorf("the live holder outside ended: %s", h.stderr())
	default:
	}

	// A holder inside, 10 minutes behind; a run outside.
	u := inside("holder-b", "-600", "run", "--limit", "b", "--slots", "1", "--ttl", "30s", "--", "sh", "-c", "echo $$ > pid-b; exec sleep 60")
	child := int(ptWaitInt(t, e.path("pid-b"), 10*time.Second))
	e.notePid(child)
	sup := crashChildNamed(t, u.cmd.Process.Pid, "slotctl", 5*time.Second)
	if code := e.start(ctx, "run-b", "run", "--limit", "b", "--wait", "0", "--", "true").wait(t, 30*time.Second); code != exitBusy {
		t.Errorf("a run beside a live holder 10 minutes behind: exit %d, want %d (busy)", code, exitBusy)
	}
	crashSignal(t, sup, syscall.SIGKILL) // its child dies with it
	_ = u.wait(t, 10*time.Second)
	ptWaitFor(t, "the dead holder's child gone", 10*time.Second, func() bool { return ptGone(child) })
	// Well within its 30s lease: only the proof of death can free it.
	b2 := e.start(ctx, "run-b2", "run", "--limit", "b", "--wait", "15s", "--", "true")
	if code := b2.wait(t, 30*time.Second); code != 0 {
		t.Errorf("a run after the holder 10 minutes behind died: exit %d, want 0 (its slot not stranded): %s", code, b2.stderr())
	}
	t.Logf("after the holder 10 minutes behind died, a run outside was admitted in %s", ptMS(b2.exitedAt.Sub(b2.started)))
}
