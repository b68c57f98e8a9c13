package cli

// Process tests of slotctl run --jobserver (docs/leases.md §2.1 item 12): real
// slotctl processes, real GNU make (pipe style: make 4.3 refuses the fifo
// style) and a jobserver client of the fifo style in sh, sharing one limit.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
)

// jsMakefile: N recipes that record their start and end in $(LOG); with
// FAIL set, one of them fails with status 3 (make exits 2).
const jsMakefile = `N ?= 40
T := $(shell seq 1 $(N))
all: $(addprefix r,$(T)) $(if $(FAIL),fail)
r%:
	@echo "s $@ $$(date +%s%N)" >> $(LOG); sleep $(SLEEP); echo "e $@ $$(date +%s%N)" >> $(LOG)
fail:
	@exit 3
`

// jsClient is a jobserver client of the fifo style in sh: $2 recipes,
// logged in $1; one worker runs on the job's own slot, each other one takes
// a token from the FIFO for each recipe and gives it back after (dd with
// iflag=nonblock, polled every 50 ms: no worker blocks on the FIFO at the
// end).
const jsClient = `set -e
log=$1 n=$2
case $MAKEFLAGS in *--jobserver-auth=fifo:*) ;; *) echo "no fifo in MAKEFLAGS: $MAKEFLAGS" >&2; exit 9;; esac
fifo=${MAKEFLAGS##*--jobserver-auth=fifo:}; fifo=${fifo%% *}
jobs=${MAKEFLAGS#*-j}; jobs=${jobs%% *}
exec 3<>"$fifo"
recipe() { echo "s r$1 $(date +%s%N)" >> "$log"; sleep "$SLEEP"; echo "e r$1 $(date +%s%N)" >> "$log"; }
claim() { i=1; while [ $i -le $n ]; do if mkdir "claim.$log.$i" 2>/dev/null; then echo $i; return 0; fi; i=$((i+1)); done; return 1; }
acquire() {
	while :; do
		tok=$(dd bs=1 count=1 iflag=nonblock status=none <&3 2>/dev/null || true)
		[ -n "$tok" ] && return 0
		[ -d "claim.$log.$n" ] && return 1
		sleep 0.05
	done
}
worker() {
	while :; do
		if [ "$1" = token ]; then acquire || return 0; fi
		if ! r=$(claim); then [ "$1" = token ] && printf %s "$tok" >&3; return 0; fi
		recipe "$r"
		if [ "$1" = token ]; then printf %s "$tok" >&3; fi
	done
}
k=1; while [ $k -lt $jobs ]; do worker token & k=$((k+1)); done
worker own
wait
`

// jsRecipe is one recipe's run as its log says.
type jsRecipe struct {
	build, name string
	start, end  int64
}

// readJSLog reads a build's log: its recipes, each started and ended once.
func readJSLog(t *testing.T, path, build string) []jsRecipe {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	byName := map[string]*jsRecipe{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kind, name string
		var ns int64
		if _, err := fmt.Sscanf(sc.Text(), "%s %s %d", &kind, &name, &ns); err != nil {
			t.Fatalf("%s: bad line %q", path, sc.Text())
		}
		r := byName[name]
		if r == nil {
			r = &jsRecipe{build: build, name: name}
			byName[name] = r
		}
		switch {
		case kind == "s" && r.start == 0:
			r.start = ns
		case kind == "e" && r.end == 0:
			r.end = ns
		default:
			t.Fatalf("%s: %s %s twice", path, kind, name)
		}
	}
	var out []jsRecipe
	for _, r := range byName {
		if r.start == 0 || r.end == 0 {
			t.Fatalf("%s: %s did not both start and end", path, r.name)
		}
		out = append(out, *r)
	}
	return out
}

// jsEvent is a recipe's start (d +1) or end (d -1).
type jsEvent struct {
	at    int64
	d     int
	build string
}

// jsEvents are the recipes' starts and ends in time order.
func jsEvents(recipes []jsRecipe) []jsEvent {
	var evs []jsEvent
	for _, r := range recipes {
		evs = append(evs, jsEvent{r.start, 1, r.build}, jsEvent{r.end, -1, r.build})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].d < evs[j].d // an end before a start at the same instant
	})
	return evs
}

