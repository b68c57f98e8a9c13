//go:build bench

package cli

// The side-by-side benchmark of slotctl against its peers (flock from
// util-linux, sem from GNU parallel), one figure per subtest, and two
// tables at the end: the figures on an idle machine, then the same beside a
// busy loop on every core (subtest "loaded"):
//
//	go test -tags bench -run 'Compare$' -v -timeout 40m ./cmd/internal/cli
//	go test -tags bench -run 'Compare$/handoff' -v ./cmd/internal/cli     # one figure
//
// It builds slotctl with go build (the real binary, not this test binary),
// installs nothing, and skips a peer that is not installed. Everything runs
// as real processes on a real store in a temporary directory
// (SLOTCTL_BENCH_DIR puts it elsewhere, e.g. on the filesystem of
// /var/lib/slotctl). The machine is shared and noisy: it reports medians,
// percentiles and ratios of interleaved runs, and asserts nothing but
// correctness (exit statuses, FIFO order, the limit never exceeded).
//
// Environment:
//
//	SLOTCTL_BENCH_RUNS     runs of overhead and handoff per peer (default 30)
//	SLOTCTL_BENCH_WAITERS  idle waiters (default 200)
//	SLOTCTL_BENCH_DIR      where the stores and lock files go (default $TMPDIR)
//	SLOTCTL_BENCH_LOADED   0: skip the second table, taken beside a busy loop a core

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/renew"
)

// cmpRow is one line of the final table.
type cmpRow struct {
	figure, slotctl, peer, ratio, goal, met string
}

// cmpBench is one run of the comparison: the slotctl binary, the peers that
// are installed, and the rows measured so far.
type cmpBench struct {
	bin string // slotctl, built with go build -trimpath, slotctl-guard beside it
	// binSelf is the same slotctl alone: it starts itself as the guard.
	binSelf string
	// binInstall is slotctl as go install builds it (default flags, cgo
	// as the toolchain has it), alone: go install of cmd/slotctl installs
	// no slotctl-guard.
	binInstall string
	base       string // the directory the figures' stores live under
	runs       int
	flock      string // "" when not installed
	sem        string

	mu     sync.Mutex
	rows   []cmpRow
	failed []string
}

func (b *cmpBench) row(r cmpRow) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rows = append(b.rows, r)
}

// TestCompare measures each figure of the performance goals side by side
// with the peers, in one run on this machine, and prints one table.
func TestCompare(t *testing.T) {
	b := &cmpBench{runs: cmpEnvInt("SLOTCTL_BENCH_RUNS", 30)}
	base := os.Getenv("SLOTCTL_BENCH_DIR")
	if base == "" {
		base = t.TempDir()
	} else {
		d, err := os.MkdirTemp(base, "slotctl-bench-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		base = d
	}
	b.base = base
	b.bin = filepath.Join(base, "bin", "slotctl")
	buildSlotctl(t, b.bin, releaseSlotctl)
	buildSlotctl(t, filepath.Join(base, "bin", "slotctl-guard"), buildOptions{main: "slotctl-guard", release: true})
	// The same slotctl without slotctl-guard beside it: it starts itself
	// as each job's guard.
	b.binSelf = filepath.Join(base, "bin-self", "slotctl")
	buildSlotctl(t, b.binSelf, releaseSlotctl)
	b.binInstall = filepath.Join(base, "bin-install", "slotctl")
	buildSlotctl(t, b.binInstall, buildOptions{main: "slotctl"})
	for _, p := range []struct {
		name string
		dst  *string
	}{{"flock", &b.flock}, {"sem", &b.sem}} {
		if path, err := exec.LookPath(p.name); err == nil {
			*p.dst = path
		} else {
			t.Logf("%s is not installed: its figures are skipped (flock: util-linux; sem: GNU parallel)", p.name)
		}
	}
	machine := cmpMachine(base, b.flock, b.sem)
	t.Logf("%s", machine)

	figures := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"overhead", b.overhead},
		{"handoff", b.handoff},
		{"takeover", b.takeover},
		{"idle", b.idle},
		{"burst", b.burst},
		{"throughput", b.throughput},
		{"memory", b.memory},
		{"inspection", b.inspection},
	}
	runAll := func(t *testing.T) {
		for _, f := range figures {
			if !t.Run(f.name, f.fn) {
				b.failed = append(b.failed, f.name)
			}
		}
	}
	var out strings.Builder
	runAll(t)
	b.table(&out, "On an idle machine")
	// The same figures with the CPU oversubscribed: a busy loop on every
	// core beside them (SLOTCTL_BENCH_LOADED=0 skips this half).
	if os.Getenv("SLOTCTL_BENCH_LOADED") != "0" {
		loops := runtime.NumCPU()
		t.Run("loaded", func(t *testing.T) {
			b.base = filepath.Join(base, "loaded") // fresh stores and lock files
			if err := os.Mkdir(b.base, 0o700); err != nil {
				t.Fatal(err)
			}
			cmpBusyLoops(t, loops)
			runAll(t)
		})
		if len(b.rows) > 0 {
			b.table(&out, fmt.Sprintf("Loaded: %d busy loops beside (one a core)", loops))
		}
	}
	fmt.Fprintf(&out, "\n%s\n", machine)
	fmt.Fprintf(&out, "command: go test -tags bench -run 'Compare$' -v -timeout 40m ./cmd/internal/cli (SLOTCTL_BENCH_RUNS=%d)\n", b.runs)
	fmt.Print(out.String())
}

