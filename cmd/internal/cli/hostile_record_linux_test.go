//go:build linux

package cli

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// TestAttackOversizedRecord: a member of a shared store's group writes,
// straight into the bbolt file, a ticket whose label is 60 MB. Every reader
// (root's ls, the packaged reaper under its MemoryMax=) must refuse the
// store, exit 69 naming it, without reading the record: its peak RSS stays
// within a few MB of what the same command costs on the store without it.
// Peak RSS is the kernel's count for the process (see peakRSS), so load on
// the machine does not change it; the bound leaves room for a -race build.
func TestAttackOversizedRecord(t *testing.T) {
	bin := lsBin(t)
	dir := t.TempDir()
	st := filepath.Join(dir, "slots.db")
	env := append(os.Environ(), "SLOTCTL_STORE="+st, "GORACE=atexit_sleep_ms=0", testguard.Test(t).Env())
	if code, stderr, _ := peakRSS(t, env, bin, "run", "--limit", "build", "--", "true"); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, stderr)
	}
	base := map[string]int64{}
	for _, cmd := range []string{"ls", "reap"} {
		code, stderr, rss := peakRSS(t, env, bin, cmd)
		if code != 0 {
			t.Fatalf("%s on the clean store: exit %d\n%s", cmd, code, stderr)
		}
		base[cmd] = rss
	}

	writeHostileTicket(t, st, strings.Repeat("A", 60<<20))

	const slack = 32 << 20 // the record is 60 MB: reading it costs at least that
	for _, cmd := range []string{"ls", "reap"} {
		code, stderr, rss := peakRSS(t, env, bin, cmd)
		if code != 69 {
			t.Errorf("%s: exit %d, want 69\n%.500s", cmd, code, stderr)
		}
		if n := len(lines(stderr)); n != 1 || !strings.Contains(stderr, st) {
			t.Errorf("%s: want one line naming the store %s, got %d:\n%.500s", cmd, st, n, stderr)
		}
		t.Logf("%s: peak RSS %d MiB (%d MiB on the clean store): %s", cmd, rss>>20, base[cmd]>>20, strings.TrimSpace(stderr))
		if rss > base[cmd]+slack {
			t.Errorf("%s: peak RSS %d MiB, %d MiB on the clean store: the oversized record was read", cmd, rss>>20, base[cmd]>>20)
		}
	}
}

const peakRSSVar = "SLOTCTLTEST_PEAK_RSS"

// peakRSS runs argv and returns its exit code, its stderr and its peak RSS.
// The kernel's figure for a process (getrusage's ru_maxrss) includes the
// peak of the memory it was started from: os/exec starts a child sharing
// its parent's memory (vfork) until exec, so a child of this test binary
// would count the whole test process's peak. A helper process (this binary,
// started fresh) starts argv instead, so the figure is argv's own, floored
// at the small helper's.
func peakRSS(t *testing.T, env []string, argv ...string) (code int, stderr string, rss int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec, _ := json.Marshal(argv)
	cmd := exec.CommandContext(ctx, testBinary(t), "-test.run=^TestHelperPeakRSS$")
	cmd.Env = append(env, peakRSSVar+"="+string(spec))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	for _, l := range lines(string(out)) {
		if n, _ := fmt.Sscanf(l, "peak-rss %d exit %d", &rss, &code); n == 2 {
			return code, errb.String(), rss
		}
	}
	t.Fatalf("peak RSS of %q: %v\n%s%s", argv, err, out, errb.String())
	return 0, "", 0
}

// TestHelperPeakRSS is not a test: run by peakRSS, it runs the command
// SLOTCTLTEST_PEAK_RSS names (a JSON list) and prints its exit code and
// peak RSS in bytes.
func TestHelperPeakRSS(t *testing.T) {
	spec := os.Getenv(peakRSSVar)
	if spec == "" {
		t.Skip("helper for TestAttackOversizedRecord")
	}
	var argv []string
	if err := json.Unmarshal([]byte(spec), &argv); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	fmt.Printf("peak-rss %d exit %d\n", ru.Maxrss*1024, cmd.ProcessState.ExitCode()) // Linux counts KiB
}

// writeHostileTicket puts into the bbolt file path, as any member of its
// group can, a waiting ticket of limit "build" labelled label.
func writeHostileTicket(t *testing.T, path, label string) {
	t.Helper()
	lock, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]any{"v": 2, "id": "hostile", "limit": "build", "state": "waiting", "fence": 1000, "slot": -1,
		"ttl_ns": int64(time.Hour), "deadline_boot": "b", "deadline_mono_ns": int64(time.Hour),
		"holder": map[string]any{"host": "h", "pid": 1, "label": label}})
	db, err := bolt.Open(path, 0, &bolt.Options{Timeout: 5 * time.Second, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		q, err := tx.Bucket([]byte("queue")).CreateBucketIfNotExists([]byte("build"))
		if err != nil {
			return err
		}
		var k [8]byte
		binary.BigEndian.PutUint64(k[:], 1000)
		return q.Put(k[:], rec)
	})
	if err != nil {
		t.Fatal(err)
	}
}
