package cli

// Crash tests: real slotctl processes (this test binary, on PATH as
// "slotctl"), SIGKILLed, SIGSTOPped and run in a storm, with a real bbolt
// store. They reuse the process-test helpers (pt*, process_test.go); their
// own helpers are named crash*. Every test is bounded by a context timeout,
// and the ptEnv cleanup SIGKILLs every slotctl and child group left.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// crashSeq names the output files of crashRun's commands.
var crashSeq atomic.Int64

// crashRun runs slotctl with args to completion (bounded by timeout) and
// returns its exit status, stdout and stderr.
func crashRun(ctx context.Context, t *testing.T, e *ptEnv, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	name := fmt.Sprintf("cmd%03d-%s", crashSeq.Add(1), args[0])
	p := e.start(ctx, name, args...)
	code := p.wait(t, timeout)
	out, err := os.ReadFile(e.path(name + ".stdout"))
	if err != nil {
		t.Fatal(err)
	}
	return code, string(out), p.stderr()
}

// crashLine waits for a file holding one line (written whole) and returns it.
func crashLine(t *testing.T, path string, timeout time.Duration) string {
	t.Helper()
	var s string
	ptWaitFor(t, path, timeout, func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		s = strings.TrimSpace(string(b))
		return s != ""
	})
	return s
}

// crashPS is what the tests read of /proc/PID/stat.
type crashPS struct {
	pid, ppid, pgrp int
	state           byte
	comm            string
}

