package cli

// Process tests: the real slotctl binary (this test binary, which TestMain
// puts on PATH as "slotctl"), run as real processes, sent real signals, with
// a real bbolt store in a temporary directory. Every test is bounded by a
// context timeout; leftovers are SIGKILLed in t.Cleanup.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// ptEnv is one test's store directory, environment and slotctl binary.
type ptEnv struct {
	t   *testing.T
	dir string
	bin string
	env []string

	mu    sync.Mutex
	procs []*ptProc
	pids  []int // children's pids (group leaders): killed with their groups at cleanup
}

// Process tests spend their time waiting on leases and children: they run
// beside each other and the scripts (-parallel, 8 by TestMain).
func newPTEnv(t *testing.T) *ptEnv {
	t.Helper()
	e := newPTEnvAlone(t)
	t.Parallel()
	return e
}

// newPTEnvAlone is newPTEnv for a test that loads the machine itself (dozens
// of processes, two builds): it runs before the parallel tests, beside no
// other test of this package.
func newPTEnvAlone(t *testing.T) *ptEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("process tests take seconds; skipped with -short")
	}
	bin := slotctlPath(t)
	dir := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "SLOTCTL_"), k == "HOME", k == "XDG_CONFIG_HOME", k == "XDG_STATE_HOME", k == "NO_COLOR",
			slices.Contains(ciURLVars, k), slices.Contains(ciEnvVars, k): // a test sets the CI's variables itself
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		"HOME="+filepath.Join(dir, "home"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "home", ".config"),
		"XDG_STATE_HOME="+filepath.Join(dir, "home", ".local", "state"),
		"SLOTCTL_STORE="+filepath.Join(dir, "slots.db"),
	)
	env = append(env, testguard.Test(t).Env()) // what outlives the test is killed
	// What slotctl leaves in the temporary directory when a test kills it
	// (a jobserver's FIFO directory) goes with the test's directory.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	env = append(env, "TMPDIR="+tmp)
	if os.Getenv("GORACE") == "" {
		// A -race binary otherwise sleeps 1s when it exits 0, which
		// would blur the timings measured here.
		env = append(env, "GORACE=atexit_sleep_ms=0")
	}
	e := &ptEnv{t: t, dir: dir, bin: bin, env: env}
	t.Cleanup(e.cleanup)
	return e
}

// ciURLVars are the variables slotctl reads a CI run's URL from.
var ciURLVars = []string{"GITHUB_RUN_ID", "GITHUB_REPOSITORY", "GITHUB_SERVER_URL", "CI_JOB_URL", "BUILDKITE_BUILD_URL", "BUILD_URL"}

// ciEnvVars are the other variables of a CI that change what a waiting
// run prints or writes (progress.go): a test run in CI must not inherit them.
var ciEnvVars = []string{"CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL", "TF_BUILD", "GITHUB_STEP_SUMMARY"}

// path is a file in the test's directory.
func (e *ptEnv) path(name string) string { return filepath.Join(e.dir, name) }

