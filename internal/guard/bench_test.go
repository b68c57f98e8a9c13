//go:build linux

package guard

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// treeJob starts 20 processes that each leave the session, then waits.
const treeJob = `for i in $(seq 20); do setsid sleep 100 & done; echo ready; wait`

// BenchmarkKillTree is the guard's way to end a job: SIGKILL every
// descendant it finds in /proc (again, until none is left), then collect
// them; measured from the request to the job being gone.
func BenchmarkKillTree(b *testing.B) {
	s := testguard.Test(b)
	for range b.N {
		b.StopTimer()
		r, w, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		j, err := Start(Config{Path: "/bin/sh", Args: []string{"sh", "-c", treeJob}, Env: append(os.Environ(), s.Env()),
			Files: []*os.File{os.Stdin, w, os.Stderr}, OwnGroup: true})
		if err != nil {
			b.Fatal(err)
		}
		w.Close()
		if line, _ := bufio.NewReader(r).ReadString('\n'); line != "ready\n" {
			b.Fatalf("job said %q", line)
		}
		r.Close()
		b.StartTimer()
		j.Signal(syscall.SIGKILL)
		<-j.Gone()
	}
}

// BenchmarkCgroupKill is the other way: the job started in a cgroup v2 of
// its own (clone3 into it), killed with cgroup.kill, measured until the
// cgroup has no process left. It needs a writable cgroup2 with cgroup.kill
// (Linux 5.14): root, or a delegated subtree.
func BenchmarkCgroupKill(b *testing.B) {
	root := os.Getenv("SLOTCTLTEST_CGROUP2")
	if root == "" {
		root = "/sys/fs/cgroup/unified"
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.kill"); err == nil {
			root = "/sys/fs/cgroup"
		}
	}
	s := testguard.Test(b)
	for i := range b.N {
		b.StopTimer()
		dir := filepath.Join(root, "slotctl-bench-"+strconv.Itoa(os.Getpid())+"-"+strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Skipf("no cgroup2 to make a job's cgroup in (%v): set SLOTCTLTEST_CGROUP2 to a delegated one", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
			os.Remove(dir)
			b.Skipf("no cgroup.kill: %v", err)
		}
		fd, err := syscall.Open(dir, syscall.O_DIRECTORY|syscall.O_RDONLY, 0)
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command("/bin/sh", "-c", treeJob)
		cmd.Env = append(os.Environ(), s.Env())
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Setpgid: true}
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		syscall.Close(fd)
		if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
			b.Fatalf("job said %q", line)
		}
		b.StartTimer()
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
			b.Fatal(err)
		}
		for populated(b, dir) {
			time.Sleep(100 * time.Microsecond)
		}
		b.StopTimer()
		_ = cmd.Wait()
		os.Remove(dir)
	}
}

func populated(b *testing.B, dir string) bool {
	ev, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		b.Fatal(err)
	}
	return strings.Contains(string(ev), "populated 1")
}