func crashReadPS(pid int) (crashPS, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return crashPS{}, false
	}
	s := string(b)
	i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if i < 0 || j < i {
		return crashPS{}, false
	}
	f := strings.Fields(s[j+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return crashPS{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return crashPS{pid: pid, ppid: ppid, pgrp: pgrp, state: f[0][0], comm: s[i+1 : j]}, true
}

// crashChildren lists the live (not zombie) children of ppid.
func crashChildren(ppid int) []crashPS {
	ents, _ := os.ReadDir("/proc")
	var out []crashPS
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if ps, ok := crashReadPS(pid); ok && ps.ppid == ppid && ps.state != 'Z' && ps.state != 'X' {
			out = append(out, ps)
		}
	}
	return out
}

// crashChildNamed waits for a live child of ppid running comm.
func crashChildNamed(t *testing.T, ppid int, comm string, timeout time.Duration) int {
	t.Helper()
	var pid int
	ptWaitFor(t, fmt.Sprintf("a %s child of %d", comm, ppid), timeout, func() bool {
		for _, c := range crashChildren(ppid) {
			if c.comm == comm {
				pid = c.pid
				return true
			}
		}
		return false
	})
	return pid
}

// crashStore opens the test's store in this process, as a second reader.
func crashStore(t *testing.T, e *ptEnv) *boltstore.Store {
	t.Helper()
	st, err := boltstore.New(e.path("slots.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// crashWaitChildRecorded waits until ticket id records the child's process
// group: before that, only the TTL can free the ticket of a killed holder.
func crashWaitChildRecorded(ctx context.Context, t *testing.T, e *ptEnv, id string, pgid int) store.Ticket {
	t.Helper()
	st := crashStore(t, e)
	var tk store.Ticket
	ptWaitFor(t, "ticket "+short(id)+" to record the child's process group", 5*time.Second, func() bool {
		var err error
		tk, err = st.Get(ctx, id)
		return err == nil && tk.Holder.Pgid == pgid
	})
	return tk
}

// crashRenewed is the store's wall time of ticket id's last renewal (its
// creation if none yet): its lease cannot expire before that + TTL.
func crashRenewed(ctx context.Context, t *testing.T, e *ptEnv, id string) time.Time {
	t.Helper()
	tk, err := crashStore(t, e).Get(ctx, id)
	if err != nil {
		t.Fatalf("get ticket %s: %v", id, err)
	}
	if tk.Renewed.IsZero() {
		return tk.Created
	}
	return tk.Renewed
}

// crashEvents reads the whole event log through slotctl log -o json.
func crashEvents(ctx context.Context, t *testing.T, e *ptEnv) []eventJSON {
	t.Helper()
	code, out, errOut := crashRun(ctx, t, e, 10*time.Second, "log", "-n", strconv.Itoa(store.MaxEvents), "-o", "json")
	if code != 0 {
		t.Fatalf("slotctl log exited %d: %s", code, errOut)
	}
	var evs []eventJSON
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev eventJSON
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("slotctl log -o json: line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// crashEvent finds the event of kind for ticket id.
func crashEvent(evs []eventJSON, kind, id string) (eventJSON, bool) {
	for _, ev := range evs {
		if ev.Kind == kind && ev.Ticket == id {
			return ev, true
		}
	}
	return eventJSON{}, false
}

// crashLimit reads one limit through slotctl limit ls -o json.
func crashLimit(ctx context.Context, t *testing.T, e *ptEnv, name string) limitEntry {
	t.Helper()
	code, out, errOut := crashRun(ctx, t, e, 10*time.Second, "limit", "ls", "-o", "json", name)
	if code != 0 {
		t.Fatalf("slotctl limit ls exited %d: %s", code, errOut)
	}
	var l limitsJSON
	if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Limits) != 1 {
		t.Fatalf("slotctl limit ls -o json %s: %q: %v", name, out, err)
	}
	return l.Limits[0]
}

func crashSignal(t *testing.T, pid int, s syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(pid, s); err != nil {
		t.Fatalf("kill -%d %d: %v", s, pid, err)
	}
}

// TestSigkillSupervisorReapFreesAtOnce: a SIGKILLed supervisor's child dies
// with it (parent-death signal); slotctl reap proves the holder dead at once
// (a 1h lease is nowhere near expiry), says why, stops what the child left
// running in its process group, and frees the slot.
func TestSigkillSupervisorReapFreesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		orphan bool // the child forks sleep, a grandchild the parent-death signal does not reach
	}{
		{"grandchild-left-running", `echo $SLOTCTL_TICKET > ticket; echo $$ > pid; sleep 60; true`, true},
		{"child-alone", `echo $SLOTCTL_TICKET > ticket; echo $$ > pid; exec sleep 60`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newPTEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			holder := e.start(ctx, "holder", "run", "--limit", "k", "--ttl", "1h", "--", "sh", "-c", tc.script)
			pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
			e.notePid(pid)
			id := crashLine(t, e.path("ticket"), 5*time.Second)
			gpid := 0
			if tc.orphan {
				gpid = crashChildNamed(t, pid, "sleep", 5*time.Second)
			} else {
				ptWaitFor(t, "child exec sleep", 5*time.Second, func() bool {
					ps, ok := crashReadPS(pid)
					return ok && ps.comm == "sleep"
				})
			}
			crashWaitChildRecorded(ctx, t, e, id, pid)

			sup := holder.cmd.Process.Pid
			gone := ptWatchGone(ctx, pid)
			if tc.orphan {
				// A job outlives its supervisor only when its guard dies
				// too (an OOM kill of both, say): slotctl stopped, so that
				// it cannot see its guard die, then the guard killed (the
				// command with it: its parent-death signal), then slotctl.
				g := crashChildNamed(t, sup, "slotctl-guard", 5*time.Second)
				crashSignal(t, sup, syscall.SIGSTOP)
				crashSignal(t, g, syscall.SIGKILL)
			}
			killAt := time.Now()
			crashSignal(t, sup, syscall.SIGKILL)
			if code := holder.wait(t, 5*time.Second); code != -1 {
				t.Fatalf("slotctl exited %d, want killed by SIGKILL", code)
			}
			var childGone time.Duration
			select {
			case at := <-gone:
				childGone = at.Sub(killAt)
			case <-time.After(2 * time.Second):
				t.Fatalf("child %d still running 2s after its supervisor was SIGKILLed", pid)
			}
			if tc.orphan && ptGone(gpid) {
				t.Fatalf("grandchild %d died with the child: the test proves nothing", gpid)
			}

			reapAt := time.Now()
			code, out, errOut := crashRun(ctx, t, e, 10*time.Second, "reap")
			reapTook := time.Since(reapAt)
			if code != 0 {
				t.Fatalf("slotctl reap exited %d; stderr:\n%s", code, errOut)
			}
			want := fmt.Sprintf("supervisor %d gone, process group %d empty", sup, pid)
			if tc.orphan {
				want = fmt.Sprintf("supervisor %d gone, orphaned process group %d killed", sup, pid)
			}
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "reaped "+short(id)+" (limit k, held slot 0, ") ||
				!strings.HasSuffix(lines[0], "): "+want) {
				t.Fatalf("slotctl reap printed\n%s\nwant one line: reaped %s (limit k, held slot 0, ...): %s", out, short(id), want)
			}
			if tc.orphan && !ptGone(gpid) {
				t.Errorf("grandchild %d (orphaned sleep) still runs after reap", gpid)
			}

			// The slot is free at once.
			if code, _, errOut := crashRun(ctx, t, e, 10*time.Second, "run", "--limit", "k", "--no-wait", "--", "true"); code != 0 {
				t.Errorf("run --no-wait after the reap exited %d, want 0 (admitted at once); stderr:\n%s", code, errOut)
			}
			if code, out, _ := crashRun(ctx, t, e, 10*time.Second, "reap"); code != 0 || out != "" {
				t.Errorf("a second reap exited %d with %q, want 0 and nothing", code, out)
			}
			evs := crashEvents(ctx, t, e)
			if ev, ok := crashEvent(evs, "reaped", id); !ok {
				t.Errorf("log has no reaped event for ticket %s: %+v", id, evs)
			} else if ev.Evidence != want || ev.Pid != sup || ev.Limit != "k" {
				t.Errorf("log's reaped event: %+v; want limit k, pid %d, evidence %q", ev, sup, want)
			}
			t.Logf("SIGKILL -> child gone %s; reap took %s; SIGKILL -> slot free %s; evidence %q",
				ptMS(childGone), ptMS(reapTook), ptMS(reapAt.Add(reapTook).Sub(killAt)), want)
		})
	}
}

// TestSigkillMultiLimitHolderFreesEveryLimit: a SIGKILLed holder of two
// limits at weight 2 is proven dead on this host, and one removal gives its
// slots back at once in every limit it held (docs/leases.md §2.1 item 9,
// §4.3): by slotctl reap, which names both limits, or by the next run on
// just one of them, whose admission sweeps that limit — the other one is
// free then too, without waiting for the 1h lease.
func TestSigkillMultiLimitHolderFreesEveryLimit(t *testing.T) {
	for _, how := range []string{"reap", "next-run"} {
		t.Run(how, func(t *testing.T) {
			e := newPTEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			holder := e.start(ctx, "holder", "run", "--limit", "ka", "--limit", "kb", "--slots", "2", "--weight", "2", "--ttl", "1h", "--",
				"sh", "-c", `echo "$SLOTCTL_SLOTS" > slots; echo $SLOTCTL_TICKET > ticket; echo $$ > pid; exec sleep 60`)
			pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
			e.notePid(pid)
			id := crashLine(t, e.path("ticket"), 5*time.Second)
			if got := crashLine(t, e.path("slots"), 5*time.Second); got != "ka=0,1 kb=0,1" {
				t.Fatalf("SLOTCTL_SLOTS = %q, want %q", got, "ka=0,1 kb=0,1")
			}
			ptWaitFor(t, "child exec sleep", 5*time.Second, func() bool {
				ps, ok := crashReadPS(pid)
				return ok && ps.comm == "sleep"
			})
			crashWaitChildRecorded(ctx, t, e, id, pid)
			for _, l := range []string{"ka", "kb"} {
				if got := crashLimit(ctx, t, e, l); got.Held != 2 {
					t.Fatalf("limit %s: held %d before the kill, want 2 (weight 2)", l, got.Held)
				}
			}
			// Full in both: a run on either is busy while the holder lives.
			if code, _, _ := crashRun(ctx, t, e, 10*time.Second, "run", "--limit", "kb", "--no-wait", "--", "true"); code != exitBusy {
				t.Fatalf("run --limit kb --no-wait beside the live holder exited %d, want %d", code, exitBusy)
			}

			sup := holder.cmd.Process.Pid
			killAt := time.Now()
			crashSignal(t, sup, syscall.SIGKILL)
			if code := holder.wait(t, 5*time.Second); code != -1 {
				t.Fatalf("slotctl exited %d, want killed by SIGKILL", code)
			}
			ptWaitFor(t, "the child to die with its supervisor", 2*time.Second, func() bool { return ptGone(pid) })

			if how == "reap" {
				code, out, errOut := crashRun(ctx, t, e, 10*time.Second, "reap")
				if code != 0 {
					t.Fatalf("slotctl reap exited %d; stderr:\n%s", code, errOut)
				}
				lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
				if len(lines) != 1 || !strings.HasPrefix(lines[0], "reaped "+short(id)+" (limits ka,kb, held slots ka=0,1 kb=0,1, ") ||
					!strings.Contains(lines[0], fmt.Sprintf("supervisor %d gone", sup)) {
					t.Fatalf("slotctl reap printed\n%s\nwant one line: reaped %s (limits ka,kb, held slots ka=0,1 kb=0,1, ...): supervisor %d gone...", out, short(id), sup)
				}
			} else {
				// No reap: a run on kb alone, at weight 2, is admitted at once.
				if code, _, errOut := crashRun(ctx, t, e, 10*time.Second, "run", "--limit", "kb", "--weight", "2", "--no-wait", "--", "true"); code != 0 {
					t.Fatalf("run --limit kb --weight 2 --no-wait after the kill exited %d, want 0; stderr:\n%s", code, errOut)
				}
			}
			// Every limit is free at once, whole: weight 2 fits in each.
			for _, l := range []string{"ka", "kb"} {
				if got := crashLimit(ctx, t, e, l); got.Held != 0 || got.Waiting != 0 {
					t.Errorf("limit %s: held %d, waiting %d after the dead holder went, want 0 and 0", l, got.Held, got.Waiting)
				}
			}
			if code, _, errOut := crashRun(ctx, t, e, 10*time.Second, "run", "--limit", "ka", "--weight", "2", "--no-wait", "--", "true"); code != 0 {
				t.Errorf("run --limit ka --weight 2 --no-wait exited %d, want 0 (admitted at once); stderr:\n%s", code, errOut)
			}
			evs := crashEvents(ctx, t, e)
			reaped := map[string]eventJSON{}
			for _, ev := range evs {
				if ev.Kind == "reaped" && ev.Ticket == id {
					reaped[ev.Limit] = ev
				}
			}
			for _, l := range []string{"ka", "kb"} {
				ev, ok := reaped[l]
				if !ok {
					t.Errorf("log has no reaped event of ticket %s in limit %s: %+v", short(id), l, evs)
					continue
				}
				if !slices.Equal(ev.Limits, []string{"ka", "kb"}) || ev.Weight != 2 || !slices.Equal(ev.Indexes, []int{0, 1}) {
					t.Errorf("reaped event in %s: limits %v, weight %d, indexes %v; want [ka kb], 2, [0 1]", l, ev.Limits, ev.Weight, ev.Indexes)
				}
			}
			if len(reaped) != 2 {
				t.Errorf("reaped events of %s: %d, want one per limit (2)", short(id), len(reaped))
			}
			t.Logf("%s: SIGKILL -> both limits free in %s", how, ptMS(time.Since(killAt)))
		})
	}
}

// TestSigkillBothAdmittedWithinTTL: a holder (--ttl 2s) and its whole job
// die by SIGKILL while a run waits; the waiter is admitted within the TTL
// without anyone running reap. On this host and pid namespace the waiter's
// own renewal sweep proves the holder dead; a holder in another pid
// namespace cannot be proven dead from here, and its lease expires.
func TestSigkillBothAdmittedWithinTTL(t *testing.T) {
	const ttl = 2 * time.Second
	const bound = 3500 * time.Millisecond
	script := `echo $SLOTCTL_TICKET > ticket; echo $$ > pid; sleep 60; true`

	type holder struct {
		sup, child int // pids as seen from here
		id         string
		kill       func()
	}
	// run starts the holder, queues a waiter behind it, kills the holder and
	// its job, and returns how long after the kill the waiter's child
	// started, how long after the holder's lease could first have expired
	// (its last renewal + ttl), and the log's reaped event.
	run := func(t *testing.T, e *ptEnv, ctx context.Context, start func() holder) (time.Duration, time.Duration, eventJSON) {
		t.Helper()
		h := start()
		waiter := e.start(ctx, "waiter", "run", "--limit", "b", "--ttl", ttl.String(), "--",
			"sh", "-c", `date +%s%N > admitted.tmp; mv admitted.tmp admitted`)
		ptWaitFor(t, "waiter queued", 5*time.Second, func() bool { return strings.Contains(waiter.stderr(), "waiting for limit") })
		time.Sleep(300 * time.Millisecond)
		if ptExists(e.path("admitted")) {
			t.Fatalf("waiter admitted while the holder lived")
		}
		gone := ptWatchGone(ctx, h.child)
		renewed := crashRenewed(ctx, t, e, h.id)
		killAt := time.Now()
		h.kill()
		select {
		case <-gone:
		case <-time.After(2 * time.Second):
			t.Fatalf("holder's child %d still running 2s after the kill", h.child)
		}
		if code := waiter.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("waiter exited %d, want 0; stderr:\n%s", code, waiter.stderr())
		}
		admitted := time.Unix(0, ptReadInt(t, e.path("admitted")))
		lat := admitted.Sub(killAt)
		if lat >= bound {
			t.Errorf("waiter admitted %s after the holder died, want < %s (ttl %s)", lat, bound, ttl)
		}
		ev, ok := crashEvent(crashEvents(ctx, t, e), "reaped", h.id)
		if !ok {
			t.Fatalf("log has no reaped event for the dead holder's ticket %s", h.id)
		}
		return lat, admitted.Sub(renewed.Add(ttl)), ev
	}

	t.Run("same-pid-namespace", func(t *testing.T) {
		e := newPTEnv(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lat, _, ev := run(t, e, ctx, func() holder {
			p := e.start(ctx, "holder", "run", "--limit", "b", "--ttl", ttl.String(), "--", "sh", "-c", script)
			pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
			e.notePid(pid)
			id := crashLine(t, e.path("ticket"), 5*time.Second)
			crashWaitChildRecorded(ctx, t, e, id, pid)
			return holder{sup: p.cmd.Process.Pid, child: pid, id: id, kill: func() {
				crashSignal(t, p.cmd.Process.Pid, syscall.SIGKILL)
				crashSignal(t, -pid, syscall.SIGKILL)
				if code := p.wait(t, 5*time.Second); code != -1 {
					t.Fatalf("holder exited %d, want killed", code)
				}
			}}
		})
		// Proven dead by the waiter's renewal sweep (every ~ttl/3), long
		// before the lease could expire (>= ttl - one renewal period).
		if !regexp.MustCompile(`^supervisor \d+ gone, process group \d+ empty$`).MatchString(ev.Evidence) {
			t.Errorf("reaped with evidence %q, want the proof of death (supervisor gone, process group empty)", ev.Evidence)
		}
		t.Logf("SIGKILL of holder and its group -> waiter admitted %s (ttl %s, no reap run); evidence %q", ptMS(lat), ttl, ev.Evidence)
	})

	t.Run("other-pid-namespace", func(t *testing.T) {
		e := newPTEnv(t)
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			t.Skip("no unshare(1)")
		}
		nsArgs := []string{"--pid", "--fork", "--mount-proc", "--kill-child"}
		if out, err := exec.Command(unshare, append(nsArgs, "true")...).CombinedOutput(); err != nil {
			t.Skipf("cannot make a pid namespace here: %v: %s", err, out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lat, afterExpiry, ev := run(t, e, ctx, func() holder {
			// slotctl is pid 1 of a new pid namespace: killing it kills
			// everything in the namespace, its child's group included.
			args := append(slices.Clone(nsArgs), e.bin, "run", "--limit", "b", "--ttl", ttl.String(), "--", "sh", "-c", script)
			u := e.startProgram(ctx, "holder", unshare, args...)
			nsPid := int(ptWaitInt(t, e.path("pid"), 5*time.Second)) // the child's pid in its namespace
			id := crashLine(t, e.path("ticket"), 5*time.Second)
			sup := crashChildNamed(t, u.cmd.Process.Pid, "slotctl", 5*time.Second)
			child := crashChildNamed(t, crashChildNamed(t, sup, "slotctl-guard", 5*time.Second), "sh", 5*time.Second)
			e.notePid(child)
			tk := crashWaitChildRecorded(ctx, t, e, id, nsPid)
			if tk.Holder.PidNS == proc.PidNS() {
				t.Fatalf("holder's ticket records this pid namespace (%d): unshare did not work", tk.Holder.PidNS)
			}
			return holder{sup: sup, child: child, id: id, kill: func() {
				crashSignal(t, sup, syscall.SIGKILL)
				_ = u.wait(t, 5*time.Second)
			}}
		})
		// Not provable from here: the lease decides, so the slot is not
		// free before the holder's last renewal + ttl.
		if !strings.HasPrefix(ev.Evidence, "expired ") {
			t.Errorf("reaped with evidence %q, want expiry: a holder in another pid namespace cannot be proven dead here", ev.Evidence)
		}
		if afterExpiry < 0 {
			t.Errorf("waiter admitted %s before the holder's lease (last renewed, + %s) could have expired", -afterExpiry, ttl)
		}
		t.Logf("SIGKILL of a holder in another pid namespace -> waiter admitted %s (ttl %s, no reap run; %s after the lease's expiry); evidence %q",
			ptMS(lat), ttl, ptMS(afterExpiry), ev.Evidence)
	})
}

// TestSigstopSupervisorPastTTL: a supervisor stopped (SIGSTOP) longer than
// its lease loses the slot to another job, and its guard stops the job at
// the lease's end (SIGTERM) without it, so the two never run together; on
// SIGCONT it finds its local deadline past and its job gone, and exits 76.
func TestSigstopSupervisorPastTTL(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 2 * time.Second

	first := e.start(ctx, "first", "run", "--limit", "p", "--ttl", ttl.String(), "--", "sh", "-c",
		// The trap must be quick: a loss noticed past the lease leaves the
		// job half the margin (100 ms here) before SIGKILL. So no fork in
		// it, and the shell waits with wait, which a signal interrupts, not
		// in a foreground sleep, which it does not.
		`trap 'echo term >> events; exit 0' TERM; echo $SLOTCTL_TICKET > ticket; echo $$ > pid; touch started; while :; do sleep 0.05 & wait $!; done`)
	pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
	e.notePid(pid)
	id := crashLine(t, e.path("ticket"), 5*time.Second)
	ptWaitFor(t, "first child started", 5*time.Second, func() bool { return ptExists(e.path("started")) })
	time.Sleep(300 * time.Millisecond)

	sup := first.cmd.Process.Pid
	renewed := crashRenewed(ctx, t, e, id)
	stopAt := time.Now()
	crashSignal(t, sup, syscall.SIGSTOP)
	ptWaitFor(t, "first slotctl stopped", 2*time.Second, func() bool {
		ps, ok := crashReadPS(sup)
		return ok && ps.state == 'T'
	})
	second := e.start(ctx, "second", "run", "--limit", "p", "--ttl", ttl.String(), "--",
		"sh", "-c", `date +%s%N > second.tmp; mv second.tmp second`)
	if code := second.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("second run exited %d, want 0 (admitted once the stopped holder's lease expired); stderr:\n%s", code, second.stderr())
	}
	admitted := time.Unix(0, ptReadInt(t, e.path("second")))
	if d := admitted.Sub(renewed.Add(ttl)); d < 0 {
		t.Errorf("second admitted %s before the stopped holder's lease (last renewed, + %s) could have expired", -d, ttl)
	}
	// The guard stopped the job at the lease's end by itself: the stopped
	// supervisor could not, and the second job must not run beside it.
	if !ptGone(pid) {
		t.Errorf("the first child %d still runs beside the second job: its supervisor is stopped, and its lease has expired", pid)
	}

	// Keep the supervisor stopped ~3s in all.
	time.Sleep(time.Until(stopAt.Add(3 * time.Second)))
	gone := ptWatchGone(ctx, pid)
	contAt := time.Now()
	crashSignal(t, sup, syscall.SIGCONT)
	code := first.wait(t, 10*time.Second)
	var childGone time.Time
	select {
	case childGone = <-gone:
	case <-time.After(2 * time.Second):
		t.Fatalf("first child %d still running 2s after its supervisor exited", pid)
	}
	if code != exitLost {
		t.Errorf("first slotctl exited %d after SIGCONT, want %d; stderr:\n%s", code, exitLost, first.stderr())
	}
	if d := first.exitedAt.Sub(contAt); d >= 5*time.Second { // well before --kill-after's 10s
		t.Errorf("first slotctl exited %s after SIGCONT, want at once (its child exits on SIGTERM)", d)
	}
	b, _ := os.ReadFile(e.path("events"))
	if !strings.HasPrefix(string(b), "term") {
		t.Errorf("first child did not get SIGTERM (events %q)", b)
	}
	se := first.stderr()
	if !strings.Contains(se, "lost") || !strings.Contains(se, "already gone") {
		t.Errorf("first slotctl does not say that its lease was lost and its ticket gone:\n%s", se)
	}
	evs := crashEvents(ctx, t, e)
	if ev, ok := crashEvent(evs, "reaped", id); !ok || !strings.HasPrefix(ev.Evidence, "expired ") {
		t.Errorf("log: reaped event of the stopped holder's ticket %+v (found %v), want evidence \"expired ...\"", ev, ok)
	}
	if _, ok := crashEvent(evs, "lost", id); !ok {
		t.Errorf("log has no lost event for the stopped holder's ticket %s", id)
	}
	t.Logf("SIGSTOP -> second admitted %s (ttl %s; %s after the lease's expiry), the first child gone before; SIGCONT -> first slotctl exited %s (76)",
		ptMS(admitted.Sub(stopAt)), ttl, ptMS(admitted.Sub(renewed.Add(ttl))), ptMS(first.exitedAt.Sub(contAt)))
	_ = childGone
}

// crashGroupWatch follows a process group until it has no running member.
type crashGroupWatch struct {
	pgid      int
	done      chan struct{}
	lastAlive time.Time // last poll that found a running member
	firstGone time.Time // first poll that found none
}

func crashWatchGroup(ctx context.Context, pgid int) *crashGroupWatch {
	w := &crashGroupWatch{pgid: pgid, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			at := time.Now()
			if proc.GroupEmpty(pgid) {
				w.firstGone = time.Now()
				return
			}
			w.lastAlive = at
			time.Sleep(3 * time.Millisecond)
		}
	}()
	return w
}