// cleanup SIGKILLs every slotctl still running and every child group noted.
func (e *ptEnv) cleanup() {
	e.mu.Lock()
	procs, pids := e.procs, e.pids
	e.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				e.t.Errorf("slotctl %s (pid %d) did not go away after SIGKILL", p.name, p.cmd.Process.Pid)
			}
		}
	}
	for _, pid := range pids {
		if pid > 1 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// notePid records a child's pid for cleanup.
func (e *ptEnv) notePid(pid int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pids = append(e.pids, pid)
}

// ptProc is one running slotctl.
type ptProc struct {
	name     string
	cmd      *exec.Cmd
	started  time.Time
	done     chan struct{}
	exitedAt time.Time
	waitErr  error
	errPath  string
}

// start runs slotctl with args in the test's directory; stdin is /dev/null
// (not a terminal: the child gets its own process group), stdout and stderr
// go to files, so no pipe outlives slotctl. ctx bounds it: SIGKILL when done.
func (e *ptEnv) start(ctx context.Context, name string, args ...string) *ptProc {
	e.t.Helper()
	return e.startProgram(ctx, name, e.bin, args...)
}

// startProgram is start for any program (unshare wrapping slotctl, say).
func (e *ptEnv) startProgram(ctx context.Context, name, path string, args ...string) *ptProc {
	e.t.Helper()
	out, err := os.Create(e.path(name + ".stdout"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer out.Close()
	errf, err := os.Create(e.path(name + ".stderr"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer errf.Close()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir, cmd.Env = e.dir, e.env
	cmd.Stdout, cmd.Stderr = out, errf
	p := &ptProc{name: name, cmd: cmd, done: make(chan struct{}), errPath: errf.Name(), started: time.Now()}
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start %s %s: %v", path, name, err)
	}
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	go func() {
		p.waitErr = cmd.Wait()
		p.exitedAt = time.Now()
		close(p.done)
	}()
	return p
}

// wait waits for slotctl to exit (bounded by timeout) and returns its exit
// status; -1 if it was killed by a signal.
func (p *ptProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("slotctl %s did not exit within %s; stderr:\n%s", p.name, timeout, p.stderr())
	}
	var ee *exec.ExitError
	if p.waitErr != nil && !errors.As(p.waitErr, &ee) {
		t.Fatalf("slotctl %s: %v", p.name, p.waitErr)
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *ptProc) stderr() string {
	b, _ := os.ReadFile(p.errPath)
	return string(b)
}

// ptWaitFor polls until cond holds, failing the test after timeout.
func ptWaitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ptExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// ptReadInt reads a file holding one integer (a pid, a timestamp in ns).
func ptReadInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %q is not an integer", path, b)
	}
	return n
}

// ptWaitInt waits for a file that holds one integer and reads it.
func ptWaitInt(t *testing.T, path string, timeout time.Duration) int64 {
	t.Helper()
	var n int64
	ptWaitFor(t, filepath.Base(path), timeout, func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		n = v
		return err == nil
	})
	return n
}

// ptGone reports whether pid no longer runs: no such process, or a zombie
// (reparented to an init that may not reap it).
func ptGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}