// jsPeak is the most recipes running at once, and the most of each build
// running at once before deadline (ns).
func jsPeak(recipes []jsRecipe, deadline int64) (int, map[string]int, int64) {
	evs := jsEvents(recipes)
	peak, n := 0, 0
	per := map[string]int{}
	early := map[string]int{}
	both := int64(0) // the first instant at which every build runs at least 2
	for _, e := range evs {
		n += e.d
		per[e.build] += e.d
		peak = max(peak, n)
		if e.at <= deadline {
			early[e.build] = max(early[e.build], per[e.build])
		}
		if both == 0 && len(per) > 1 {
			all := true
			for _, k := range per {
				all = all && k >= 2
			}
			if all {
				both = e.at
			}
		}
	}
	return peak, early, both
}

// jsTimeline logs when each build ran how many recipes, in tenths of a
// second from the later start.
func jsTimeline(t *testing.T, recipes []jsRecipe, later time.Time) {
	t.Helper()
	per := map[string]int{}
	var b strings.Builder
	for _, e := range jsEvents(recipes) {
		per[e.build] += e.d
		fmt.Fprintf(&b, "%+.1fs %v\n", time.Duration(e.at-later.UnixNano()).Seconds(), per)
	}
	t.Logf("recipes running, by build, from the later start:\n%s", b.String())
}

type jsBuild struct {
	name string
	args []string // after slotctl run --limit cpu --jobserver
}

// jsBuilds runs builds at once (each next one delay after the one before
// it runs its first recipe) on a limit of 6 and checks the jobserver's
// promises: never more than 6 recipes at once, at some instant both builds
// run at least 2 recipes (the first gave slots back: without that, the
// second would run one at a time until the first ended), all recipes run
// once, the exit statuses pass through, ls shows the weights while they
// run, and no slot is held afterwards. How soon after the later start the
// two share is logged, a figure: a loaded machine makes it as late as it
// likes.
func jsBuilds(t *testing.T, e *ptEnv, builds []jsBuild, delay time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if out, err := e.output("limit", "set", "cpu", "6"); err != nil {
		t.Fatalf("limit set: %v\n%s", err, out)
	}
	for _, name := range []string{"Makefile", "client.sh"} {
		body := jsMakefile
		if name == "client.sh" {
			body = jsClient
		}
		if err := os.WriteFile(e.path(name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Each build runs 40 recipes of 0.4 s, 6 at a time: about 3 s alone,
	// time enough for the second to be given slots while the first runs.
	e.env = append(e.env, "SLEEP=0.4")

	// ls -o json while they run: the sum of the weights never exceeds 6,
	// and a build's weight shows above 1.
	stopWatch := make(chan struct{})
	var watch sync.WaitGroup
	var maxSum, maxWeight int
	watch.Add(1)
	go func() {
		defer watch.Done()
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(100 * time.Millisecond):
			}
			out, err := e.output("ls", "-o", "json", "cpu")
			if err != nil {
				continue
			}
			var ls struct {
				Tickets []struct {
					State  string `json:"state"`
					Weight int    `json:"weight"`
				} `json:"tickets"`
			}
			if json.Unmarshal([]byte(out), &ls) != nil {
				continue
			}
			sum := 0
			for _, tk := range ls.Tickets {
				if tk.State == "held" {
					sum += tk.Weight
					maxWeight = max(maxWeight, tk.Weight)
				}
			}
			maxSum = max(maxSum, sum)
		}
	}()

	procs := make([]*ptProc, len(builds))
	var later time.Time
	for i, b := range builds {
		if i > 0 {
			prev := builds[i-1].name + ".log"
			ptWaitFor(t, "the first recipe of build "+builds[i-1].name, 20*time.Second, func() bool { return ptExists(e.path(prev)) })
			time.Sleep(delay)
		}
		later = time.Now()
		args := append([]string{"run", "--limit", "cpu", "--jobserver"}, b.args...)
		procs[i] = e.start(ctx, b.name, args...)
	}
	for i, p := range procs {
		if code := p.wait(t, 40*time.Second); code != 0 {
			t.Errorf("build %s exited %d, want 0; stderr:\n%s", builds[i].name, code, p.stderr())
		}
	}
	close(stopWatch)
	watch.Wait()
	if t.Failed() {
		return
	}
	var all []jsRecipe
	for _, b := range builds {
		rs := readJSLog(t, e.path(b.name+".log"), b.name)
		if len(rs) != 40 {
			t.Errorf("build %s ran %d recipes, want 40", b.name, len(rs))
		}
		all = append(all, rs...)
	}
	peak, early, both := jsPeak(all, later.Add(time.Second).UnixNano())
	bothAt := "never"
	if both != 0 {
		bothAt = time.Duration(both - later.UnixNano()).Round(time.Millisecond).String()
	}
	t.Logf("peak %d recipes at once; the most of each build within a second of the later start: %v; both at 2+ %s after it; ls: weights summing to %d at most, one of %d",
		peak, early, bothAt, maxSum, maxWeight)
	if peak > 6 {
		t.Errorf("%d recipes ran at once on a limit of 6", peak)
	}
	if both == 0 {
		// On a loaded machine the first build can take back every slot its
		// recipes free before the second build's server grows into it: the
		// second then runs one recipe at a time until the first ends. Safe
		// (never more than 6), but not the sharing the jobserver promises:
		// a fairness gap, asserted in the long suite, where these tests run
		// alone, and shown here.
		report := t.Logf
		if longtest.Enabled() {
			report = t.Errorf
		}
		report("the builds never both ran 2 recipes at once (the most of each within a second of the later start: %v)", early)
		jsTimeline(t, all, later)
	}
	if maxSum > 6 || maxWeight < 2 {
		t.Errorf("ls showed held weights summing to %d (want at most 6) and at most %d (want a build above 1)", maxSum, maxWeight)
	}
	jsNothingHeld(t, e)
}

// jsNothingHeld: ls shows no ticket of cpu.
func jsNothingHeld(t *testing.T, e *ptEnv) {
	t.Helper()
	out, err := e.output("ls", "-o", "json", "cpu")
	if err != nil {
		t.Fatalf("ls: %v", err)
	}
	var ls struct {
		Limits []struct {
			Held int `json:"held"`
		} `json:"limits"`
		Tickets []json.RawMessage `json:"tickets"`
	}
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatal(err)
	}
	if len(ls.Tickets) != 0 || len(ls.Limits) != 1 || ls.Limits[0].Held != 0 {
		t.Errorf("after the builds: %s", out)
	}
}