// crashEvidenceKind classifies a reap's evidence for the chaos summary.
func crashEvidenceKind(ev string) string {
	switch {
	case strings.Contains(ev, "orphaned"):
		return "orphan-group-killed"
	case strings.Contains(ev, "empty"):
		return "group-empty"
	case strings.Contains(ev, "no child"):
		return "waiter-dead"
	case strings.HasPrefix(ev, "expired"):
		return "expired"
	}
	return ev
}

// crashJob is one job of the chaos test.
type crashJob struct {
	i        int
	sleep    string
	p        *ptProc
	killAt   time.Time // when the SIGKILL was sent (zero: not sent)
	killed   bool      // the supervisor died of SIGKILL
	watch    *crashGroupWatch
	started  bool
	ended    bool
	start    int64 // ns, from the child's record
	end      int64
	pgid     int
	slot     int
	ticket   string
	endLow   int64 // the child's end for the sweep: recorded, else last seen running
	endHigh  int64 // recorded, else first seen gone
	endGuess bool  // end not recorded (killed): taken from the group watch
}

var crashJobLine = regexp.MustCompile(`^start (\d+) (\d+) (-?\d+) ([0-9a-f]+)$`)

// read parses the job's record: "start NS PID SLOT TICKET" then "end NS".
func (j *crashJob) read(e *ptEnv) error {
	b, err := os.ReadFile(e.path(fmt.Sprintf("job.%d", j.i)))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.HasSuffix(l, "\n") {
			continue // being written
		}
		l = strings.TrimSpace(l)
		if m := crashJobLine.FindStringSubmatch(l); m != nil {
			j.start, _ = strconv.ParseInt(m[1], 10, 64)
			j.pgid, _ = strconv.Atoi(m[2])
			j.slot, _ = strconv.Atoi(m[3])
			j.ticket, j.started = m[4], true
		} else if v, ok := strings.CutPrefix(l, "end "); ok {
			j.end, _ = strconv.ParseInt(v, 10, 64)
			j.ended = true
		} else if l != "" {
			return fmt.Errorf("job %d: bad record line %q", j.i, l)
		}
	}
	return nil
}