// table writes the rows measured since the last table, and which figures
// failed to give one, under a title.
func (b *cmpBench) table(out *strings.Builder, title string) {
	fmt.Fprintf(out, "\n%s:\n\n| figure | slotctl | peer | ratio | goal | met? |\n|---|---|---|---|---|---|\n", title)
	for _, r := range b.rows {
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %s |\n", r.figure, r.slotctl, r.peer, r.ratio, r.goal, r.met)
	}
	if len(b.failed) > 0 {
		fmt.Fprintf(out, "\nFAILED (no figure): %s\n", strings.Join(b.failed, ", "))
	}
	b.rows, b.failed = nil, nil
}

// cmpBusyLoops keeps n processes spinning until the test ends.
func cmpBusyLoops(t *testing.T, n int) {
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}

// --- overhead ---

// overhead: slotctl run --limit x -- true vs flock FILE true vs sem --fg
// true vs true alone, interleaved (the order rotates each run), so that the
// machine's noise hits all alike.
func (b *cmpBench) overhead(t *testing.T) {
	dir := cmpDir(t, b.base, "overhead")
	env := cmpEnv(dir)
	type peer struct {
		name string
		argv []string
	}
	peers := []peer{{"slotctl run --limit x -- true", []string{b.bin, "run", "--limit", "x", "--", "true"}},
		{"slotctl run on two limits", []string{b.bin, "run", "--limit", "x2", "--limit", "y2", "--", "true"}}}
	if b.flock != "" {
		peers = append(peers, peer{"flock FILE true", []string{b.flock, filepath.Join(dir, "flock.lock"), "true"}})
	}
	if b.sem != "" {
		peers = append(peers, peer{"sem --fg --id x true", []string{b.sem, "--will-cite", "--fg", "--id", "slotctl-bench-" + strconv.Itoa(os.Getpid()), "true"}})
	}
	peers = append(peers, peer{"true (exec alone)", []string{"true"}},
		peer{"slotctl without slotctl-guard", []string{b.binSelf, "run", "--limit", "x3", "--", "true"}},
		peer{"slotctl as go install builds it", []string{b.binInstall, "run", "--limit", "x4", "--", "true"}})
	times := make([][]time.Duration, len(peers))
	for i := -1; i < b.runs; i++ { // run -1 warms up caches and creates the store
		for k := range peers {
			j := (k + max(i, 0)) % len(peers)
			p := peers[j]
			cmd := exec.Command(p.argv[0], p.argv[1:]...)
			cmd.Env = env
			cmd.Dir = dir
			start := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", p.name, err, out)
			}
			if i >= 0 {
				times[j] = append(times[j], time.Since(start))
			}
		}
	}
	med := map[string]time.Duration{}
	for j, p := range peers {
		med[p.name] = cmpPct(times[j], 50)
	}
	t.Logf("%-32s %10s %10s %10s %10s", "command", "median", "p90", "min", "vs flock")
	for j, p := range peers {
		ratio := "-"
		if f, ok := med["flock FILE true"]; ok {
			ratio = fmt.Sprintf("%.2fx", float64(med[p.name])/float64(f))
		}
		t.Logf("%-32s %10s %10s %10s %10s", p.name, cmpMS(med[p.name]), cmpMS(cmpPct(times[j], 90)), cmpMS(cmpPct(times[j], 0)), ratio)
	}
	s := med[peers[0].name]
	sv := fmt.Sprintf("%s (p90 %s)", cmpMS(s), cmpMS(cmpPct(times[0], 90)))
	if f, ok := med["flock FILE true"]; ok {
		r := float64(s) / float64(f)
		b.row(cmpRow{fmt.Sprintf("overhead: `run -- true`, median of %d interleaved", b.runs), sv,
			fmt.Sprintf("flock %s (p90 %s)", cmpMS(f), cmpMS(cmpPct(times[2], 90))), fmt.Sprintf("%.1f× flock", r), "≤ 2× flock", cmpMet(r <= 2)})
	} else {
		b.row(cmpRow{"overhead vs flock", sv, "flock not installed", "-", "≤ 2× flock", "-"})
	}
	if m, ok := med["sem --fg --id x true"]; ok {
		r := float64(m) / float64(s)
		b.row(cmpRow{"overhead vs sem", sv, fmt.Sprintf("sem %s", cmpMS(m)), fmt.Sprintf("sem = %.1f× slotctl", r), "≤ 1/20 of sem", cmpMet(r >= 20)})
	} else {
		b.row(cmpRow{"overhead vs sem", sv, "sem not installed", "-", "≤ 1/20 of sem", "-"})
	}
	two := med["slotctl run on two limits"]
	r2 := float64(two) / float64(s)
	b.row(cmpRow{"two limits: `run --limit x --limit y -- true` vs one limit", fmt.Sprintf("%s (p90 %s)", cmpMS(two), cmpMS(cmpPct(times[1], 90))),
		"one limit " + cmpMS(s), fmt.Sprintf("%.2f× one limit", r2), "≤ 1.2× one limit", cmpMet(r2 <= 1.2)})
	self := med["slotctl without slotctl-guard"]
	b.row(cmpRow{"`run -- true` without slotctl-guard beside (slotctl its own guard)", cmpMS(self), "with it " + cmpMS(s),
		fmt.Sprintf("+%s", cmpMS(self-s)), "-", "-"})
	inst := med["slotctl as go install builds it"]
	if f, ok := med["flock FILE true"]; ok {
		r := float64(inst) / float64(f)
		b.row(cmpRow{"overhead: `run -- true`, slotctl as `go install` builds it (its own guard)", cmpMS(inst), "flock " + cmpMS(f),
			fmt.Sprintf("%.1f× flock", r), "≤ 2× flock", cmpMet(r <= 2)})
	}
	tr := med["true (exec alone)"]
	b.row(cmpRow{"overhead: exec of `true` alone (floor)", "-", cmpMS(tr), fmt.Sprintf("slotctl − true = %s", cmpMS(s-tr)), "-", "-"})
}

