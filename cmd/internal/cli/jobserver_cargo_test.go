package cli

// slotctl run --jobserver with real cargo: Debian's (1.65, at
// /usr/bin/cargo; .ci/run installs it), which ignores the fifo style, and
// a recent one (1.95) on PATH when there is one. The build is a workspace of
// crates that cargo would compile side by side; every 10 ms the test counts
// the rustc processes of the run and checks them against the limit.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// debianCargo is the cargo of Debian's package.
const debianCargo = "/usr/bin/cargo"

func needDebianCargo(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(debianCargo); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed; .ci/run installs Debian's cargo package for it", debianCargo)
		}
		t.Skipf("%s not installed (apt-get install cargo); CI requires it", debianCargo)
	}
}

// cargoWorkspace writes a workspace of n crates with no dependencies
// between them (so cargo may build them all at once), each big enough to
// keep rustc busy for a while.
func cargoWorkspace(t *testing.T, dir string, n int) {
	t.Helper()
	var members []string
	for i := range n {
		name := fmt.Sprintf("c%d", i)
		members = append(members, `"`+name+`"`)
		var src bytes.Buffer
		for j := range 300 {
			fmt.Fprintf(&src, "pub fn f%d(x: u64) -> u64 { let mut v: Vec<u64> = (0..x).collect(); v.sort(); v.iter().map(|y| y.wrapping_mul(%d)).sum() }\n", j, j+i)
		}
		write(t, filepath.Join(dir, name, "Cargo.toml"), fmt.Sprintf("[package]\nname = %q\nversion = \"0.1.0\"\nedition = \"2018\"\n", name))
		write(t, filepath.Join(dir, name, "src", "lib.rs"), src.String())
	}
	write(t, filepath.Join(dir, "Cargo.toml"), "[workspace]\nmembers = ["+strings.Join(members, ", ")+"]\n")
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// rustcs counts the rustc processes whose environment names store (each
// test's own store: slotctl hands its URL, SLOTCTL_STORE, to the job).
func rustcs(store string) int {
	want := []byte("SLOTCTL_STORE=bolt://" + store + "\x00")
	names, _ := filepath.Glob("/proc/[0-9]*/comm")
	n := 0
	for _, comm := range names {
		c, err := os.ReadFile(comm)
		if err != nil || strings.TrimSpace(string(c)) != "rustc" {
			continue
		}
		env, err := os.ReadFile(filepath.Join(filepath.Dir(comm), "environ"))
		if err == nil && bytes.Contains(env, want) {
			n++
		}
	}
	return n
}

// cargoBuild runs slotctl run --jobserver [args] -- cargo build on limit
// cpu of slots slots, samples its rustc processes until it ends, and
// returns the most seen at once and how many samples saw any.
func cargoBuild(t *testing.T, e *ptEnv, cargo string, slots int, args ...string) (peak, busy int) {
	t.Helper()
	ws := e.path("ws")
	if _, err := os.Stat(ws); err != nil {
		cargoWorkspace(t, ws, 4)
	}
	if out, err := e.output("limit", "set", "cpu", fmt.Sprint(slots)); err != nil {
		t.Fatalf("limit set: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	argv := append([]string{"run", "--limit", "cpu", "--jobserver"}, args...)
	argv = append(argv, "--", cargo, "build", "-q", "--offline", "--manifest-path", filepath.Join(ws, "Cargo.toml"), "--target-dir", e.path("target"))
	p := e.start(ctx, "cargo", argv...)
	store := e.path("slots.db")
	for {
		select {
		case <-p.done:
			if code := p.wait(t, time.Second); code != 0 {
				t.Fatalf("slotctl %s exited %d; stderr:\n%s", strings.Join(argv, " "), code, p.stderr())
			}
			_ = os.RemoveAll(e.path("target")) // the next build compiles everything again
			return peak, busy
		case <-time.After(10 * time.Millisecond):
		}
		n := rustcs(store)
		peak = max(peak, n)
		if n > 0 {
			busy++
		}
	}
}

// Debian's cargo 1.65 ignores a FIFO: the fifo style is refused before the
// run waits, and auto hands it the pipe style, which it reads: never more
// rustc processes than the limit's one slot, though the host has CPUs for
// more.
func TestJobserverDebianCargo(t *testing.T) {
	needDebianCargo(t)
	e := newPTEnvAlone(t)
	// Its own rustc (1.63), not whatever rustc is first on PATH.
	e.env = append(e.env, "CARGO_HOME="+e.path("cargo-home"), "RUSTC=/usr/bin/rustc")
	jsManyCPUs(e)

	if out, err := e.output("limit", "set", "cpu", "1"); err != nil {
		t.Fatalf("limit set: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := e.start(ctx, "fifo", "run", "--limit", "cpu", "--jobserver", "--jobserver-style", "fifo", "--", debianCargo, "build")
	if code := p.wait(t, 20*time.Second); code != 64 {
		t.Fatalf("--jobserver-style fifo with cargo 1.65: exit %d, want 64; stderr:\n%s", code, p.stderr())
	}
	if got := p.stderr(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "--jobserver-style fifo: cargo 1.65 does not read it") || !strings.Contains(got, "use --jobserver-style pipe") {
		t.Errorf("--jobserver-style fifo with cargo 1.65: stderr %q, want one line refusing it and naming the pipe style", got)
	}
	jsNothingHeld(t, e)

	peak, busy := cargoBuild(t, e, debianCargo, 1)
	t.Logf("cargo 1.65, auto, one slot: at most %d rustc at once, rustc seen in %d samples", peak, busy)
	if peak > 1 {
		t.Errorf("cargo 1.65 ran %d rustc at once on a one-slot limit, want at most 1", peak)
	}
	if busy == 0 {
		t.Errorf("no rustc seen: the build did not run where the test looked")
	}
	jsNothingHeld(t, e)
}

// A recent cargo reads the fifo style: given it, the one-slot limit holds.
func TestJobserverCargoFIFO(t *testing.T) {
	cargo, err := exec.LookPath("cargo")
	if err != nil || cargo == debianCargo {
		t.Skip("no cargo but Debian's on PATH (rustup's cargo 1.95 reads the fifo style)")
	}
	c := probeJobClient(context.Background(), "cargo", cargo)
	if ok, _ := c.reads("fifo"); !ok {
		t.Skipf("%s is %v, which is not handed the fifo style", cargo, c)
	}
	e := newPTEnvAlone(t)
	jsManyCPUs(e)
	// rustup's cargo finds its toolchains under the real home, not the
	// test's.
	rustup := os.Getenv("RUSTUP_HOME")
	if rustup == "" {
		rustup = filepath.Join(os.Getenv("HOME"), ".rustup")
	}
	e.env = append(e.env, "RUSTUP_HOME="+rustup, "CARGO_HOME="+e.path("cargo-home"))
	peak, busy := cargoBuild(t, e, cargo, 1, "--jobserver-style", "fifo")
	t.Logf("%v, fifo, one slot: at most %d rustc at once, rustc seen in %d samples", c, peak, busy)
	if peak > 1 {
		t.Errorf("%v ran %d rustc at once on a one-slot limit with the fifo style, want at most 1", c, peak)
	}
	if busy == 0 {
		t.Errorf("no rustc seen: the build did not run where the test looked")
	}
	jsNothingHeld(t, e)
}