func needMake(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("GNU make is not installed (.ci/run installs it): %v", err)
	}
}

// Two makes (pipe style, make 4.3 on this machine), the second 800 ms after
// the first: the first has taken the whole limit by then, and gives back
// for the second.
func TestJobserverTwoMakes(t *testing.T) {
	needMake(t)
	e := newPTEnvAlone(t)
	jsManyCPUs(e)
	jsBuilds(t, e, []jsBuild{
		{"a", []string{"--", "make", "-s", "LOG=a.log"}},
		{"b", []string{"--", "make", "-s", "LOG=b.log"}},
	}, 800*time.Millisecond)
}

// A make and a client of the fifo style share the limit.
func TestJobserverMakeAndFIFOClient(t *testing.T) {
	needMake(t)
	e := newPTEnvAlone(t)
	jsManyCPUs(e)
	jsBuilds(t, e, []jsBuild{
		{"a", []string{"--", "make", "-s", "LOG=a.log"}},
		{"b", []string{"--jobserver-style", "fifo", "--", "sh", "client.sh", "b.log", "40"}},
	}, 300*time.Millisecond)
}

// The same two makes on etcd (the in-process server of etcdtest).
func TestJobserverTwoMakesEtcd(t *testing.T) {
	needMake(t)
	e, _ := etcdPTEnvWith(t, newPTEnvAlone)
	jsManyCPUs(e)
	jsBuilds(t, e, []jsBuild{
		{"a", []string{"--", "make", "-s", "LOG=a.log"}},
		{"b", []string{"--", "make", "-s", "LOG=b.log"}},
	}, 300*time.Millisecond)
}