// --- handoff ---

const (
	// The holder's child: say it holds (with its pid, so that cleanup can
	// kill it: flock's child outlives a killed flock), wait for the harness
	// to let go, then record when it ends.
	cmpHolderScript = `echo $$ > held.tmp; mv held.tmp held; read _ < go.fifo; date +%s%N > end.tmp; mv end.tmp end`
	// The waiter's child: record when it starts.
	cmpWaiterScript = `date +%s%N > start`
)

// handoff: the holder's child exits → the queued waiter's child starts, on a
// mutex (one slot), with slotctl and with flock. Both children are sh, and
// both times come from date(1), so the two peers pay the same for them.
func (b *cmpBench) handoff(t *testing.T) {
	type peer struct {
		name, bin string
		args      func(script string) []string
		queued    func(w *ptProc) bool
	}
	peers := []peer{{"slotctl", b.bin, func(s string) []string { return []string{"run", "--limit", "h", "--", "sh", "-c", s} },
		func(w *ptProc) bool { return strings.Contains(w.stderr(), "waiting for limit") }},
		{"slotctl-2", b.bin, func(s string) []string { return []string{"run", "--limit", "h", "--limit", "h2", "--", "sh", "-c", s} },
			func(w *ptProc) bool { return strings.Contains(w.stderr(), "waiting") }}}
	if b.flock != "" {
		peers = append(peers, peer{"flock", b.flock, func(s string) []string { return []string{"flock.lock", "sh", "-c", s} },
			func(*ptProc) bool { return true }}) // nothing tells: the settle delay below must do
	}
	gaps := map[string][]time.Duration{}
	var envs []*ptEnv
	for _, p := range peers {
		dir := cmpDir(t, b.base, "handoff-"+p.name)
		if err := unix.Mkfifo(filepath.Join(dir, "go.fifo"), 0o600); err != nil {
			t.Fatal(err)
		}
		envs = append(envs, cmpPTEnv(t, dir, p.bin))
	}
	for i := range b.runs {
		for k := range peers {
			j := (k + i) % len(peers) // interleaved, rotating
			p, e := peers[j], envs[j]
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			for _, f := range []string{"held", "end", "start"} {
				os.Remove(e.path(f))
			}
			h := e.start(ctx, fmt.Sprintf("h%02d", i), p.args(cmpHolderScript)...)
			ptWaitFor(t, p.name+" holder's child started", 10*time.Second, func() bool { return ptExists(e.path("held")) })
			e.notePid(int(ptReadInt(t, e.path("held"))))
			w := e.start(ctx, fmt.Sprintf("w%02d", i), p.args(cmpWaiterScript)...)
			ptWaitFor(t, p.name+" waiter queued", 10*time.Second, func() bool { return p.queued(w) })
			time.Sleep(100 * time.Millisecond) // the waiter is asleep now, as a queued job is
			if ptExists(e.path("start")) {
				t.Fatalf("%s: the waiter's child started while the holder's still ran", p.name)
			}
			cmpPoke(t, e.path("go.fifo"))
			if code := h.wait(t, 10*time.Second); code != 0 {
				t.Fatalf("%s holder exited %d: %s", p.name, code, h.stderr())
			}
			if code := w.wait(t, 10*time.Second); code != 0 {
				t.Fatalf("%s waiter exited %d: %s", p.name, code, w.stderr())
			}
			cancel()
			gap := time.Duration(ptReadInt(t, e.path("start")) - ptReadInt(t, e.path("end")))
			if gap < 0 {
				t.Fatalf("%s: the waiter's child started %s before the holder's ended", p.name, -gap)
			}
			gaps[p.name] = append(gaps[p.name], gap)
		}
	}
	for _, p := range peers {
		g := gaps[p.name]
		t.Logf("%-8s handoff over %d reps: min %s, p50 %s, p90 %s, p95 %s, max %s", p.name, len(g),
			cmpMS(cmpPct(g, 0)), cmpMS(cmpPct(g, 50)), cmpMS(cmpPct(g, 90)), cmpMS(cmpPct(g, 95)), cmpMS(cmpPct(g, 100)))
	}
	s := gaps["slotctl"]
	for _, q := range []struct {
		p     float64
		ratio float64 // the goal against flock's, 0 for none
	}{{50, 1.5}, {95, 0}} {
		sv := cmpPct(s, q.p)
		pv, ratio, goal, met := "flock not installed", "-", "-", "-"
		if q.ratio > 0 {
			goal = fmt.Sprintf("≤ %g× flock", q.ratio)
		}
		if f, ok := gaps["flock"]; ok {
			fv := cmpPct(f, q.p)
			r := float64(sv) / float64(fv)
			pv, ratio = "flock "+cmpMS(fv), fmt.Sprintf("%.1f× flock", r)
			if q.ratio > 0 {
				met = cmpMet(r <= q.ratio)
			}
		}
		b.row(cmpRow{fmt.Sprintf("handoff p%g (child exit → next child start, mutex, %d reps)", q.p, len(s)), cmpMS(sv), pv, ratio, goal, met})
	}
	two, one := cmpPct(gaps["slotctl-2"], 50), cmpPct(s, 50)
	r := float64(two) / float64(one)
	b.row(cmpRow{fmt.Sprintf("handoff p50 on a two-limit mutex (%d reps)", len(s)), cmpMS(two), "one limit " + cmpMS(one),
		fmt.Sprintf("%.2f× one limit", r), "≤ 1.2× one limit", cmpMet(r <= 1.2)})
}

// --- takeover ---

