package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The job is the command and everything it starts, wherever it goes: these
// tests run jobs whose processes leave its process group and session, and
// check that nothing of a job runs once its slot can be another's.

// escapesJob starts a process in each way a job's processes get away from
// it — setsid, a double fork, env -i (which also drops the test guard's
// mark: the test kills those by pid), nohup, and one that ignores SIGTERM
// — each writing its pid to "pids"; then it writes "ready" and waits.
const escapesJob = `
setsid sh -c 'echo $$ >> pids; exec sleep 1000' &
(sh -c 'echo $$ >> pids; exec sleep 1000' &)
env -i PATH="$PATH" sh -c 'echo $$ >> pids; exec sleep 1000' &
nohup sh -c 'echo $$ >> pids; exec sleep 1000' >/dev/null 2>&1 &
sh -c 'trap "" TERM HUP INT; echo $$ >> pids; while :; do sleep 0.05; done' &
while [ "$(wc -l < pids 2>/dev/null || echo 0)" -lt 5 ]; do sleep 0.01; done
echo ready > ready; wait; sleep 1000`

// overlapCheck is the next job: it notes every process of the previous
// job's "pids" still running (not a zombie) as it starts.
const overlapCheck = `
for p in $(cat pids); do
	if [ -e /proc/$p/stat ] && ! grep -q ') Z' /proc/$p/stat; then echo "$p $(cat /proc/$p/cmdline | tr '\0' ' ')" >> overlap; fi
done
echo ran > next-ran`

// readPids reads the job's pids once it is ready, and has the test kill
// each at its end.
func readPids(t *testing.T, e *ptEnv) []int {
	t.Helper()
	ptWaitFor(t, "the job's processes", 20*time.Second, func() bool { return ptExists(e.path("ready")) })
	b, err := os.ReadFile(e.path("pids"))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pids: %q", b)
		}
		e.notePid(pid)
		pids = append(pids, pid)
	}
	if len(pids) != 5 {
		t.Fatalf("pids: %q, want 5", b)
	}
	return pids
}