// TestChaos: 60 jobs on a 3-slot limit with 5s leases, launched a few at a
// time; about 10 supervisors SIGKILLed at random moments (waiting, running,
// finishing); slotctl reap in a loop beside them. Never more than 3 children
// at once, every job whose supervisor was not killed exits 0, and no ticket
// is left once the storm is over. Bounded well under a minute.
func TestChaos(t *testing.T) {
	e := newPTEnvAlone(t) // skipped with -short
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SLOTCTLTEST_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SLOTCTLTEST_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with SLOTCTLTEST_CHAOS_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x5107c71))
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()

	const (
		njobs  = 60
		slots  = 3
		nkills = 10
		ttl    = 5 * time.Second // room for a loaded machine: a holder still stops at its own deadline
	)
	script := `echo "start $(date +%s%N) $$ $SLOTCTL_SLOT $SLOTCTL_TICKET" >> job.$1; sleep $2; echo "end $(date +%s%N)" >> job.$1`
	jobs := make([]*crashJob, njobs)
	for i := range jobs {
		jobs[i] = &crashJob{i: i, sleep: fmt.Sprintf("0.%d", 2+rng.IntN(5))}
	}
	bursts := []int{}
	for n := 0; n < njobs; {
		b := min(1+rng.IntN(4), njobs-n)
		bursts = append(bursts, b)
		n += b
	}
	gaps := make([]time.Duration, len(bursts))
	var span time.Duration
	for k := range gaps {
		gaps[k] = time.Duration(100+rng.IntN(300)) * time.Millisecond
		span += gaps[k]
	}
	// The kill moments: random, from just after the first launch to a
	// while after the last; at each, a random live supervisor dies (every
	// other time one whose child runs, if there is one).
	killAt := make([]time.Duration, nkills)
	for k := range killAt {
		killAt[k] = 200*time.Millisecond + time.Duration(rng.Int64N(int64(span+time.Second)))
	}
	slices.Sort(killAt)
	krng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))

	// reap in a loop until the storm is over.
	stormOver := make(chan struct{})
	var reapRuns, reapFailures int
	reapEvidence := map[string]int{}
	var reapErrs []string
	reapDone := make(chan struct{})
	go func() {
		defer close(reapDone)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stormOver:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			cmd := exec.CommandContext(ctx, e.bin, "reap", "-o", "json")
			cmd.Dir, cmd.Env = e.dir, e.env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			reapRuns++
			var r reapJSON
			if err == nil {
				err = json.Unmarshal(out, &r)
			}
			if err != nil {
				reapFailures++
				reapErrs = append(reapErrs, fmt.Sprintf("%v: %s", err, stderr.String()))
				continue
			}
			for _, x := range r.Removed {
				reapEvidence[crashEvidenceKind(x.Evidence)]++
			}
		}
	}()

	// The killer SIGKILLs one supervisor at each kill moment, watching its
	// child's process group first if the child has started.
	var mu sync.Mutex
	nlaunched := 0
	watch := func(j *crashJob) {
		if err := j.read(e); err != nil {
			t.Error(err)
		}
		if j.started && !j.ended && j.watch == nil {
			e.notePid(j.pgid)
			j.watch = crashWatchGroup(ctx, j.pgid)
		}
	}
	killerDone := make(chan struct{})
	var begin time.Time
	killer := func() {
		defer close(killerDone)
		for _, at := range killAt {
			select {
			case <-time.After(time.Until(begin.Add(at))):
			case <-ctx.Done():
				return
			}
			mu.Lock()
			n := nlaunched
			mu.Unlock()
			var live, running []*crashJob
			for _, j := range jobs[:n] {
				select {
				case <-j.p.done:
					continue
				default:
				}
				if !j.killAt.IsZero() {
					continue
				}
				live = append(live, j)
				if err := j.read(e); err != nil {
					t.Error(err)
				}
				if j.started && !j.ended {
					running = append(running, j)
				}
			}
			if krng.IntN(2) == 0 && len(running) > 0 {
				live = running
			}
			if len(live) == 0 {
				continue
			}
			j := live[krng.IntN(len(live))]
			watch(j)
			j.killAt = time.Now()
			_ = j.p.cmd.Process.Signal(syscall.SIGKILL)
			select {
			case <-j.p.done:
			case <-ctx.Done():
				return
			}
			if j.watch == nil { // the child may have started just as its supervisor died
				time.Sleep(50 * time.Millisecond)
				watch(j)
			}
		}
	}

	begin = time.Now()
	go killer()
	n := 0
	for k, b := range bursts {
		for range b {
			j := jobs[n]
			j.p = e.start(ctx, fmt.Sprintf("job%02d", j.i), "run", "--limit", "chaos", "--slots", strconv.Itoa(slots), "--ttl", ttl.String(), "--",
				"sh", "-c", script, "sh", strconv.Itoa(j.i), j.sleep)
			n++
			mu.Lock()
			nlaunched = n
			mu.Unlock()
		}
		time.Sleep(gaps[k])
	}
	launched := time.Since(begin)
	<-killerDone
	for _, j := range jobs {
		j.p.wait(t, time.Until(begin.Add(45*time.Second)))
	}
	stormEnd := time.Now()
	close(stormOver)
	<-reapDone
	for _, j := range jobs {
		if j.watch != nil {
			select {
			case <-j.watch.done:
			case <-time.After(5 * time.Second):
				t.Errorf("job %d: process group %d of a killed supervisor still runs %s after the storm", j.i, j.pgid, 5*time.Second)
			}
		}
	}

	// Exit statuses and records.
	var killedWaiting, killedRunning, killedAfter, notKilledAfterAll []int
	for _, j := range jobs {
		if err := j.read(e); err != nil {
			t.Error(err)
		}
		ws, _ := j.p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		j.killed = ws.Signaled() && ws.Signal() == syscall.SIGKILL
		switch {
		case j.killed && !j.killAt.IsZero():
			switch {
			case !j.started:
				killedWaiting = append(killedWaiting, j.i)
			case !j.ended:
				killedRunning = append(killedRunning, j.i)
			default:
				killedAfter = append(killedAfter, j.i)
			}
		case j.killed:
			t.Errorf("job %d: supervisor died of SIGKILL that the test did not send; stderr:\n%s", j.i, j.p.stderr())
		default:
			if !j.killAt.IsZero() {
				notKilledAfterAll = append(notKilledAfterAll, j.i) // exited just before the SIGKILL
			}
			if code := j.p.cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("job %d (supervisor not killed) exited %d, want 0; stderr:\n%s", j.i, code, j.p.stderr())
			}
			if !j.started || !j.ended {
				t.Errorf("job %d (supervisor not killed) has no start/end record (started %v, ended %v)", j.i, j.started, j.ended)
			}
		}
	}

	// Concurrency: sweep over the children's lifetimes. A killed job's child
	// with no end record ends, for the check, when its process group was
	// last seen running (a lower bound); the upper bound (first seen gone)
	// is reported.
	type ev struct {
		at    int64
		delta int
	}
	var lo, hi []ev
	var guessed []string
	for _, j := range jobs {
		if !j.started {
			continue
		}
		switch {
		case j.ended:
			j.endLow, j.endHigh = j.end, j.end
		case j.watch != nil && !j.watch.firstGone.IsZero():
			j.endGuess = true
			j.endLow, j.endHigh = max(j.start, j.watch.lastAlive.UnixNano()), j.watch.firstGone.UnixNano()
			guessed = append(guessed, fmt.Sprintf("job %d: group %d gone %s..%s after the kill", j.i, j.pgid,
				ptMS(time.Unix(0, j.endLow).Sub(j.killAt)), ptMS(time.Unix(0, j.endHigh).Sub(j.killAt))))
		default:
			t.Errorf("job %d: child started but neither ended nor was watched to its end", j.i)
			continue
		}
		if j.endLow < j.start {
			t.Errorf("job %d ends (%d) before it starts (%d)", j.i, j.endLow, j.start)
		}
		lo = append(lo, ev{j.start, +1}, ev{j.endLow, -1})
		hi = append(hi, ev{j.start, +1}, ev{j.endHigh, -1})
	}
	peak := func(evs []ev) (int, int64) {
		sort.Slice(evs, func(a, b int) bool {
			if evs[a].at != evs[b].at {
				return evs[a].at < evs[b].at
			}
			return evs[a].delta < evs[b].delta
		})
		cur, top, at := 0, 0, int64(0)
		for _, x := range evs {
			cur += x.delta
			if cur > top {
				top, at = cur, x.at
			}
		}
		return top, at
	}
	peakLo, peakAt := peak(lo)
	peakHi, _ := peak(hi)
	if peakLo > slots {
		t.Errorf("%d children running at once at %s into the storm; the limit has %d slots", peakLo, time.Unix(0, peakAt).Sub(begin), slots)
	}
	// Slots: in 0..2 and distinct among children running at once.
	for a, x := range jobs {
		if !x.started {
			continue
		}
		if x.slot < 0 || x.slot >= slots {
			t.Errorf("job %d got SLOTCTL_SLOT=%d, want 0..%d", x.i, x.slot, slots-1)
		}
		for _, y := range jobs[a+1:] {
			if y.started && x.start < y.endLow && y.start < x.endLow && x.slot == y.slot {
				t.Errorf("jobs %d and %d ran at once on slot %d", x.i, y.i, x.slot)
			}
		}
	}

	// Nothing left: at once, or after at most a TTL and one reap.
	lim := crashLimit(ctx, t, e, "chaos")
	clean := "at once"
	if lim.Held != 0 || lim.Waiting != 0 {
		t.Logf("after the storm: held %d, waiting %d; waiting a ttl and reaping", lim.Held, lim.Waiting)
		time.Sleep(time.Until(stormEnd.Add(ttl + 100*time.Millisecond)))
		if code, out, errOut := crashRun(ctx, t, e, 10*time.Second, "reap", "chaos"); code != 0 {
			t.Errorf("final reap exited %d; stderr:\n%s", code, errOut)
		} else {
			t.Logf("final reap:\n%s", out)
		}
		lim = crashLimit(ctx, t, e, "chaos")
		clean = "after a ttl and a reap"
	}
	if lim.Held != 0 || lim.Waiting != 0 {
		t.Errorf("after the storm, a ttl and a reap, limit chaos has held %d, waiting %d; want 0 and 0", lim.Held, lim.Waiting)
	}
	if reapFailures > 0 {
		t.Errorf("%d of %d reaps failed: %v", reapFailures, reapRuns, reapErrs)
	}

	// The log's account of the storm.
	kinds := map[string]int{}
	sweepEvidence := map[string]int{}
	admittedTickets := map[string]bool{}
	for _, x := range crashEvents(ctx, t, e) {
		if x.Limit == "chaos" {
			kinds[x.Kind]++
			if x.Kind == "reaped" {
				sweepEvidence[crashEvidenceKind(x.Evidence)]++
			}
			if x.Kind == "admitted" {
				admittedTickets[x.Ticket] = true
			}
		}
	}
	for _, j := range jobs {
		if j.started && !admittedTickets[j.ticket] {
			t.Errorf("job %d ran as ticket %s, which the log never admitted", j.i, j.ticket)
		}
	}

	for _, g := range guessed {
		t.Log(g)
	}
	nkilled := len(killedWaiting) + len(killedRunning) + len(killedAfter)
	t.Logf("chaos: %d jobs, %d supervisors SIGKILLed (waiting %v, child running %v, child done %v; planned but already exited %v); "+
		"max %d children at once (%d counting killed children until first seen gone); "+
		"launch %s, storm %s; %d reap runs removed %v; log %v, reaped by reap or admission sweeps %v; clean %s",
		njobs, nkilled, killedWaiting, killedRunning, killedAfter, notKilledAfterAll,
		peakLo, peakHi, launched.Round(time.Millisecond), stormEnd.Sub(begin).Round(time.Millisecond),
		reapRuns, reapEvidence, kinds, sweepEvidence, clean)
}
