//go:build linux

package cli

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/proc"
)

// Case 4: a host name is not an identity. A cloned VM keeps its host name
// and gets another boot id; here a mount namespace with another uuid bound
// over /proc/sys/kernel/random/boot_id stands in for it. A live holder on
// the "clone", on an etcd store, is another host's: a run and a reap here
// must leave it its slot (its lease, which the server keeps, decides).
// (Before, "another boot id, this host name" was a previous boot of this
// host: reaped with its lease nearly whole, and the next job ran beside it.)
func TestEtcdClonedHostNotReaped(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to bind-mount a boot id")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("needs unshare(1)")
	}
	e, _ := etcdPTEnv(t)
	const cloneBoot = "c1c1c1c1-0000-4000-8000-c10ec10ec10e"
	if err := os.WriteFile(e.path("clone-boot-id"), []byte(cloneBoot+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(unshare, "--mount", "sh", "-c", `mount --bind "$1" /proc/sys/kernel/random/boot_id && cat /proc/sys/kernel/random/boot_id`,
		"sh", e.path("clone-boot-id")).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != cloneBoot {
		t.Skipf("cannot bind-mount a boot id here: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	clone := e.startProgram(ctx, "clone", unshare, "--mount", "sh", "-c",
		`mount --bind "$1" /proc/sys/kernel/random/boot_id && exec "$2" run --limit c --slots 1 --ttl 30s -- sh -c 'cat /proc/sys/kernel/random/boot_id > clone.boot; echo $$ > clone.pid; exec sleep 60'`,
		"sh", e.path("clone-boot-id"), e.bin)
	e.notePid(int(ptWaitInt(t, e.path("clone.pid"), 10*time.Second)))
	if b, _ := os.ReadFile(e.path("clone.boot")); strings.TrimSpace(string(b)) != cloneBoot || cloneBoot == proc.BootID() {
		t.Fatalf("the clone's job saw boot id %q, want %q (this host's is %q)", b, cloneBoot, proc.BootID())
	}
	out, err := e.output("ls", "-o", "json", "c")
	if host, _ := os.Hostname(); err != nil || !strings.Contains(out, `"host": "`+host+`"`) {
		t.Fatalf("the clone's ticket does not name this host %q: %v\n%s", host, err, out)
	}

	if code := e.start(ctx, "run", "run", "--limit", "c", "--wait", "0", "--", "true").wait(t, 30*time.Second); code != exitBusy {
		t.Errorf("a run here beside the clone's live holder: exit %d, want %d (busy)", code, exitBusy)
	}
	r := e.start(ctx, "reap", "reap")
	if code := r.wait(t, 30*time.Second); code != 0 {
		t.Errorf("reap: exit %d: %s", code, r.stderr())
	}
	if out, _ := os.ReadFile(e.path("reap.stdout")); strings.Contains(string(out), "reaped") {
		t.Errorf("reap here took the clone's live holder's slot: %s", out)
	}
	select {
	case <-clone.done:
		t.Errorf("the clone's holder ended: %s", clone.stderr())
	default:
	}
}