func runningOf(pids []int) []int {
	var out []int
	for _, pid := range pids {
		if !ptGone(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// checkNoOverlap waits for the next job to have run and checks it saw
// nothing of the previous one.
func checkNoOverlap(t *testing.T, e *ptEnv, next *ptProc, pids []int) {
	t.Helper()
	if code := next.wait(t, 40*time.Second); code != 0 {
		t.Fatalf("the next run exited %d; stderr:\n%s", code, next.stderr())
	}
	if !ptExists(e.path("next-ran")) {
		t.Fatal("the next job did not run")
	}
	if b, err := os.ReadFile(e.path("overlap")); err == nil {
		t.Errorf("the next job started while processes of the killed holder's job ran:\n%s", b)
	}
	if left := runningOf(pids); len(left) > 0 {
		t.Errorf("processes of the killed holder's job still run: %v", left)
	}
}

// TestSigkilledSupervisorTakesItsWholeJob: slotctl is SIGKILLed while its
// job has processes in other sessions, one of them without slotctl's
// variables. None of them runs by the time the next job starts — on the
// same host (bbolt: the judge proves the holder dead) and from another
// host (etcd: the lease runs out).
func TestSigkilledSupervisorTakesItsWholeJob(t *testing.T) {
	for _, storeKind := range []string{"bolt", "etcd"} {
		t.Run(storeKind, func(t *testing.T) {
			e := newPTEnv(t)
			var nextEnv []string
			if storeKind == "etcd" {
				e, _ = etcdPTEnvWith(t, func(*testing.T) *ptEnv { return e })
				nextEnv = []string{"SLOTCTLTEST_HOST=elsewhere.invalid", "SLOTCTLTEST_BOOT=other-boot"}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			holder := e.start(ctx, "holder", "run", "--limit", "c", "--ttl", "3s", "--", "sh", "-c", escapesJob)
			pids := readPids(t, e)
			next := e.startWith(ctx, "next", nextEnv, "run", "--limit", "c", "--ttl", "3s", "--", "sh", "-c", overlapCheck)
			ptWaitTicket(t, e, next, 20*time.Second)

			if err := holder.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			holder.wait(t, 10*time.Second)
			checkNoOverlap(t, e, next, pids)
		})
	}
}

// startWith is start with extra environment variables.
func (e *ptEnv) startWith(ctx context.Context, name string, env []string, args ...string) *ptProc {
	e.t.Helper()
	saved := e.env
	e.env = append(append([]string(nil), e.env...), env...)
	defer func() { e.env = saved }()
	return e.start(ctx, name, args...)
}

// TestDrainStopsAtALostLease: the command exits, leaving a process that
// ignores SIGTERM, and --kill-after is long. While slotctl waits for it,
// the store stops answering: the lease is lost, and the leftover is killed
// before the store could hand the slot to another run — not at
// --kill-after.
func TestDrainStopsAtALostLease(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const ttl = 3 * time.Second
	p := e.start(ctx, "holder", "run", "--limit", "d", "--ttl", ttl.String(), "--kill-after", "60s", "--store-timeout", "500ms", "--",
		"sh", "-c", `setsid sh -c 'trap "" TERM; echo $$ > left; while :; do sleep 0.05; done' & sleep 0.2; exit 0`)
	left := int(ptWaitInt(t, e.path("left"), 20*time.Second))
	e.notePid(left)
	time.Sleep(500 * time.Millisecond) // the command has exited: slotctl drains

	// Whatever the holder renewed last, its lease expires in the store
	// within ttl of now, and nothing renews it while the lock is held.
	unlock := ptLockStore(t, e.path("slots.db"), 10*time.Second)
	lockedAt := time.Now()
	time.Sleep(ttl)
	alive := !ptGone(left)
	unlock()
	if alive {
		t.Errorf("the leftover process %d still runs %s after the store stopped answering: its lease may have expired, the slot be another's", left, time.Since(lockedAt).Round(time.Millisecond))
	}
	if code := p.wait(t, 70*time.Second); code != exitLost {
		t.Errorf("slotctl exited %d, want %d (lease lost); stderr:\n%s", code, exitLost, p.stderr())
	}
}

// TestForegroundDrainsTheWholeJob: on a terminal, in the foreground, the
// job shares slotctl's process group; a process it left running in the
// background is still the job's, and stopped before the release.
func TestForegroundDrainsTheWholeJob(t *testing.T) {
	e := newPTEnv(t)
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("no script(1) to give slotctl a terminal")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// script(1) runs the command on a new terminal, in its foreground
	// process group.
	cmdline := shellQuote(e.bin) + ` run --limit f -- sh -c 'sh -c "echo \$\$ > left; exec sleep 1000" & while [ ! -s left ]; do sleep 0.01; done; exit 0'; echo $? > code; ` +
		// Still on the terminal (its hangup would end the leftover): is
		// anything of the job left now that slotctl has released?
		`if [ -e /proc/$(cat left)/stat ] && ! grep -q ') Z' /proc/$(cat left)/stat; then echo yes > left-alive; fi`
	p := e.startProgram(ctx, "script", "script", "-qec", cmdline, filepath.Join(e.dir, "typescript"))
	if code := p.wait(t, 40*time.Second); code != 0 {
		t.Fatalf("script exited %d; stderr:\n%s", code, p.stderr())
	}
	left := int(ptReadInt(t, e.path("left")))
	e.notePid(left)
	if ptExists(e.path("left-alive")) {
		t.Errorf("slotctl released and exited while a process of its job (%d) ran", left)
	}
	if code := strings.TrimSpace(readFile(t, e.path("code"))); code != "143" && code != "0" {
		t.Errorf("slotctl exited %s", code)
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestDeadHolderSlotAtOnce: a waiter watches the holder ahead of it; when
// that holder is SIGKILLed, the slot is the waiter's without a reap and
// without waiting for a renewal (an hour's TTL renews every 20 minutes).
func TestDeadHolderSlotAtOnce(t *testing.T) {
	for _, storeKind := range []string{"bolt", "etcd"} {
		t.Run(storeKind, func(t *testing.T) {
			e := newPTEnv(t)
			if storeKind == "etcd" {
				e, _ = etcdPTEnvWith(t, func(*testing.T) *ptEnv { return e })
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			holder := e.start(ctx, "holder", "run", "--limit", "t", "--ttl", "1h", "--", "sh", "-c", `echo $$ > pid; exec sleep 1000`)
			e.notePid(int(ptWaitInt(t, e.path("pid"), 20*time.Second)))
			next := e.start(ctx, "next", "run", "--limit", "t", "--ttl", "1h", "--", "touch", "next-ran")
			ptWaitTicket(t, e, next, 20*time.Second)
			// The waiter reads the holders once it waits; give it a moment.
			time.Sleep(300 * time.Millisecond)

			killAt := time.Now()
			if err := holder.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			holder.wait(t, 10*time.Second)
			// Bounded for a loaded machine, far below any renewal or
			// expiry; the benchmark measures how soon.
			if code := next.wait(t, 30*time.Second); code != 0 {
				t.Fatalf("the waiter exited %d; stderr:\n%s", code, next.stderr())
			}
			t.Logf("holder SIGKILLed -> waiter done %s", ptMS(next.exitedAt.Sub(killAt)))
		})
	}
}

// TestOrphanKeepsItsSlot: slotctl and its guard both die (stopped, then
// the guard killed, then slotctl), so the job's grandchild runs on,
// orphaned. Past its TTL the ticket stays, and the waiter behind it waits:
// a run may not kill the orphan, and must not admit a job beside it. A
// reap, with the owner's marker, kills it and frees the slot.
func TestOrphanKeepsItsSlot(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	holder := e.start(ctx, "holder", "run", "--limit", "o", "--ttl", ttl.String(), "--", "sh", "-c",
		`echo $SLOTCTL_TICKET > ticket; echo $$ > pid; sleep 1000 & echo $! > orphan; wait`)
	pid := int(ptWaitInt(t, e.path("pid"), 20*time.Second))
	orphan := int(ptWaitInt(t, e.path("orphan"), 20*time.Second))
	e.notePid(pid)
	e.notePid(orphan)
	id := crashLine(t, e.path("ticket"), 5*time.Second)
	crashWaitChildRecorded(ctx, t, e, id, pid)
	next := e.start(ctx, "next", "run", "--limit", "o", "--ttl", ttl.String(), "--", "touch", "next-ran")
	ptWaitTicket(t, e, next, 20*time.Second)

	sup := holder.cmd.Process.Pid
	g := crashChildNamed(t, sup, "slotctl-guard", 5*time.Second)
	crashSignal(t, sup, syscall.SIGSTOP)
	crashSignal(t, g, syscall.SIGKILL)
	crashSignal(t, sup, syscall.SIGKILL)
	holder.wait(t, 10*time.Second)

	// Three TTLs: the ticket has long expired, the waiter renewed and swept.
	time.Sleep(3 * ttl)
	if ptGone(orphan) {
		t.Fatalf("the orphan %d died on its own: the test proves nothing; the holder's stderr:\n%s", orphan, holder.stderr())
	}
	if ptExists(e.path("next-ran")) {
		t.Fatalf("the waiter's job ran beside the orphaned job %d of the expired ticket", orphan)
	}
	if code, out, errOut := crashRun(ctx, t, e, 20*time.Second, "reap"); code != 0 || !strings.Contains(out, "killed") {
		t.Fatalf("reap exited %d: %s%s; want the orphan killed and the ticket reaped", code, out, errOut)
	}
	if code := next.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("the waiter exited %d; stderr:\n%s", code, next.stderr())
	}
	if !ptGone(orphan) {
		t.Errorf("the orphan %d still runs after the reap", orphan)
	}
}

// TestGuardKilledAlone: the guard alone is SIGKILLed. The command dies
// with it (parent-death signal); what it started comes to slotctl, which
// kills it by the ticket it carries, says so, and releases.
func TestGuardKilledAlone(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder := e.start(ctx, "holder", "run", "--limit", "g", "--", "sh", "-c", `sleep 1000 & echo $! > orphan; wait`)
	orphan := int(ptWaitInt(t, e.path("orphan"), 20*time.Second))
	e.notePid(orphan)
	crashSignal(t, crashChildNamed(t, holder.cmd.Process.Pid, "slotctl-guard", 5*time.Second), syscall.SIGKILL)
	code := holder.wait(t, 30*time.Second)
	if !ptGone(orphan) {
		t.Errorf("the job's process %d still runs after slotctl released", orphan)
	}
	if code != 128+int(syscall.SIGKILL) || !strings.Contains(holder.stderr(), "the guard of sh ended before the job did") {
		t.Errorf("slotctl exited %d, want %d (its command killed with the guard), with a warning; stderr:\n%s", code, 128+int(syscall.SIGKILL), holder.stderr())
	}
	if code, out, _ := crashRun(ctx, t, e, 10*time.Second, "run", "--limit", "g", "--no-wait", "--", "true"); code != 0 {
		t.Errorf("the slot is not free after slotctl exited: %d %s", code, out)
	}
}

// TestGuardStartedEarly: a run's guard starts beside its enqueue, before
// the run knows it will be admitted. It carries the job's marks in its own
// environment from the start, as the judge needs of every process of a job.
// A run that waits keeps it while it is next in line and ends it further
// back (an idle process per waiter would cost a long queue); either way its
// job runs under a guard once admitted, also when the kept one was killed
// while it waited.
func TestGuardStartedEarly(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := syscall.Mkfifo(e.path("go.fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	holder := e.start(ctx, "holder", "run", "--limit", "early", "--", "sh", "-c", `echo $SLOTCTL_TICKET > held.tmp; mv held.tmp held; read _ < go.fifo`)
	ptWaitFor(t, "the holder's job", 20*time.Second, func() bool { return ptExists(e.path("held")) })
	held, err := os.ReadFile(e.path("held"))
	if err != nil {
		t.Fatal(err)
	}
	ticket := strings.TrimSpace(string(held))
	guard := crashChildNamed(t, holder.cmd.Process.Pid, "slotctl-guard", 5*time.Second)
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(guard), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.Split(string(env), "\x00")
	if !slices.Contains(vars, "SLOTCTL_TICKET="+ticket) || !slices.ContainsFunc(vars, func(v string) bool { return strings.HasPrefix(v, "SLOTCTL_SUPERVISOR=") }) {
		t.Errorf("the guard's environment lacks the job's marks (SLOTCTL_TICKET=%s, SLOTCTL_SUPERVISOR): %q", ticket, vars)
	}

	guards := func(p *ptProc) int {
		n := 0
		for _, c := range crashChildren(p.cmd.Process.Pid) {
			if c.comm == "slotctl-guard" {
				n++
			}
		}
		return n
	}
	var waiters []*ptProc
	for i := range 2 {
		w := e.start(ctx, fmt.Sprintf("waiter%d", i), "run", "--limit", "early", "--", "sh", "-c", fmt.Sprintf("echo ran > waiter%d-ran", i))
		ptWaitFor(t, fmt.Sprintf("waiter %d queued", i), 20*time.Second, func() bool { return strings.Contains(w.stderr(), "waiting for limit") })
		waiters = append(waiters, w)
	}
	ptWaitFor(t, "the second waiter's early guard ended", 10*time.Second, func() bool { return guards(waiters[1]) == 0 })
	if n := guards(waiters[0]); n != 1 {
		t.Fatalf("the waiter next in line has %d guards, want its early one", n)
	}
	// Its guard killed while it waits: once admitted, its job still runs
	// (under a new guard).
	crashSignal(t, crashChildNamed(t, waiters[0].cmd.Process.Pid, "slotctl-guard", 5*time.Second), syscall.SIGKILL)
	if err := os.WriteFile(e.path("go.fifo"), []byte("go\n"), 0); err != nil {
		t.Fatal(err)
	}
	if code := holder.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("holder exited %d: %s", code, holder.stderr())
	}
	for i, w := range waiters {
		ran := e.path(fmt.Sprintf("waiter%d-ran", i))
		if code := w.wait(t, 20*time.Second); code != 0 || !ptExists(ran) {
			t.Fatalf("waiter %d exited %d (ran: %v): %s", i, code, ptExists(ran), w.stderr())
		}
	}
}

// TestEarlyGuardEndsWithItsRun: the run next in line keeps the guard it
// started as it queued; SIGKILLed while it waits, it leaves no guard behind
// (the guard's end of the socket closes, and a guard with no command
// exits).
func TestEarlyGuardEndsWithItsRun(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder := e.start(ctx, "holder", "run", "--limit", "kept", "--", "sh", "-c", `touch held; sleep 1000`)
	ptWaitFor(t, "the holder's job", 20*time.Second, func() bool { return ptExists(e.path("held")) })
	waiter := e.start(ctx, "waiter", "run", "--limit", "kept", "--", "true")
	ptWaitFor(t, "the waiter queued", 20*time.Second, func() bool { return strings.Contains(waiter.stderr(), "waiting for limit") })
	g := crashChildNamed(t, waiter.cmd.Process.Pid, "slotctl-guard", 5*time.Second)
	e.notePid(g)
	crashSignal(t, waiter.cmd.Process.Pid, syscall.SIGKILL)
	waiter.wait(t, 10*time.Second)
	ptWaitFor(t, "the killed waiter's guard gone", 20*time.Second, func() bool { return ptGone(g) })
	crashSignal(t, holder.cmd.Process.Pid, syscall.SIGTERM)
	holder.wait(t, 20*time.Second)
}