// takeover: the holder is SIGKILLed while a waiter is queued; the time from
// the kill to the waiter's child starting. slotctl's supervisor alone is
// killed (its guard ends the job, the waiter watches the holder's pidfd);
// flock and its child both (the lock is the kernel's, freed when the last
// descriptor closes).
func (b *cmpBench) takeover(t *testing.T) {
	type peer struct {
		name, bin string
		args      func(script string) []string
		queued    func(w *ptProc) bool
	}
	peers := []peer{{"slotctl", b.bin, func(s string) []string { return []string{"run", "--limit", "k", "--", "sh", "-c", s} },
		func(w *ptProc) bool { return strings.Contains(w.stderr(), "waiting for limit") }}}
	if b.flock != "" {
		peers = append(peers, peer{"flock", b.flock, func(s string) []string { return []string{"flock.lock", "sh", "-c", s} },
			func(*ptProc) bool { return true }})
	}
	const holder = `echo $$ > held.tmp; mv held.tmp held; exec sleep 1000`
	gaps := map[string][]time.Duration{}
	var envs []*ptEnv
	for _, p := range peers {
		envs = append(envs, cmpPTEnv(t, cmpDir(t, b.base, "takeover-"+p.name), p.bin))
	}
	for i := range min(b.runs, 20) {
		for k := range peers {
			j := (k + i) % len(peers)
			p, e := peers[j], envs[j]
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			for _, f := range []string{"held", "start"} {
				os.Remove(e.path(f))
			}
			h := e.start(ctx, fmt.Sprintf("h%02d", i), p.args(holder)...)
			ptWaitFor(t, p.name+" holder's child started", 10*time.Second, func() bool { return ptExists(e.path("held")) })
			child := int(ptReadInt(t, e.path("held")))
			e.notePid(child)
			w := e.start(ctx, fmt.Sprintf("w%02d", i), p.args(cmpWaiterScript)...)
			ptWaitFor(t, p.name+" waiter queued", 10*time.Second, func() bool { return p.queued(w) })
			time.Sleep(200 * time.Millisecond) // the waiter is asleep now
			killAt := time.Now()
			_ = h.cmd.Process.Kill()
			if p.name == "flock" {
				_ = unix.Kill(child, unix.SIGKILL)
			}
			h.wait(t, 10*time.Second)
			if code := w.wait(t, 20*time.Second); code != 0 {
				t.Fatalf("%s waiter exited %d: %s", p.name, code, w.stderr())
			}
			cancel()
			gaps[p.name] = append(gaps[p.name], time.Duration(ptReadInt(t, e.path("start"))-killAt.UnixNano()))
		}
	}
	for _, p := range peers {
		g := gaps[p.name]
		t.Logf("%-8s takeover over %d reps: min %s, p50 %s, p90 %s, max %s", p.name, len(g),
			cmpMS(cmpPct(g, 0)), cmpMS(cmpPct(g, 50)), cmpMS(cmpPct(g, 90)), cmpMS(cmpPct(g, 100)))
	}
	sv := cmpPct(gaps["slotctl"], 50)
	pv, ratio := "flock not installed", "-"
	if f, ok := gaps["flock"]; ok {
		fv := cmpPct(f, 50)
		pv, ratio = "flock "+cmpMS(fv), fmt.Sprintf("%.1f× flock", float64(sv)/float64(fv))
	}
	b.row(cmpRow{fmt.Sprintf("same-host takeover p50 (holder SIGKILLed → waiter's child starts, %d reps)", len(gaps["slotctl"])), cmpMS(sv), pv, ratio,
		"≤ 1000ms", cmpMet(sv <= time.Second)})
}

// --- idle waiters ---