// make's own status passes through (a recipe fails: make exits 2), and a
// command that is no jobserver client runs as one slot.
func TestJobserverExitStatus(t *testing.T) {
	needMake(t)
	e := newPTEnv(t)
	jsManyCPUs(e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := os.WriteFile(e.path("Makefile"), []byte(jsMakefile), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.start(ctx, "fail", "run", "--limit", "cpu", "--slots", "6", "--jobserver", "--", "make", "-s", "N=4", "SLEEP=0", "LOG=f.log", "FAIL=1")
	if code := p.wait(t, 20*time.Second); code != 2 {
		t.Errorf("make with a failing recipe: slotctl exited %d, want make's 2; stderr:\n%s", code, p.stderr())
	}
	p = e.start(ctx, "sh", "run", "--limit", "cpu", "--jobserver", "--", "sh", "-c", `echo "$MAKEFLAGS" > flags; exit 7`)
	if code := p.wait(t, 20*time.Second); code != 7 {
		t.Errorf("sh -c 'exit 7': slotctl exited %d, want 7; stderr:\n%s", code, p.stderr())
	}
	flags, _ := os.ReadFile(e.path("flags"))
	if got := strings.TrimSpace(string(flags)); got != "-j6 --jobserver-auth=3,4" {
		t.Errorf("MAKEFLAGS %q, want -j6 --jobserver-auth=3,4 (the pipe style, the limit's size)", got)
	}
	jsNothingHeld(t, e)
}

// A client that takes a token and dies: that slot stays the job's (the
// jobserver cannot tell it from a token in use, and never takes one back)
// until the job ends, when the release frees every slot. A waiter that
// needs it runs only then. The FIFO's private directory goes with the job.
func TestJobserverDeadClient(t *testing.T) {
	e := newPTEnv(t)
	jsManyCPUs(e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := e.output("limit", "set", "cpu", "3"); err != nil {
		t.Fatalf("limit set: %v\n%s", err, out)
	}
	// --ttl 2s: the job outlives several leases, renewed with its weight.
	job := e.start(ctx, "job", "run", "--limit", "cpu", "--ttl", "2s", "--jobserver", "--jobserver-style", "fifo", "--", "sh", "-c",
		`fifo=${MAKEFLAGS##*fifo:}; echo "$fifo" > fifo.path; dd if="$fifo" bs=1 count=1 status=none > /dev/null; touch took; `+
			`while [ ! -e go ]; do sleep 0.02; done; date +%s%N > ended`)
	ptWaitFor(t, "the client took a token", 10*time.Second, func() bool { return ptExists(e.path("took")) })
	fifo, _ := os.ReadFile(e.path("fifo.path"))
	dir := filepath.Dir(strings.TrimSpace(string(fifo)))
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("the FIFO's directory %s: %v, want mode 0700", dir, err)
	}
	weight := func() int {
		out, err := e.output("ls", "-o", "json", "cpu")
		if err != nil {
			return -1
		}
		var ls struct {
			Tickets []struct {
				Command string `json:"command"`
				State   string `json:"state"`
				Weight  int    `json:"weight"`
			} `json:"tickets"`
		}
		_ = json.Unmarshal([]byte(out), &ls)
		for _, tk := range ls.Tickets {
			if tk.State == "held" && strings.HasPrefix(tk.Command, "sh -c") {
				return tk.Weight
			}
		}
		return -1
	}
	// It grew to 3 (the dead client's token, and one unread).
	ptWaitFor(t, "the job to weigh 3", 5*time.Second, func() bool { return weight() == 3 })
	// A waiter of weight 2: the unread token comes back for it, the dead
	// client's never does, so it cannot run before the job ends.
	w := e.start(ctx, "waiter", "run", "--limit", "cpu", "--weight", "2", "--", "sh", "-c", `date +%s%N > waiter`)
	ptWaitFor(t, "the job to give back its unread token", 5*time.Second, func() bool { return weight() == 2 })
	time.Sleep(2500 * time.Millisecond) // past the first lease
	if ptExists(e.path("waiter")) {
		t.Fatalf("the waiter ran while the job still held the dead client's slot")
	}
	if got := weight(); got != 2 {
		t.Fatalf("the job weighs %d with a dead client's token out, want 2", got)
	}
	if err := os.WriteFile(e.path("go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := job.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("job exited %d; stderr:\n%s", code, job.stderr())
	}
	if code := w.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("waiter exited %d; stderr:\n%s", code, w.stderr())
	}
	ended, waited := ptReadInt(t, e.path("ended")), ptReadInt(t, e.path("waiter"))
	if waited < ended {
		t.Errorf("the waiter started %s before the job ended", time.Duration(ended-waited))
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the FIFO's directory %s is still there after the job: %v", dir, err)
	}
	jsNothingHeld(t, e)
}

// A crash frees every slot at once: the supervisor of a run that grew to
// the whole limit is SIGKILLed (its child dies with it); a run of the
// limit's full weight is admitted at once, by the proof of death, not
// after the 30 s TTL.
func TestJobserverCrashFreesAll(t *testing.T) {
	e := newPTEnv(t)
	jsManyCPUs(e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := e.output("limit", "set", "cpu", "3"); err != nil {
		t.Fatalf("limit set: %v\n%s", err, out)
	}
	job := e.start(ctx, "job", "run", "--limit", "cpu", "--jobserver", "--jobserver-style", "fifo", "--", "sh", "-c",
		`echo $$ > pid; fifo=${MAKEFLAGS##*fifo:}; exec 3<>"$fifo"; dd bs=1 count=2 status=none <&3 > /dev/null; touch took; exec sleep 60`)
	ptWaitFor(t, "the client took two tokens", 10*time.Second, func() bool { return ptExists(e.path("took")) })
	e.notePid(int(ptWaitInt(t, e.path("pid"), 5*time.Second)))
	ptWaitFor(t, "the job to hold the whole limit", 5*time.Second, func() bool {
		out, _ := e.output("ls", "-o", "json", "cpu")
		return strings.Contains(out, `"weight": 3`) || strings.Contains(out, `"weight":3`)
	})
	_ = job.cmd.Process.Kill()
	<-job.done
	start := time.Now()
	next := e.start(ctx, "next", "run", "--limit", "cpu", "--weight", "3", "--wait", "10s", "--", "true")
	if code := next.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("a run of weight 3 after the crash exited %d; stderr:\n%s", code, next.stderr())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the crashed run's 3 slots came back after %s, want at once (proof of death)", d.Round(time.Millisecond))
	}
	jsNothingHeld(t, e)
}

// MAKEFLAGS keeps what it held (an outer make's -j and jobserver replaced),
// and a nested run under an ancestor that holds its limit leaves it alone:
// its build joins the ancestor's jobserver.
func TestJobserverMakeflags(t *testing.T) {
	e := newPTEnv(t)
	jsManyCPUs(e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.env = append(e.env, "MAKEFLAGS=ks -j9 --jobserver-auth=7,8 -- FOO=a\\ b")
	p := e.start(ctx, "outer", "run", "--limit", "cpu", "--slots", "4", "--jobserver", "--jobserver-max", "3", "--", "sh", "-c",
		`echo "$MAKEFLAGS" > outer; slotctl run --limit cpu --jobserver -- sh -c 'echo "$MAKEFLAGS" > inner'`)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr())
	}
	outer, _ := os.ReadFile(e.path("outer"))
	inner, _ := os.ReadFile(e.path("inner"))
	if want := "ks -j3 --jobserver-auth=3,4 -- FOO=a\\ b\n"; string(outer) != want {
		t.Errorf("MAKEFLAGS %q, want %q", outer, want)
	}
	if string(inner) != string(outer) {
		t.Errorf("nested run's MAKEFLAGS %q, want the ancestor's %q", inner, outer)
	}
	jsNothingHeld(t, e)
}

// jsManyCPUs makes e's slotctl see a host of 64 CPUs, so that a build's
// jobs are bounded by its limit, as these tests size them, not by this
// machine (TestJobserverHostCPUs tests that bound).
func jsManyCPUs(e *ptEnv) { e.env = append(e.env, "SLOTCTLTEST_CPUS=64") }

// A build takes at most the host's CPU count by default, whatever the
// limit's size (any member can resize a shared limit): on a limit of 5000
// slots, make gets -jN with N the CPUs slotctl may run on, and a client
// that takes every token it can gets N-1. --jobserver-max overrides it.
func TestJobserverHostCPUs(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cpus := runtime.NumCPU() // this process's affinity, which the child inherits
	if out, err := e.output("limit", "set", "cpu", "5000"); err != nil {
		t.Fatalf("limit set: %v\n%s", err, out)
	}
	// The client reads every token it is given for two seconds: the
	// jobserver grows the ticket while all are in use.
	p := e.start(ctx, "greedy", "run", "--limit", "cpu", "--jobserver", "--", "sh", "-c",
		`echo "$MAKEFLAGS" > flags; timeout 2 cat <&3 > tokens; exit 0`)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr())
	}
	flags, _ := os.ReadFile(e.path("flags"))
	if got, want := strings.TrimSpace(string(flags)), fmt.Sprintf("-j%d --jobserver-auth=3,4", cpus); got != want {
		t.Errorf("limit of 5000 on %d CPUs: MAKEFLAGS %q, want %q", cpus, got, want)
	}
	if tokens, _ := os.ReadFile(e.path("tokens")); len(tokens) > cpus-1 {
		t.Errorf("limit of 5000 on %d CPUs: the client got %d tokens, want at most %d", cpus, len(tokens), cpus-1)
	}
	p = e.start(ctx, "max", "run", "--limit", "cpu", "--jobserver", "--jobserver-max", "5000", "--", "sh", "-c", `echo "$MAKEFLAGS" > flags`)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr())
	}
	flags, _ = os.ReadFile(e.path("flags"))
	if got := strings.TrimSpace(string(flags)); got != "-j5000 --jobserver-auth=3,4" {
		t.Errorf("--jobserver-max 5000: MAKEFLAGS %q, want -j5000", got)
	}
	jsNothingHeld(t, e)
}

