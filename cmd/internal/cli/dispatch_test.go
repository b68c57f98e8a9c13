package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// How slotctl is built. The released slotctl (cmd/slotctl) has no etcd
// client and hands etcd stores to slotctl-etcd (cmd/slotctl-etcd), the same
// command with it (.goreleaser.yaml); both static, stripped, without build
// paths.
var (
	releaseSlotctl     = buildOptions{main: "slotctl", release: true}
	releaseSlotctlEtcd = buildOptions{main: "slotctl-etcd", tags: "grpcnotrace", release: true}
)

type buildOptions struct {
	main    string // the command under cmd/: slotctl or slotctl-etcd
	tags    string
	release bool // as released (slower to build: its own cache entries), else as go test builds
}

// buildSlotctl builds cmd/<o.main> into bin.
func buildSlotctl(t testing.TB, bin string, o buildOptions) {
	t.Helper()
	args := []string{"build", "-tags", o.tags, "-o", bin}
	env := os.Environ()
	if o.release {
		args = append(args, "-trimpath", "-ldflags", "-s -w")
		env = append(env, "CGO_ENABLED=0") // static: no dynamic loader at start
	}
	args = append(args, "../../../cmd/"+o.main)
	build := exec.Command("go", args...)
	build.Env = env
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// cmd/slotctl links no etcd client (what go install gives, without build
// tags); given an etcd store it becomes slotctl-etcd (beside it, else on
// PATH), arguments and environment unchanged, and says plainly when there is
// none, or when "slotctl-etcd" is slotctl itself (no exec loop).
func TestSlotctlHandsEtcdToHelper(t *testing.T) {
	longtest.Skip(t, "builds slotctl twice")
	deps, err := exec.Command("go", "list", "-deps", "../../../cmd/slotctl").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(deps)) {
		if strings.HasPrefix(dep, "go.etcd.io/etcd/") || strings.HasPrefix(dep, "google.golang.org/grpc") || dep == "github.com/slotctl/slotctl/cmd/internal/etcdcli" ||
			strings.HasPrefix(dep, "github.com/prometheus/") || strings.HasPrefix(dep, "google.golang.org/protobuf") {
			t.Errorf("cmd/slotctl links %s", dep)
		}
	}

	dir := t.TempDir()
	both, alone, loop := filepath.Join(dir, "both"), filepath.Join(dir, "alone"), filepath.Join(dir, "loop")
	buildSlotctl(t, filepath.Join(both, "slotctl"), buildOptions{main: "slotctl"})
	buildSlotctl(t, filepath.Join(both, "slotctl-etcd"), buildOptions{main: "slotctl-etcd"})
	// The binary itself, symbols unstripped: no etcd client code in it; and
	// slotctl-etcd's has (the check can see it).
	for bin, want := range map[string]bool{"slotctl": false, "slotctl-etcd": true} {
		syms, err := exec.Command("go", "tool", "nm", filepath.Join(both, bin)).Output()
		if err != nil {
			t.Fatalf("go tool nm %s: %v", bin, err)
		}
		if got := strings.Contains(string(syms), " go.etcd.io/etcd/client/"); got != want {
			t.Errorf("%s: has go.etcd.io/etcd/client symbols: %v, want %v", bin, got, want)
		}
	}
	for _, d := range []string{alone, loop} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(both, "slotctl"), filepath.Join(d, "slotctl")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(both, "slotctl"), filepath.Join(loop, "slotctl-etcd")); err != nil {
		t.Fatal(err)
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	etcdURL := "etcd://" + srv.Endpoint + "/dispatch"
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "XDG_CONFIG_HOME=" + filepath.Join(dir, "config"), "XDG_STATE_HOME=" + filepath.Join(dir, "state")}
	slotctl := func(binDir string, args ...string) (int, string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var out, errOut bytes.Buffer
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "slotctl"), args...)
		cmd.Env, cmd.Stdout, cmd.Stderr, cmd.Dir = env, &out, &errOut, dir
		err := cmd.Run()
		if ctx.Err() != nil {
			t.Fatalf("slotctl %q: no exit within 20s", args)
		}
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, out.String(), errOut.String()
	}

	// With slotctl-etcd beside it: etcd runs, ls, and etcd's own errors.
	if code, out, errs := slotctl(both, "run", "--store", etcdURL, "--limit", "d", "--", "sh", "-c", "echo $SLOTCTL_STORE $SLOTCTL_SLOT"); code != 0 || out != etcdURL+" 0\n" {
		t.Errorf("run on etcd: exit %d, stdout %q, stderr %q; want 0 and %q", code, out, errs, etcdURL+" 0\n")
	}
	if code, out, errs := slotctl(both, "limit", "ls", "--store", etcdURL); code != 0 || !strings.Contains(out, "d ") {
		t.Errorf("limit ls on etcd: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// The store from the environment (seen before parsing) and from the
	// config file (seen once resolved): the same.
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("store: "+etcdURL+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, from := range [][]string{{"SLOTCTL_STORE=" + etcdURL}, {"SLOTCTL_CONFIG=" + filepath.Join(dir, "config.yaml")}} {
		saved := env
		env = append(slices.Clone(env), from...)
		if code, out, errs := slotctl(both, "limit", "ls", "d"); code != 0 || !strings.Contains(out, "d ") {
			t.Errorf("%s: limit ls: exit %d, stdout %q, stderr %q", from[0], code, out, errs)
		}
		env = saved
	}
	if code, _, errs := slotctl(both, "ls", "--store", "etcd://host"); code != exitUsage || !strings.Contains(errs, `endpoint "host": want HOST:PORT`) {
		t.Errorf("a bad etcd URL: exit %d, stderr %q; want 64 naming it", code, errs)
	}
	// The embedded store needs no helper; etcd without one is 69, naming it.
	for _, d := range []string{both, alone} {
		if code, _, errs := slotctl(d, "run", "--store", filepath.Join(dir, "slots.db"), "--limit", "b", "--", "true"); code != 0 {
			t.Errorf("%s: run on the embedded store: exit %d, stderr %q", filepath.Base(d), code, errs)
		}
	}
	// metrics, on either store, is slotctl-etcd's (the Prometheus encoder
	// and protobuf's init are not slotctl's): handed on, or 69 naming it.
	for _, st := range []string{filepath.Join(dir, "slots.db"), etcdURL} {
		if code, out, errs := slotctl(both, "metrics", "--store", st); code != 0 || !strings.Contains(out, "slotctl_limit_slots{limit=") {
			t.Errorf("metrics on %s: exit %d, stdout %q, stderr %q; want 0 and the limits' gauges", st, code, out, errs)
		}
	}
	if code, _, errs := slotctl(alone, "metrics", "--store", filepath.Join(dir, "slots.db")); code != exitUnavailable || !strings.Contains(errs, "slotctl-etcd") || strings.Count(errs, "\n") != 1 {
		t.Errorf("metrics without slotctl-etcd: exit %d, stderr %q; want 69 and one line naming slotctl-etcd", code, errs)
	}
	if code, _, errs := slotctl(alone, "ls", "--store", etcdURL); code != exitUnavailable || !strings.Contains(errs, "slotctl-etcd") || strings.Count(errs, "\n") != 1 {
		t.Errorf("etcd without slotctl-etcd: exit %d, stderr %q; want 69 and one line naming slotctl-etcd", code, errs)
	}
	// slotctl-etcd on PATH will do.
	env = append(env, "PATH="+both+":/usr/bin:/bin")
	if code, out, errs := slotctl(alone, "limit", "ls", "--store", etcdURL); code != 0 || !strings.Contains(out, "d ") {
		t.Errorf("slotctl-etcd on PATH: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, _, errs := slotctl(loop, "ls", "--store", etcdURL); code != exitUnavailable || !strings.Contains(errs, "is this slotctl") {
		t.Errorf("slotctl installed as slotctl-etcd: exit %d, stderr %q; want 69 saying so", code, errs)
	}
}

// The released slotctl becomes slotctl-etcd before parsing only when the
// store is plainly etcd; the config file's store is decided later.
func TestEtcdStoreGiven(t *testing.T) {
	env := func(store string) func(string) string {
		return func(k string) string {
			if k == "SLOTCTL_STORE" {
				return store
			}
			return ""
		}
	}
	for _, c := range []struct {
		args []string
		env  string
		want bool
	}{
		{[]string{"ls", "--store", "etcd://h:1"}, "", true},
		{[]string{"--store=etcd://h:1", "ls"}, "", true},
		{[]string{"ls"}, "etcd://h:1", true},
		{[]string{"ls", "--store", "/tmp/s.db"}, "etcd://h:1", false},                      // the flag wins
		{[]string{"ls", "--store=bolt:///x"}, "etcd://h:1", false},                         // the flag wins
		{[]string{"run", "--limit", "x", "--", "cmd", "--store", "etcd://h:1"}, "", false}, // the job's arguments
		{[]string{"ls", "--store"}, "", false},                                             // no value: cobra's error
		{[]string{"ls"}, "", false},                                                        // the config file decides, later
	} {
		if got := etcdStoreGiven(c.args, env(c.env)); got != c.want {
			t.Errorf("etcdStoreGiven(%q, SLOTCTL_STORE=%q) = %v, want %v", c.args, c.env, got, c.want)
		}
	}
}
