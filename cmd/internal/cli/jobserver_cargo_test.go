package cli

// slotctl run --jobserver with real cargo: Debian's (1.65, at
// /usr/bin/cargo; .ci/run installs it), which ignores the fifo style, and
// a recent one (1.95) on PATH when there is one. The build is a workspace of
// crates that cargo would compile side by side; every 10 ms the test counts
// the rustc processes of the run and checks them against the limit.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
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
	cargoWorkspaceOf(t, dir, n, 300)
}

// cargoWorkspaceOf is cargoWorkspace with fns functions in each crate.
func cargoWorkspaceOf(t *testing.T, dir string, n, fns int) {
	t.Helper()
	var members []string
	for i := range n {
		name := fmt.Sprintf("c%d", i)
		members = append(members, `"`+name+`"`)
		var src bytes.Buffer
		for j := range fns {
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

// jsSample is what the test saw at one instant of a cargo and a make
// sharing a limit: the rustc processes of the run, the recipes the make's
// log shows running, and the weights ls showed last (-1: not held).
type jsSample struct {
	at                      time.Time
	rustc, recipes          int
	cargoWeight, makeWeight int
}

// jsRunning counts the recipes a jsMakefile log shows started and not
// ended.
func jsRunning(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "s "):
			n++
		case strings.HasPrefix(line, "e "):
			n--
		}
	}
	return n
}

// jsWeights reads the held weights of the cargo and the make from ls -o
// json (-1 for one that holds nothing).
func jsWeights(e *ptEnv) (cargoW, makeW int, ok bool) {
	out, err := e.output("ls", "-o", "json", "cpu")
	if err != nil {
		return 0, 0, false
	}
	var ls struct {
		Tickets []struct {
			Command string `json:"command"`
			State   string `json:"state"`
			Weight  int    `json:"weight"`
		} `json:"tickets"`
	}
	if json.Unmarshal([]byte(out), &ls) != nil {
		return 0, 0, false
	}
	cargoW, makeW = -1, -1
	for _, tk := range ls.Tickets {
		if tk.State != "held" {
			continue
		}
		switch {
		case strings.HasPrefix(tk.Command, debianCargo):
			cargoW = tk.Weight
		case strings.HasPrefix(tk.Command, "make"):
			makeW = tk.Weight
		}
	}
	return cargoW, makeW, true
}

// jsShared is what cargoAndMake measured, from the make's start.
type jsShared struct {
	peak     int           // the most rustc and running recipes in one sample
	samples  int           // how many samples
	admitted time.Duration // the make held its first slot (-1: never seen)
	share    time.Duration // the make ran 2 recipes at once (-1: never)
	cargoEnd time.Duration // the last sample that saw a rustc
}