// Bad jobserver flags: one line, exit 64.
func TestJobserverBadFlags(t *testing.T) {
	e := newPTEnv(t)
	jsManyCPUs(e)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--jobserver", "--jobserver-style", "sem"}, `slotctl: --jobserver-style "sem": want auto, pipe or fifo`},
		{[]string{"--jobserver", "--jobserver-max", "0"}, `slotctl: --jobserver-max 0: want 1..65535`},
		{[]string{"--jobserver", "--jobserver-max", "70000"}, `slotctl: --jobserver-max 70000: want 1..65535`},
		{[]string{"--jobserver-max", "3"}, `slotctl: --jobserver-max needs --jobserver`},
		{[]string{"--jobserver-style", "fifo"}, `slotctl: --jobserver-style needs --jobserver`},
		{[]string{"--jobserver", "--weight", "2"}, `slotctl: --weight 2 with --jobserver: the jobserver sizes the weight`},
	} {
		args := append(append([]string{"run", "--limit", "cpu"}, tc.args...), "--", "true")
		cmd := exec.Command(e.bin, args...)
		cmd.Dir, cmd.Env = e.dir, e.env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := -1
		if cmd.ProcessState != nil {
			code = cmd.ProcessState.ExitCode()
		}
		lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
		if code != exitUsage || len(lines) != 1 || !strings.HasPrefix(lines[0], tc.want) {
			t.Errorf("slotctl %s: exit %d (%v), stderr %q; want 64 and one line starting %q", strings.Join(args, " "), code, err, stderr.String(), tc.want)
		}
	}
}