// idle: a held slot, n slotctl waiters queued behind it one after the other
// (each queued before the next starts, so their FIFO order is known), the
// CPU they use over 10 s while they only wait, then the release: all must
// run, one at a time, in queue order.
func (b *cmpBench) idle(t *testing.T) {
	n := cmpEnvInt("SLOTCTL_BENCH_WAITERS", 200)
	// Two renewal periods of a waiter at the default TTL (30s,
	// renew.WaitPeriod), so that the head renews about twice whatever its
	// phase, and at least two minutes: an idle Go process still wakes once a
	// minute (the runtime's sysmon), which a shorter window may miss.
	window := max(2*renew.WaitPeriod(30*time.Second, 10*time.Second), 2*time.Minute)
	dir := cmpDir(t, b.base, "idle")
	e := cmpPTEnv(t, dir, b.bin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := unix.Mkfifo(e.path("release.fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	holder := e.start(ctx, "holder", "run", "--limit", "idle", "--", "sh", "-c", `echo $$ > held.tmp; mv held.tmp held; read _ < release.fifo`)
	ptWaitFor(t, "holder's child started", 10*time.Second, func() bool { return ptExists(e.path("held")) })
	e.notePid(int(ptReadInt(t, e.path("held"))))

	t0 := time.Now()
	waiters := make([]*ptProc, n)
	for i := range n {
		w := e.start(ctx, fmt.Sprintf("w%03d", i), "run", "--limit", "idle", "--", "sh", "-c", `echo "$1" >> order`, "sh", strconv.Itoa(i))
		ptWaitFor(t, fmt.Sprintf("waiter %d queued", i), 30*time.Second, func() bool {
			select {
			case <-w.done:
				t.Fatalf("waiter %d exited while the slot was held: %s", i, w.stderr())
			default:
			}
			return strings.Contains(w.stderr(), "waiting for limit")
		})
		waiters[i] = w
	}
	queueing := time.Since(t0)
	if held, waiting := cmpLsCounts(t, b.bin, e.env, "idle"); held != 1 || waiting != n {
		t.Fatalf("slotctl ls: %d held and %d waiting in limit idle, want 1 and %d", held, waiting, n)
	}
	t.Logf("queued %d waiters one after the other in %s (%s each)", n, queueing.Round(time.Millisecond), cmpMS(queueing/time.Duration(n)))

	time.Sleep(time.Second) // let the last ones settle into waiting
	pids := make([]int, n)
	for i, w := range waiters {
		pids[i] = w.cmd.Process.Pid
	}
	ticks0, ns0 := cmpCPU(t, pids)
	hTicks0, hNs0 := cmpCPU(t, []int{holder.cmd.Process.Pid})
	w0 := time.Now()
	time.Sleep(window)
	ticks1, ns1 := cmpCPU(t, pids)
	hTicks1, hNs1 := cmpCPU(t, []int{holder.cmd.Process.Pid})
	elapsed := time.Since(w0)
	for i, w := range waiters {
		select {
		case <-w.done:
			t.Fatalf("waiter %d exited during the idle window: %s", i, w.stderr())
		default:
		}
	}
	if ptExists(e.path("order")) {
		t.Fatalf("a waiter's child ran while the slot was held")
	}
	// utime+stime are in clock ticks (USER_HZ, 100 on Linux); schedstat's
	// run time, summed over every thread, is in ns: the two should agree.
	// They do not always: tick sampling misses a process that wakes on a
	// timer just after a tick and sleeps again before the next. The figure
	// judged is the larger.
	cpu := float64(ticks1-ticks0) / 100
	cpuSched := float64(ns1-ns0) / 1e9
	pct := max(cpu, cpuSched) / elapsed.Seconds() * 100
	t.Logf("%d waiters over %s: %.3f CPU-s by utime+stime, %.2f%% of one core by the larger, %.3f CPU-s by schedstat; %.2f ms per waiter per second",
		n, elapsed.Round(time.Millisecond), cpu, pct, cpuSched, max(cpu, cpuSched)*1000/float64(n)/elapsed.Seconds())
	t.Logf("the holder (supervising its child) meanwhile: %.3f CPU-s by utime+stime, %.3f by schedstat",
		float64(hTicks1-hTicks0)/100, float64(hNs1-hNs0)/1e9)

	releasedAt := time.Now()
	cmpPoke(t, e.path("release.fifo"))
	if code := holder.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("holder exited %d: %s", code, holder.stderr())
	}
	deadline := time.After(3 * time.Minute)
	var last time.Time
	for i, w := range waiters {
		select {
		case <-w.done:
		case <-deadline:
			t.Fatalf("waiter %d (and maybe more) still running 3 minutes after the release", i)
		}
		if code := w.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("waiter %d exited %d: %s", i, code, w.stderr())
		}
		if w.exitedAt.After(last) {
			last = w.exitedAt
		}
	}
	drain := last.Sub(releasedAt)
	data, err := os.ReadFile(e.path("order"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(string(data))
	fifo := len(got) == n
	for i := 0; fifo && i < n; i++ {
		fifo = got[i] == strconv.Itoa(i)
	}
	if !fifo {
		t.Errorf("waiters' children ran in order %v, want 0..%d (FIFO)", got, n-1)
	}
	t.Logf("released: all %d ran in %s (%.0f admissions/s, one slot), FIFO %v", len(got), drain.Round(time.Millisecond),
		float64(len(got))/drain.Seconds(), fifo)

	b.row(cmpRow{fmt.Sprintf("idle: CPU of %d queued waiters over %s", n, elapsed.Round(100*time.Millisecond)),
		fmt.Sprintf("%.2f%% of one core (schedstat %.2f CPU-s, utime+stime %.2f CPU-s)", pct, cpuSched, cpu), "-", "-", "≤ 0.2% of one core", cmpMet(pct <= 0.2)})
	b.row(cmpRow{fmt.Sprintf("idle: then released, all %d admitted in FIFO order", n),
		fmt.Sprintf("%d/%d in order, drained in %s", cmpInOrder(got), n, drain.Round(time.Millisecond)), "-", "-", "all, in FIFO order", cmpMet(fifo)})
}

// --- throughput ---

// throughput: 64 concurrent slotctl run -- true on a limit of 4 slots, a
// few rounds; admissions per second is 64 / the round's wall time. sem -j4
// is the peer. The store's event log says how many held at once.
func (b *cmpBench) throughput(t *testing.T) {
	const n, slots, rounds, semRounds = 64, 4, 5, 2
	type peer struct {
		name, bin string
		args      []string
		rounds    int
	}
	peers := []peer{{"slotctl", b.bin, []string{"run", "--limit", "t", "--slots", strconv.Itoa(slots), "--", "true"}, rounds}}
	if b.sem != "" {
		peers = append(peers, peer{"sem", b.sem, []string{"--will-cite", "--fg", "--id", "slotctl-bench-tp-" + strconv.Itoa(os.Getpid()), "-j", strconv.Itoa(slots), "true"}, semRounds})
	}
	rates := map[string][]float64{}
	var slotctlEnv *ptEnv
	for _, p := range peers {
		dir := cmpDir(t, b.base, "throughput-"+p.name)
		e := cmpPTEnv(t, dir, p.bin)
		if p.name == "slotctl" {
			slotctlEnv = e
		}
		rates[p.name] = cmpRounds(t, e, p.name, p.args, n, p.rounds)
	}
	peak, admitted := cmpPeakHeld(t, b.bin, slotctlEnv.env, "t")
	t.Logf("slotctl: %d admissions in the event log; at most %d held at once (limit %d)", admitted, peak, slots)
	if peak > slots {
		t.Errorf("%d tickets held at once in a limit of %d", peak, slots)
	}
	if want := 1 + rounds*n; admitted != want {
		t.Errorf("%d admissions in the event log, want %d", admitted, want)
	}
	s := cmpMedianF(rates["slotctl"])
	sv := fmt.Sprintf("%.0f/s (median of %d rounds, min %.0f); peak %d held", s, rounds, slices.Min(rates["slotctl"]), peak)
	pv, ratio := "sem not installed", "-"
	if m, ok := rates["sem"]; ok {
		pv, ratio = fmt.Sprintf("sem -j%d %.0f/s (median of %d)", slots, cmpMedianF(m), len(m)), fmt.Sprintf("%.1f× sem", s/cmpMedianF(m))
	}
	b.row(cmpRow{fmt.Sprintf("throughput: %d concurrent `-- true`, %d slots", n, slots), sv, pv, ratio, "≥ 100 admissions/s",
		cmpMet(s >= 100 && peak <= slots)})
}

// cmpRounds starts n runs of args at once, rounds times (after one run that
// creates the limit and warms the caches), and returns each round's rate:
// n / the time from the first start to the last exit.
func cmpRounds(t *testing.T, e *ptEnv, name string, args []string, n, rounds int) []float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	warm := e.start(ctx, "warm", args...)
	if code := warm.wait(t, time.Minute); code != 0 {
		t.Fatalf("%s warm-up exited %d: %s", name, code, warm.stderr())
	}
	var rates []float64
	for r := range rounds {
		procs := make([]*ptProc, n)
		start := time.Now()
		for i := range n {
			procs[i] = e.start(ctx, fmt.Sprintf("r%d-%02d", r, i), args...)
		}
		var last time.Time
		for i, q := range procs {
			if code := q.wait(t, 2*time.Minute); code != 0 {
				t.Fatalf("%s round %d run %d exited %d: %s", name, r, i, code, q.stderr())
			}
			if q.exitedAt.After(last) {
				last = q.exitedAt
			}
		}
		wall := last.Sub(start)
		rates = append(rates, float64(n)/wall.Seconds())
		t.Logf("%-8s round %d: %d runs in %s = %.0f admissions/s", name, r, n, wall.Round(time.Millisecond), float64(n)/wall.Seconds())
	}
	return rates
}

// --- burst ---

// burst: 64 concurrent run -- true on one slot, against 64 concurrent flock
// FILE true; each peer's rate is 64 / the round's wall time. Every run
// queues behind the others, so this is the store's lock, the wake-ups and
// the handoffs under contention rather than one uncontended run.
func (b *cmpBench) burst(t *testing.T) {
	const n, rounds = 64, 5
	type peer struct {
		name, bin string
		args      []string
	}
	peers := []peer{{"slotctl", b.bin, []string{"run", "--limit", "b", "--", "true"}}}
	if b.flock != "" {
		peers = append(peers, peer{"flock", b.flock, []string{"flock.lock", "true"}})
	}
	rates := map[string][]float64{}
	var slotctlEnv *ptEnv
	for _, p := range peers {
		e := cmpPTEnv(t, cmpDir(t, b.base, "burst-"+p.name), p.bin)
		if p.name == "slotctl" {
			slotctlEnv = e
		}
		rates[p.name] = cmpRounds(t, e, p.name, p.args, n, rounds)
	}
	peak, admitted := cmpPeakHeld(t, b.bin, slotctlEnv.env, "b")
	if peak > 1 {
		t.Errorf("%d tickets held at once on one slot", peak)
	}
	if want := 1 + rounds*n; admitted != want {
		t.Errorf("%d admissions in the event log, want %d", admitted, want)
	}
	s := cmpMedianF(rates["slotctl"])
	sv := fmt.Sprintf("%.0f/s (median of %d rounds, min %.0f); peak %d held", s, rounds, slices.Min(rates["slotctl"]), peak)
	pv, ratio, met := "flock not installed", "-", "-"
	if f, ok := rates["flock"]; ok {
		fm := cmpMedianF(f)
		pv, ratio, met = fmt.Sprintf("flock %.0f/s (median of %d)", fm, len(f)), fmt.Sprintf("%.1f× slower than flock", fm/s), cmpMet(fm/s <= 2 && peak <= 1)
	}
	b.row(cmpRow{fmt.Sprintf("burst: %d concurrent `-- true`, 1 slot", n), sv, pv, ratio, "≤ 2× slower than flock", met})
}

// --- memory ---

// memory: peak RSS (VmHWM) of slotctl supervising sleep 2, sampled until it
// exits; flock and sem doing the same are the peers.
func (b *cmpBench) memory(t *testing.T) {
	const reps = 5
	type peer struct {
		name, bin string
		args      []string
	}
	// slotctl-etcd is the released pair's other supervisor (any etcd store
	// runs in it); on the embedded store it shows what its binary costs.
	etcdBin := filepath.Join(filepath.Dir(b.bin), "slotctl-etcd")
	buildSlotctl(t, etcdBin, releaseSlotctlEtcd)
	peers := []peer{{"slotctl", b.bin, []string{"run", "--limit", "m", "--", "sleep", "2"}},
		{"slotctl-etcd", etcdBin, []string{"run", "--limit", "m", "--", "sleep", "2"}},
		{"go install", b.binInstall, []string{"run", "--limit", "m", "--", "sleep", "2"}}}
	if b.flock != "" {
		peers = append(peers, peer{"flock", b.flock, []string{"flock.lock", "sleep", "2"}})
	}
	if b.sem != "" {
		peers = append(peers, peer{"sem", b.sem, []string{"--will-cite", "--fg", "--id", "slotctl-bench-m-" + strconv.Itoa(os.Getpid()), "sleep", "2"}})
	}
	peaks := map[string][]float64{} // MB (10^6 bytes)
	for _, p := range peers {
		e := cmpPTEnv(t, cmpDir(t, b.base, "memory-"+p.name), p.bin)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for r := range reps {
			q := e.start(ctx, fmt.Sprintf("m%d", r), p.args...)
			kb := 0
		sample:
			for {
				if v := cmpVmHWM(q.cmd.Process.Pid); v > 0 {
					kb = v
				}
				select {
				case <-q.done:
					break sample
				case <-time.After(50 * time.Millisecond):
				}
			}
			if code := q.wait(t, time.Second); code != 0 {
				t.Fatalf("%s exited %d: %s", p.name, code, q.stderr())
			}
			if kb == 0 {
				t.Fatalf("%s: no VmHWM read", p.name)
			}
			peaks[p.name] = append(peaks[p.name], float64(kb)*1024/1e6)
		}
		cancel()
		t.Logf("%-8s peak RSS over %d runs: median %.1f MB, max %.1f MB", p.name, reps, cmpMedianF(peaks[p.name]), slices.Max(peaks[p.name]))
	}
	var others []string
	for _, p := range peers[3:] {
		others = append(others, fmt.Sprintf("%s %.1f MB", p.name, cmpMedianF(peaks[p.name])))
	}
	for _, p := range peers[:3] {
		s := peaks[p.name]
		ratio := "-"
		if f, ok := peaks["flock"]; ok {
			ratio = fmt.Sprintf("%.1f× flock", cmpMedianF(s)/cmpMedianF(f))
		}
		b.row(cmpRow{"supervisor memory: peak RSS (VmHWM) while its child sleeps, " + p.name,
			fmt.Sprintf("%.1f MB (max of %d: %.1f)", cmpMedianF(s), reps, slices.Max(s)), strings.Join(others, ", "), ratio, "≤ 10 MB", cmpMet(slices.Max(s) <= 10)})
	}
}

// --- inspection ---

// inspection: the whole slotctl ls -o json, ls and metrics commands on
// 10,000 tickets across 100 limits, 15 rounds (after one that warms the
// page cache), the three in a rotating order each round. Each figure is the
// median of wall time and of CPU time (user+sys, which the machine's other
// load disturbs less). metrics runs in slotctl-etcd, built beside slotctl.
func (b *cmpBench) inspection(t *testing.T) {
	const runs = 15
	dir := cmpDir(t, b.base, "inspection")
	buildSlotctl(t, filepath.Join(filepath.Dir(b.bin), "slotctl-etcd"), releaseSlotctlEtcd)
	path := filepath.Join(dir, "slots.db")
	t0 := time.Now()
	lsBigStore(t, path)
	t.Logf("built a store of 10,000 tickets across 100 limits in %s", time.Since(t0).Round(time.Millisecond))
	env := cmpEnv(dir)
	cmds := [][]string{{"ls", "-o", "json"}, {"ls"}, {"metrics"}}
	wall, cpu := map[string][]time.Duration{}, map[string][]time.Duration{}
	var size int
	for i := -1; i < runs; i++ {
		for j := range cmds {
			args := cmds[(max(i, 0)+j)%len(cmds)]
			cmd := exec.Command(b.bin, args...)
			cmd.Env = env
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = io.Discard, &errb // a pipe still, read at once: not a buffer of megabytes growing in this process
			name := strings.Join(args, " ")
			if i < 0 {
				cmd.Stdout = &out // the warm-up round's output is checked
			}
			start := time.Now()
			if err := cmd.Run(); err != nil {
				t.Fatalf("slotctl %s: %v: %s", name, err, errb.String())
			}
			d := time.Since(start)
			if i < 0 && name == "ls -o json" {
				var snap struct {
					Tickets []json.RawMessage `json:"tickets"`
				}
				if err := json.Unmarshal(out.Bytes(), &snap); err != nil || len(snap.Tickets) != 10000 {
					t.Fatalf("ls -o json: %d tickets, %v; want 10000", len(snap.Tickets), err)
				}
				size = out.Len()
			}
			if i >= 0 {
				wall[name] = append(wall[name], d)
				cpu[name] = append(cpu[name], cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
			}
		}
	}
	j, tb, m := "ls -o json", "ls", "metrics"
	t.Logf("ls -o json: median %s, p90 %s, min %s, CPU %s (%d runs, %.1f MB of JSON); ls (table): median %s, CPU %s; metrics: median %s, p90 %s, CPU %s",
		cmpMS(cmpPct(wall[j], 50)), cmpMS(cmpPct(wall[j], 90)), cmpMS(cmpPct(wall[j], 0)), cmpMS(cmpPct(cpu[j], 50)), runs, float64(size)/1e6,
		cmpMS(cmpPct(wall[tb], 50)), cmpMS(cmpPct(cpu[tb], 50)), cmpMS(cmpPct(wall[m], 50)), cmpMS(cmpPct(wall[m], 90)), cmpMS(cmpPct(cpu[m], 50)))
	b.row(cmpRow{"inspection: `ls -o json`, 10,000 tickets / 100 limits, whole command",
		fmt.Sprintf("%s (p90 %s, CPU %s; table `ls` %s, CPU %s)", cmpMS(cmpPct(wall[j], 50)), cmpMS(cmpPct(wall[j], 90)), cmpMS(cmpPct(cpu[j], 50)),
			cmpMS(cmpPct(wall[tb], 50)), cmpMS(cmpPct(cpu[tb], 50))), "-", "-", "≤ 100 ms", cmpMet(cmpPct(wall[j], 50) <= 100*time.Millisecond)})
	b.row(cmpRow{"`metrics`, 10,000 tickets / 100 limits, whole command",
		fmt.Sprintf("%s (p90 %s, CPU %s)", cmpMS(cmpPct(wall[m], 50)), cmpMS(cmpPct(wall[m], 90)), cmpMS(cmpPct(cpu[m], 50))), "-", "-", "≤ 100 ms",
		cmpMet(cmpPct(wall[m], 50) <= 100*time.Millisecond)})
}

// --- helpers ---

func cmpEnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// cmpDir is a fresh directory for one figure under base.
func cmpDir(t *testing.T, base, name string) string {
	t.Helper()
	dir := filepath.Join(base, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cmpEnv is the environment of every process of a figure: none of the
// caller's SLOTCTL_* settings or config, the store in dir.
func cmpEnv(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SLOTCTL") || k == "HOME" || strings.HasPrefix(k, "XDG_") || k == "NO_COLOR" {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"HOME="+filepath.Join(dir, "home"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "home", ".config"),
		"XDG_STATE_HOME="+filepath.Join(dir, "home", ".local", "state"),
		"SLOTCTL_STORE="+filepath.Join(dir, "slots.db"),
	)
}

// cmpPTEnv runs bin (slotctl or a peer) as process_test.go's helpers do:
// in dir, stdin /dev/null, output to files, bounded, SIGKILLed at cleanup.
func cmpPTEnv(t *testing.T, dir, bin string) *ptEnv {
	e := &ptEnv{t: t, dir: dir, bin: bin, env: cmpEnv(dir)}
	t.Cleanup(e.cleanup)
	return e
}

// cmpPoke writes a line to a FIFO a child is (about to be) reading.
func cmpPoke(t *testing.T, path string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0) // blocks until the reader opens it
		if err == nil {
			_, err = f.WriteString("go\n")
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		if fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK, 0); err == nil { // unblock the writer
			defer unix.Close(fd)
			<-done
		}
		t.Fatalf("nobody read %s within 10s", path)
	}
}

// cmpCPU sums the CPU time used so far by the processes: utime+stime from
// /proc/PID/stat (clock ticks) and the run time of every thread from
// /proc/PID/task/*/schedstat (ns).
func cmpCPU(t *testing.T, pids []int) (ticks int64, ns int64) {
	t.Helper()
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // f[0] is field 3 (state)
		ut, err1 := strconv.ParseInt(f[14-3], 10, 64)
		st, err2 := strconv.ParseInt(f[15-3], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("pid %d: cannot parse %q", pid, s)
		}
		ticks += ut + st
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		for _, task := range tasks {
			b, err := os.ReadFile(task)
			if err != nil {
				continue // the thread just exited
			}
			if v, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64); err == nil {
				ns += v
			}
		}
	}
	return ticks, ns
}