// cargoAndMake runs Debian's cargo on a workspace of crates crates of fns
// functions under slotctl run --jobserver cargoArgs on limit cpu of 4, and
// once the cargo weighs cargoWeight, a make of n recipes of 0.3 s that
// log their start and end. Every 10 ms it counts the run's rustc processes
// and the make's running recipes (by its log), and checks them against the
// 4 slots; ls -o json gives the weights as often as it answers.
func cargoAndMake(t *testing.T, crates, fns, n, cargoWeight int, cargoArgs ...string) jsShared {
	t.Helper()
	const slots, fair = 4, 2
	e := newPTEnvAlone(t)
	e.env = append(e.env, "CARGO_HOME="+e.path("cargo-home"), "RUSTC=/usr/bin/rustc", "SLEEP=0.3")
	jsManyCPUs(e)
	if out, err := e.output("limit", "set", "cpu", fmt.Sprint(slots)); err != nil {
		t.Fatalf("limit set: %v\n%s", err, out)
	}
	ws := e.path("ws")
	cargoWorkspaceOf(t, ws, crates, fns)
	write(t, e.path("Makefile"), jsMakefile)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	store, mlog := e.path("slots.db"), e.path("make.log")
	var mu sync.Mutex
	var samples []jsSample
	cw, mw := -1, -1 // the weights ls showed last
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // ls, as often as it answers
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if c, m, ok := jsWeights(e); ok {
				mu.Lock()
				cw, mw = c, m
				mu.Unlock()
			}
		}
	}()
	go func() { // the processes, every 10 ms
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			s := jsSample{at: time.Now(), rustc: rustcs(store), recipes: jsRunning(mlog)}
			mu.Lock()
			s.cargoWeight, s.makeWeight = cw, mw
			samples = append(samples, s)
			mu.Unlock()
		}
	}()

	argv := append([]string{"-v", "run", "--limit", "cpu", "--jobserver"}, cargoArgs...)
	argv = append(argv, "--", debianCargo, "build", "-q", "--offline", "--manifest-path", filepath.Join(ws, "Cargo.toml"), "--target-dir", e.path("target"))
	cargo := e.start(ctx, "cargo", argv...)
	ptWaitFor(t, fmt.Sprintf("the cargo to weigh %d", cargoWeight), time.Minute, func() bool {
		c, _, _ := jsWeights(e)
		return c == cargoWeight
	})
	makeStart := time.Now()
	mk := e.start(ctx, "make", "-v", "run", "--limit", "cpu", "--jobserver", "--", "make", "-s", fmt.Sprintf("N=%d", n), "LOG=make.log")
	mcode := mk.wait(t, 3*time.Minute)
	ccode := cargo.wait(t, 3*time.Minute)
	close(stop)
	wg.Wait()
	if mcode != 0 || ccode != 0 {
		t.Fatalf("make exited %d, cargo %d, want 0 and 0; stderr of the cargo's slotctl:\n%s\nof the make's:\n%s", mcode, ccode, cargo.stderr(), mk.stderr())
	}

	r := jsShared{samples: len(samples), admitted: -1, share: -1}
	var b strings.Builder
	var prev jsSample
	for _, s := range samples {
		since := s.at.Sub(makeStart)
		r.peak = max(r.peak, s.rustc+s.recipes)
		if s.rustc+s.recipes > slots {
			t.Errorf("%+.2fs: %d rustc and %d recipes at once on a limit of %d", since.Seconds(), s.rustc, s.recipes, slots)
		}
		if s.rustc > 0 {
			r.cargoEnd = since
		}
		if r.admitted < 0 && since > 0 && s.makeWeight >= 1 {
			r.admitted = since
		}
		if s.rustc != prev.rustc || s.recipes != prev.recipes || s.cargoWeight != prev.cargoWeight || s.makeWeight != prev.makeWeight {
			fmt.Fprintf(&b, "%+.2fs rustc %d recipes %d, weights: cargo %d make %d\n", since.Seconds(), s.rustc, s.recipes, s.cargoWeight, s.makeWeight)
		}
		prev = s
	}
	rs := readJSLog(t, mlog, "make")
	if len(rs) != n {
		t.Errorf("the make ran %d recipes, want %d", len(rs), n)
	}
	running := 0
	for _, ev := range jsEvents(rs) {
		running += ev.d
		if running >= fair {
			r.share = time.Unix(0, ev.at).Sub(makeStart)
			break
		}
	}
	t.Logf("limit of %d: at most %d rustc and recipes at once in %d samples; from the make's start: admitted %s, %d recipes at once %s, rustc last seen %s",
		slots, r.peak, r.samples, jsDur(r.admitted), fair, jsDur(r.share), jsDur(r.cargoEnd))
	if t.Failed() || testing.Verbose() {
		t.Logf("samples, from the make's start:\n%s", b.String())
		t.Logf("slotctl -v of the cargo:\n%s", cargo.stderr())
		t.Logf("slotctl -v of the make:\n%s", mk.stderr())
	}
	if r.peak == 0 {
		t.Errorf("no rustc or recipe seen: the builds did not run where the test looked")
	}
	jsNothingHeld(t, e)
	return r
}

func jsDur(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String()
}

// Debian's cargo takes the whole limit of 4, then a make arrives: never
// more rustc processes and recipes than the 4 slots at any sample. cargo
// and rustc keep every token they read until their own queue of work runs
// out (cargo starts its next crate on the token the last one ran on; rustc
// keeps a codegen token while codegen work is queued): slotctl, which never
// takes a token from a job in progress, gets back only what they return.
// How long the make waits for its share is logged, not bounded: it is
// cargo's to decide (seconds to the whole build).
func TestJobserverCargoKeepsItsTokens(t *testing.T) {
	longtest.Skip(t, "two builds, a cargo of 30 crates and a make, side by side")
	needDebianCargo(t)
	needMake(t)
	r := cargoAndMake(t, 2, 1200, 30, 4)
	if r.admitted < 0 {
		t.Errorf("the make was never seen holding a slot")
	}
}

// The way to share with cargo promptly: --jobserver-max bounds it to its
// share (2 of 4), and a make that arrives runs 2 recipes at once within a
// bound (generous, for a loaded machine; the figure is logged), while
// never more rustc processes and recipes than slots run.
func TestJobserverCargoBoundedAndMake(t *testing.T) {
	longtest.Skip(t, "two builds, a cargo of 30 crates and a make, side by side")
	needDebianCargo(t)
	needMake(t)
	r := cargoAndMake(t, 2, 1200, 30, 2, "--jobserver-max", "2")
	if r.share < 0 || r.share > 10*time.Second {
		t.Errorf("the make ran 2 recipes at once %s after it started, want within 10s", jsDur(r.share))
	}
	if r.cargoEnd < r.share {
		t.Errorf("the cargo ended %s after the make started, before the make had its share: the test shows nothing", jsDur(r.cargoEnd))
	}
}