// TestJobserverPerformance (SLOTCTLTEST_JOBSERVER_PERF=1; run it on a quiet
// machine): two concurrent builds of 40 recipes x 0.2 s under slotctl run
// --jobserver on a limit of 6 against one make -j6 of all 80 recipes, the
// median of 5 of each. Goal: within 1.15x.
//
//	SLOTCTLTEST_JOBSERVER_PERF=1 go test -count=1 -run TestJobserverPerformance -v ./cmd/internal/cli
func TestJobserverPerformance(t *testing.T) {
	if os.Getenv("SLOTCTLTEST_JOBSERVER_PERF") == "" {
		t.Skip("set SLOTCTLTEST_JOBSERVER_PERF=1 to measure (on a quiet machine)")
	}
	needMake(t)
	e := newPTEnv(t)
	jsManyCPUs(e)
	if out, err := e.output("limit", "set", "cpu", "6"); err != nil {
		t.Fatalf("limit set: %v\n%s", err, out)
	}
	if err := os.WriteFile(e.path("Makefile"), []byte(jsMakefile), 0o644); err != nil {
		t.Fatal(err)
	}
	e.env = append(e.env, "SLEEP=0.2")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := func(name string, argv ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir, cmd.Env = e.dir, e.env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	wait := func(cmds ...*exec.Cmd) {
		for _, c := range cmds {
			if err := c.Wait(); err != nil {
				t.Fatalf("%s: %v", c.Args, err)
			}
		}
	}
	const rounds = 5
	var plain, shared []time.Duration
	for i := range rounds {
		start := time.Now()
		wait(run("make", "make", "-s", "-j6", "N=80", fmt.Sprintf("LOG=p%d.log", i)))
		plain = append(plain, time.Since(start))

		start = time.Now()
		a := run("a", e.bin, "run", "--limit", "cpu", "--jobserver", "--", "make", "-s", fmt.Sprintf("LOG=a%d.log", i))
		b := run("b", e.bin, "run", "--limit", "cpu", "--jobserver", "--", "make", "-s", fmt.Sprintf("LOG=b%d.log", i))
		wait(a, b)
		shared = append(shared, time.Since(start))
	}
	median := func(d []time.Duration) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	mp, ms := median(plain), median(shared)
	ratio := float64(ms) / float64(mp)
	t.Logf("make -j6 of 80 recipes: median %s %v; two slotctl run --jobserver of 40 on a limit of 6: median %s %v; ratio %.3f (goal <= 1.15)",
		mp.Round(time.Millisecond), plain, ms.Round(time.Millisecond), shared, ratio)
	if ratio > 1.15 {
		t.Errorf("two jobserver builds took %.3fx one make -j6 of both, want <= 1.15x", ratio)
	}
	jsNothingHeld(t, e)
}