// cmpVmHWM is the peak resident set size of pid in kB, 0 if unreadable.
func cmpVmHWM(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			v, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return v
		}
	}
	return 0
}

// cmpLsCounts reads one limit's held and waiting counts with slotctl ls -o json.
func cmpLsCounts(t *testing.T, bin string, env []string, limit string) (held, waiting int) {
	t.Helper()
	cmd := exec.Command(bin, "ls", limit, "-o", "json")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("slotctl ls: %v", err)
	}
	var snap struct {
		Limits []struct {
			Name    string `json:"name"`
			Held    int    `json:"held"`
			Waiting int    `json:"waiting"`
		} `json:"limits"`
	}
	if err := json.Unmarshal(out, &snap); err != nil || len(snap.Limits) != 1 {
		t.Fatalf("slotctl ls -o json: %v: %s", err, out)
	}
	return snap.Limits[0].Held, snap.Limits[0].Waiting
}

// cmpPeakHeld replays the limit's event log: the most tickets held at once,
// and how many admissions there were.
func cmpPeakHeld(t *testing.T, bin string, env []string, limit string) (peak, admitted int) {
	t.Helper()
	cmd := exec.Command(bin, "log", limit, "-n", "10000", "-o", "json")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("slotctl log: %v", err)
	}
	held := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct {
			Seq    uint64 `json:"seq"`
			Kind   string `json:"kind"`
			Ticket string `json:"ticket"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("slotctl log -o json: %v: %s", err, sc.Bytes())
		}
		if ev.Kind == "admitted" {
			admitted++
			held[ev.Ticket] = true
			peak = max(peak, len(held))
		} else {
			delete(held, ev.Ticket)
		}
	}
	return peak, admitted
}

// cmpPct is the p-th percentile (nearest rank) of ts; 0 is the minimum.
func cmpPct(ts []time.Duration, p float64) time.Duration {
	s := slices.Clone(ts)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func cmpMedianF(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func cmpMS(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms >= 100 {
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f ms", ms)
}

func cmpMet(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// cmpInOrder counts the leading entries of got that are 0, 1, 2, ...
func cmpInOrder(got []string) int {
	for i, s := range got {
		if s != strconv.Itoa(i) {
			return i
		}
	}
	return len(got)
}

// cmpMachine describes where the figures were measured.
func cmpMachine(dir, flock, sem string) string {
	model := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	load, _ := os.ReadFile("/proc/loadavg")
	fs := "?"
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil {
		fs = map[int64]string{0xEF53: "ext4", 0x01021994: "tmpfs", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x794c7630: "overlayfs"}[int64(st.Type)]
		if fs == "" {
			fs = fmt.Sprintf("fs 0x%x", st.Type)
		}
	}
	peers := []string{}
	for _, p := range []struct{ name, bin string }{{"flock", flock}, {"sem", sem}} {
		if p.bin == "" {
			peers = append(peers, p.name+" not installed")
			continue
		}
		out, _ := exec.Command(p.bin, "--version").Output()
		first, _, _ := strings.Cut(string(out), "\n")
		peers = append(peers, strings.TrimSpace(first))
	}
	return fmt.Sprintf("machine: %s, %d CPUs, Linux %s, %s; store on %s (%s); load average %s; peers: %s; %s",
		model, runtime.NumCPU(), strings.TrimSpace(string(kernel)), runtime.Version(), fs, dir,
		strings.Join(strings.Fields(string(load))[:3], " "), strings.Join(peers, ", "), time.Now().UTC().Format(time.RFC3339))
}