// ptWatchGone polls pid every 2 ms and returns a channel that receives the time
// it was first seen gone.
func ptWatchGone(ctx context.Context, pid int) <-chan time.Time {
	c := make(chan time.Time, 1)
	go func() {
		for ctx.Err() == nil {
			if ptGone(pid) {
				c <- time.Now()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return c
}

// ptLockStore takes an exclusive flock on the store's lock file, as a hung
// process holding the store would: every slotctl operation then waits for it
// until --store-timeout. It returns the release.
func ptLockStore(t *testing.T, storePath string, timeout time.Duration) func() {
	t.Helper()
	f, err := os.OpenFile(storePath+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			t.Fatalf("flock %s: %v", f.Name(), err)
		}
		if time.Now().After(deadline) {
			f.Close()
			t.Fatalf("flock %s: still taken after %s", f.Name(), timeout)
		}
		time.Sleep(time.Millisecond)
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			f.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// ptWaitTicket waits until p's ticket is in the store (held or waiting):
// runs that must enqueue in a given order are started one after another's
// ticket is written, since a loaded machine can start processes launched
// 100 ms apart in either order.
func ptWaitTicket(t *testing.T, e *ptEnv, p *ptProc, timeout time.Duration) {
	t.Helper()
	ptWaitFor(t, "the ticket of slotctl "+p.name, timeout, func() bool {
		select {
		case <-p.done:
			t.Fatalf("slotctl %s exited before its ticket was seen; stderr:\n%s", p.name, p.stderr())
		default:
		}
		out, err := e.output("ls", "-o", "json")
		if err != nil {
			return false
		}
		var l lsJSON
		if json.Unmarshal([]byte(out), &l) != nil {
			return false
		}
		return slices.ContainsFunc(l.Tickets, func(x ticketJSON) bool { return x.Pid == p.cmd.Process.Pid })
	})
}

// ptMS formats a duration in milliseconds for the log.
func ptMS(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// TestConcurrentRunsNeverExceedLimit: 12 runs on a 3-slot limit, started 100
// ms apart, each holding ~400 ms (so that a queue builds up). Never more than
// 3 children at once, 3 is reached, simultaneous children have distinct slots
// in 0..2, and children start in arrival (ticket) order.
func TestConcurrentRunsNeverExceedLimit(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const n, slots = 12, 3
	script := `echo "start $1 $SLOTCTL_SLOT $SLOTCTL_FENCE $(date +%s%N)" > "out.$1.tmp"; ` +
		`sleep 0.4; ` +
		`echo "end $1 $(date +%s%N)" >> "out.$1.tmp"; mv "out.$1.tmp" "out.$1"`
	procs := make([]*ptProc, n)
	launched := make([]time.Time, n)
	for i := range n {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		launched[i] = time.Now()
		procs[i] = e.start(ctx, fmt.Sprintf("run%d", i), "run", "--limit", "par", "--slots", strconv.Itoa(slots), "--",
			"sh", "-c", script, "sh", strconv.Itoa(i))
	}
	for i, p := range procs {
		if code := p.wait(t, 15*time.Second); code != 0 {
			t.Errorf("run %d exited %d, want 0; stderr:\n%s", i, code, p.stderr())
		}
	}
	if t.Failed() {
		return
	}

	type run struct {
		i, slot    int
		fence      uint64
		start, end int64 // ns, wall clock
	}
	runs := make([]run, n)
	for i := range n {
		b, err := os.ReadFile(e.path(fmt.Sprintf("out.%d", i)))
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		var r run
		var tag1, tag2 string
		var i1, i2 int
		if _, err := fmt.Sscanf(string(b), "%s %d %d %d %d\n%s %d %d", &tag1, &i1, &r.slot, &r.fence, &r.start, &tag2, &i2, &r.end); err != nil || tag1 != "start" || tag2 != "end" || i1 != i || i2 != i {
			t.Fatalf("run %d: cannot parse %q: %v", i, b, err)
		}
		r.i = i
		runs[i] = r
	}

	// Sweep over start/end events: at equal times an end comes first (the
	// recorded interval lies strictly inside the held interval).
	type ev struct {
		at    int64
		delta int
	}
	var evs []ev
	for _, r := range runs {
		if r.end < r.start {
			t.Fatalf("run %d ends (%d) before it starts (%d)", r.i, r.end, r.start)
		}
		evs = append(evs, ev{r.start, +1}, ev{r.end, -1})
	}
	sort.Slice(evs, func(a, b int) bool {
		if evs[a].at != evs[b].at {
			return evs[a].at < evs[b].at
		}
		return evs[a].delta < evs[b].delta
	})
	cur, peak := 0, 0
	for _, x := range evs {
		cur += x.delta
		peak = max(peak, cur)
		if cur > slots {
			t.Errorf("%d children running at once at %d, limit has %d slots", cur, x.at, slots)
		}
	}
	if peak != slots {
		t.Errorf("at most %d children ran at once; want the limit's %d to be reached", peak, slots)
	}

	// Slots: in 0..2, distinct among simultaneous children.
	for _, a := range runs {
		if a.slot < 0 || a.slot >= slots {
			t.Errorf("run %d got SLOTCTL_SLOT=%d, want 0..%d", a.i, a.slot, slots-1)
		}
		for _, b := range runs[a.i+1:] {
			if a.start < b.end && b.start < a.end && a.slot == b.slot {
				t.Errorf("runs %d and %d ran at once on the same slot %d", a.i, b.i, a.slot)
			}
		}
	}

	// FIFO: tickets were admitted in the order they were written (their
	// fences), by the store's own log. Not launch order: a loaded machine
	// may start two processes launched 100 ms apart in either order; nor
	// children's start times: two waiters admitted by one release start
	// their children in either order.
	byFence := slices.Clone(runs)
	sort.Slice(byFence, func(a, b int) bool { return byFence[a].fence < byFence[b].fence })
	admitted := ptAdmissions(t, e)
	for i := 1; i < n; i++ {
		prev, cur := byFence[i-1], byFence[i]
		a, okA := admitted[prev.fence]
		b, okB := admitted[cur.fence]
		if prev.fence == cur.fence || !okA || !okB || b < a {
			t.Errorf("run %d (fence %d) admitted (event %d, logged %v) before run %d (fence %d, event %d, logged %v): want fence order (FIFO)",
				cur.i, cur.fence, b, okB, prev.i, prev.fence, a, okA)
		}
	}
	byStart := slices.Clone(runs)
	sort.SliceStable(byStart, func(a, b int) bool { return byStart[a].start < byStart[b].start })
	var order []int
	for _, r := range byStart {
		order = append(order, r.i)
	}

	// Handoff gaps: a queued waiter's child start after the end of the
	// child it replaced on the same slot.
	var gaps []time.Duration
	lastEnd := map[int]int64{}
	for _, r := range byStart {
		if end, ok := lastEnd[r.slot]; ok && launched[r.i].UnixNano() < end-int64(50*time.Millisecond) {
			gaps = append(gaps, time.Duration(r.start-end))
		}
		lastEnd[r.slot] = r.end
	}
	slices.Sort(gaps)
	if len(gaps) > 0 {
		t.Logf("peak %d running; %d handoffs to queued waiters: min %s, median %s, max %s (child end -> next child start, incl. sh+date)",
			peak, len(gaps), ptMS(gaps[0]), ptMS(gaps[len(gaps)/2]), ptMS(gaps[len(gaps)-1]))
	}
	t.Logf("start order %v", order)
}

// ptAdmissions reads the store's event log: the sequence number of each
// fence's first "admitted" event.
func ptAdmissions(t *testing.T, e *ptEnv) map[uint64]uint64 {
	t.Helper()
	out, err := e.output("log", "-n", "10000", "-o", "json")
	if err != nil {
		t.Fatalf("slotctl log: %v\n%s", err, out)
	}
	seen := map[uint64]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") { // one event per line
		var ev struct {
			Seq   uint64 `json:"seq"`
			Kind  string `json:"kind"`
			Fence uint64 `json:"fence"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("slotctl log -o json: %q: %v", line, err)
		}
		if s, ok := seen[ev.Fence]; ev.Kind == "admitted" && (!ok || ev.Seq < s) {
			seen[ev.Fence] = ev.Seq
		}
	}
	return seen
}

// TestSigtermDrainsBeforeRelease: SIGTERM to a holder slotctl is passed to
// its child, which takes a second to exit; the slot stays held until the
// child has exited (drain before release), then goes to the waiter, and the
// holder exits with the child's status.
func TestSigtermDrainsBeforeRelease(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	holder := e.start(ctx, "holder", "run", "--limit", "d", "--",
		"sh", "-c", `trap 'sleep 1; date +%s%N > exited.tmp; mv exited.tmp exited; exit 0' TERM; echo $$ > hpid; touch ready; while :; do sleep 0.1; done`)
	ptWaitFor(t, "holder's child ready", 5*time.Second, func() bool { return ptExists(e.path("ready")) })
	e.notePid(int(ptReadInt(t, e.path("hpid"))))

	waiter := e.start(ctx, "waiter", "run", "--limit", "d", "--",
		"sh", "-c", `date +%s%N > admitted.tmp; mv admitted.tmp admitted`)
	ptWaitFor(t, "waiter queued", 5*time.Second, func() bool { return strings.Contains(waiter.stderr(), "waiting for limit") })

	termAt := time.Now()
	if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := holder.wait(t, 10*time.Second); code != 0 {
		t.Errorf("holder slotctl exited %d, want its child's 0; stderr:\n%s", code, holder.stderr())
	}
	if code := waiter.wait(t, 10*time.Second); code != 0 {
		t.Errorf("waiter slotctl exited %d, want 0; stderr:\n%s", code, waiter.stderr())
	}
	if t.Failed() {
		return
	}
	exited := time.Unix(0, ptReadInt(t, e.path("exited")))
	admitted := time.Unix(0, ptReadInt(t, e.path("admitted")))
	if !admitted.After(exited) {
		t.Errorf("waiter's child started %s before the holder's child exited: slot released before drain", exited.Sub(admitted))
	}
	if d := admitted.Sub(termAt); d < 900*time.Millisecond {
		t.Errorf("waiter's child started %s after SIGTERM; the holder's child needed ~1s to exit", d)
	}
	if holder.exitedAt.Before(exited) {
		t.Errorf("holder slotctl exited before its child did")
	}
	t.Logf("SIGTERM -> holder's child exit %s; handoff (holder's child exit -> waiter's child start) %s; holder slotctl exit %s after its child",
		ptMS(exited.Sub(termAt)), ptMS(admitted.Sub(exited)), ptMS(holder.exitedAt.Sub(exited)))
}

// TestSigkillOfSlotctlKillsChild: a SIGKILLed slotctl does not leave its
// child running without a lease (parent-death signal).
func TestSigkillOfSlotctlKillsChild(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	p := e.start(ctx, "k", "run", "--limit", "k", "--", "sh", "-c", `echo $$ > pid; exec sleep 60`)
	pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
	e.notePid(pid)
	// The shell has exec'd sleep once /proc/<pid>/comm says so.
	ptWaitFor(t, "child exec sleep", 5*time.Second, func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return strings.TrimSpace(string(b)) == "sleep"
	})
	if ptGone(pid) {
		t.Fatalf("child %d gone before slotctl was killed", pid)
	}

	gone := ptWatchGone(ctx, pid)
	killAt := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 5*time.Second); code != -1 {
		t.Errorf("slotctl exited %d, want killed by SIGKILL", code)
	}
	select {
	case at := <-gone:
		t.Logf("child %d gone %s after SIGKILL of slotctl", pid, ptMS(at.Sub(killAt)))
	case <-time.After(2 * time.Second):
		t.Errorf("child %d still running 2s after slotctl was SIGKILLed: no parent-death signal", pid)
	}
}

// TestStoreStopsAnsweringKillsChild: when the store stops answering (its
// lock held by someone else), the holder stops its child before the lease
// can expire in the store, and exits 76.
func TestStoreStopsAnsweringKillsChild(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	const ttl = 2 * time.Second
	p := e.start(ctx, "s", "run", "--limit", "s", "--ttl", ttl.String(), "--store-timeout", "200ms", "--",
		"sh", "-c", `echo $$ > pid; touch started; exec sleep 30`)
	ptWaitFor(t, "child started", 5*time.Second, func() bool { return ptExists(e.path("started")) })
	pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
	e.notePid(pid)
	gone := ptWatchGone(ctx, pid)
	// Let at least one renewal (every ~667 ms ±20%) go through first, so the
	// outage starts at an arbitrary point of the renewal cycle.
	time.Sleep(900 * time.Millisecond)
	if ptGone(pid) {
		t.Fatalf("child gone before the store stopped answering; stderr:\n%s", p.stderr())
	}

	unlock := ptLockStore(t, e.path("slots.db"), 5*time.Second)
	lockAt := time.Now()
	code := p.wait(t, 10*time.Second)
	exitAfter := p.exitedAt.Sub(lockAt)
	unlock()

	if code != exitLost {
		t.Errorf("slotctl exited %d, want %d (lease lost, child stopped); stderr:\n%s", code, exitLost, p.stderr())
	}
	var goneAfter time.Duration
	select {
	case at := <-gone:
		goneAfter = at.Sub(lockAt)
	case <-time.After(time.Second):
		t.Fatalf("child %d still running after slotctl exited", pid)
	}
	// The last renewal the store acknowledged was sent before the lock was
	// taken, so the store's deadline is before lockAt + TTL: the child must
	// be gone by then.
	if goneAfter >= ttl {
		t.Errorf("child stopped %s after the store stopped answering: a %s lease renewed before that may already have expired", goneAfter, ttl)
	}
	if exitAfter >= ttl+500*time.Millisecond {
		t.Errorf("slotctl exited %s after the store stopped answering, want < %s", exitAfter, ttl+500*time.Millisecond)
	}
	// An outage shorter than TTL − renew period − margin (2s − 0.8s − 0.2s)
	// must not cost the slot.
	if goneAfter < 900*time.Millisecond {
		t.Errorf("child stopped only %s into the outage; a live holder keeps its lease for at least TTL - renew period - margin (~1s)", goneAfter)
	}
	se := strings.ToLower(p.stderr())
	if !strings.Contains(se, "lease") || !strings.Contains(se, "lost") {
		t.Errorf("stderr does not say the lease was lost:\n%s", p.stderr())
	}
	t.Logf("store stopped answering -> child stopped %s, slotctl exited %s (ttl %s)", ptMS(goneAfter), ptMS(exitAfter), ttl)
}

// TestStoreStopsAnsweringContinue: with --on-lost continue, the child runs on
// after the loss, slotctl warns loudly and exits with the child's status.
func TestStoreStopsAnsweringContinue(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	const ttl = 2 * time.Second
	p := e.start(ctx, "c", "run", "--limit", "s", "--ttl", ttl.String(), "--store-timeout", "200ms", "--on-lost", "continue", "--",
		"sh", "-c", `echo $$ > pid; touch started; sleep 3; touch finished`)
	ptWaitFor(t, "child started", 5*time.Second, func() bool { return ptExists(e.path("started")) })
	pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
	e.notePid(pid)

	unlock := ptLockStore(t, e.path("slots.db"), 5*time.Second)
	lockAt := time.Now()
	ptWaitFor(t, "LEASE LOST warning", 5*time.Second, func() bool { return strings.Contains(p.stderr(), "LEASE LOST") })
	warnAfter := time.Since(lockAt)
	if ptGone(pid) || ptExists(e.path("finished")) {
		t.Errorf("child was gone when slotctl warned of the loss, with --on-lost continue")
	}
	code := p.wait(t, 10*time.Second)
	unlock()
	if code != 0 {
		t.Errorf("slotctl exited %d, want the child's 0; stderr:\n%s", code, p.stderr())
	}
	if !ptExists(e.path("finished")) {
		t.Errorf("child did not finish on its own; stderr:\n%s", p.stderr())
	}
	if warnAfter >= ttl {
		t.Errorf("loss announced %s after the store stopped answering, want < %s", warnAfter, ttl)
	}
	t.Logf("store stopped answering -> LEASE LOST warning %s; slotctl exited %s after the lock (child ran 3s)", ptMS(warnAfter), ptMS(p.exitedAt.Sub(lockAt)))
}

// TestWaitingTicketIsRenewed: a waiter queued for longer than its TTL is
// still admitted: its waiting ticket is renewed like a held one.
func TestWaitingTicketIsRenewed(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	holder := e.start(ctx, "holder", "run", "--limit", "w", "--ttl", "2s", "--",
		"sh", "-c", `touch held; sleep 4; date +%s%N > hend.tmp; mv hend.tmp hend`)
	ptWaitFor(t, "holder's child started", 5*time.Second, func() bool { return ptExists(e.path("held")) })
	waiter := e.start(ctx, "waiter", "run", "--limit", "w", "--ttl", "2s", "--",
		"sh", "-c", `date +%s%N > admitted.tmp; mv admitted.tmp admitted`)
	ptWaitFor(t, "waiter queued", 5*time.Second, func() bool { return strings.Contains(waiter.stderr(), "waiting for limit") })
	queuedAt := time.Now()

	if code := holder.wait(t, 10*time.Second); code != 0 {
		t.Errorf("holder exited %d, want 0; stderr:\n%s", code, holder.stderr())
	}
	if code := waiter.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("waiter exited %d, want 0 (admitted after a wait longer than its ttl); stderr:\n%s", code, waiter.stderr())
	}
	hend := time.Unix(0, ptReadInt(t, e.path("hend")))
	admitted := time.Unix(0, ptReadInt(t, e.path("admitted")))
	if !admitted.After(hend) {
		t.Errorf("waiter's child started %s before the holder's child ended", hend.Sub(admitted))
	}
	if waited := admitted.Sub(queuedAt); waited < 2*time.Second {
		t.Errorf("waiter waited only %s, not longer than its 2s ttl: the test proves nothing", waited)
	}
	t.Logf("waiter queued %s (ttl 2s) and was admitted %s after the holder's child ended",
		ptMS(admitted.Sub(queuedAt)), ptMS(admitted.Sub(hend)))
}
