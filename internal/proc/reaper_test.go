//go:build linux

package proc

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc/proctest"
	"github.com/slotctl/slotctl/internal/testkit/attacktest"
	"github.com/slotctl/slotctl/store"
)

// The packaged reaper runs as a system user of the store's group with only
// CAP_KILL, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH. These tests
// run proc.Dead in such a process (this test binary, TestReaperHelper, under
// setpriv as attacktest's Reaper) on the jobs of another member, Bob: proof
// of death and the orphan kill must work with exactly those capabilities,
// a forged store pid must change nothing, and without the capabilities the
// kill is refused and the ticket left to the TTL, never a wrong kill.

const reaperHelperVar = "SLOTCTLTEST_REAPER_TICKET"

// TestReaperHelper is not a test: run by reap (below) as the reaper user,
// it judges the ticket described in SLOTCTLTEST_REAPER_TICKET ("id pid start
// pgid pgidstart") with act set and prints the verdict.
func TestReaperHelper(t *testing.T) {
	spec := os.Getenv(reaperHelperVar)
	if spec == "" {
		t.Skip("helper for TestNonRootReaper*")
	}
	f := strings.Fields(spec)
	if len(f) != 5 {
		t.Fatalf("%s=%q", reaperHelperVar, spec)
	}
	n := func(s string) uint64 { v, _ := strconv.ParseUint(s, 10, 64); return v }
	tk := store.Ticket{ID: f[0], Limit: "x", State: store.Held, Fence: 1, TTL: time.Hour,
		Holder: store.Holder{Host: hostname(), BootID: BootID(), PidNS: PidNS(),
			Pid: int(n(f[1])), PidStart: n(f[2]), Pgid: int(n(f[3])), PgidStart: n(f[4])}}
	ev, dead := owner.Dead(tk, true)
	status, _ := os.ReadFile("/proc/self/status")
	var caps []string
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "Uid:") || strings.HasPrefix(l, "CapEff:") {
			caps = append(caps, strings.Join(strings.Fields(l), " "))
		}
	}
	fmt.Printf("VERDICT dead=%v evidence=%q (%s)\n", dead, ev, strings.Join(caps, ", "))
}

// reaperCaps are the packaged reaper's capabilities, as setpriv names them.
const reaperCaps = "kill,sys_ptrace,dac_read_search"

// reap runs TestReaperHelper as e.Reaper with capabilities caps (setpriv
// syntax, "" for none) on ticket tk, and returns its verdict line.
func reap(t *testing.T, e *attacktest.Env, bin, caps string, tk store.Ticket) string {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs util-linux setpriv")
	}
	u := e.Reaper
	args := []string{"--reuid=" + fmt.Sprint(u.Uid), "--regid=" + fmt.Sprint(u.Gid), "--groups=" + fmt.Sprint(e.Group)}
	if caps == "" {
		args = append(args, "--inh-caps=-all", "--bounding-set=-all")
	} else {
		plus := "+" + strings.ReplaceAll(caps, ",", ",+")
		args = append(args, "--inh-caps=-all,"+plus, "--ambient-caps="+plus, "--bounding-set=-all,"+plus)
	}
	args = append(args, "--", bin, "-test.run=^TestReaperHelper$", "-test.count=1", "-test.v")
	h := tk.Holder
	cmd := exec.Command(setpriv, args...)
	cmd.Dir = u.Home
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + u.Home,
		fmt.Sprintf("%s=%s %d %d %d %d", reaperHelperVar, tk.ID, h.Pid, h.PidStart, h.Pgid, h.PgidStart)}
	r := attacktest.Run(t, cmd, 30*time.Second)
	for _, l := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(l, "VERDICT ") {
			t.Logf("reaper (caps %q): %s", caps, l)
			return l
		}
	}
	t.Fatalf("reaper helper: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	return ""
}

// bobJob is a job of Bob's as slotctl runs one: a supervisor (a sleep
// standing in for slotctl run) and, in its own process group, sh with a
// grandchild, carrying SLOTCTL_TICKET=id and the supervisor's marker.
type bobJob struct {
	sup, job             *exec.Cmd
	supStart, jobStart   uint64
	pgid                 int
	grandkids            []int
	supReaped, jobReaped bool
}

func startBobJob(t *testing.T, e *attacktest.Env, id string) *bobJob {
	t.Helper()
	if err := proctest.Subreaper(); err != nil {
		t.Logf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	b := &bobJob{}
	b.sup = e.Bob.Command(e.Bob.Home, nil, "sleep", "60")
	if err := b.sup.Start(); err != nil {
		t.Fatal(err)
	}
	b.supStart = mustStart(t, b.sup.Process.Pid)
	b.job = e.Bob.Command(e.Bob.Home, []string{"SLOTCTL_TICKET=" + id, proctest.SupervisorVar(b.sup.Process.Pid, b.supStart)},
		"sh", "-c", "sleep 60 & wait")
	b.job.SysProcAttr.Setpgid = true
	if err := b.job.Start(); err != nil {
		t.Fatal(err)
	}
	b.pgid = b.job.Process.Pid
	b.jobStart = mustStart(t, b.pgid)
	t.Cleanup(func() {
		_ = unix.Kill(-b.pgid, unix.SIGKILL)
		_ = b.sup.Process.Kill()
		b.waitSup()
		b.waitJob()
		for _, g := range b.grandkids {
			proctest.ReapOrphan(g)
		}
	})
	for deadline := time.Now().Add(settle); len(groupMembers(b.pgid)) < 2; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Bob's job %d: members %v", b.pgid, groupMembers(b.pgid))
		}
	}
	for _, m := range groupMembers(b.pgid) {
		if m != b.pgid {
			b.grandkids = append(b.grandkids, m)
		}
	}
	return b
}

func (b *bobJob) waitSup() {
	if !b.supReaped {
		b.supReaped = true
		_ = b.sup.Wait()
	}
}

func (b *bobJob) waitJob() {
	if !b.jobReaped {
		b.jobReaped = true
		_ = b.job.Wait()
	}
}

// killSup SIGKILLs Bob's supervisor: the job runs on, orphaned.
func (b *bobJob) killSup() {
	_ = b.sup.Process.Kill()
	b.waitSup()
}

func (b *bobJob) running() bool {
	return len(groupMembers(b.pgid)) == 2 && Identify(b.pgid, b.jobStart) == Alive
}

func (b *bobJob) ticket(id string) store.Ticket {
	return store.Ticket{ID: id, Holder: store.Holder{Pid: b.sup.Process.Pid, PidStart: b.supStart, Pgid: b.pgid, PgidStart: b.jobStart}}
}

func TestNonRootReaperProvesDeathAndKillsOrphan(t *testing.T) {
	e := attacktest.New(t)
	bin := e.Install(os.Args[0], "proc.test")
	b := startBobJob(t, e, "bobs")

	// While Bob's supervisor lives, its ticket is alive, with the
	// capabilities or without.
	for _, caps := range []string{reaperCaps, ""} {
		if v := reap(t, e, bin, caps, b.ticket("bobs")); !strings.Contains(v, "dead=false") {
			t.Errorf("live job judged: %s", v)
		}
	}
	// Alice forges Bob's ticket: its supervisor pid a gone one. The reaper with the packaged capabilities can read and kill
	// Bob's processes; it must not.
	gone, goneStart := gonePid(t)
	forged := b.ticket("bobs")
	forged.Holder.Pid, forged.Holder.PidStart = gone, goneStart
	if v := reap(t, e, bin, reaperCaps, forged); !strings.Contains(v, "dead=false") {
		t.Errorf("forged supervisor pid: %s", v)
	}
	if !b.running() {
		t.Fatalf("Bob's running job was killed on a forged ticket: members %v", groupMembers(b.pgid))
	}

	// Bob's supervisor dies; the job runs on. Without the capabilities the
	// reaper cannot read Bob's processes, so they are not its to kill: the
	// ticket is left to the TTL, the job untouched.
	b.killSup()
	for _, caps := range []string{"", "kill", "sys_ptrace,dac_read_search"} {
		if v := reap(t, e, bin, caps, b.ticket("bobs")); !strings.Contains(v, "dead=false") {
			t.Errorf("reaper with caps %q: %s; want the TTL to decide", caps, v)
		}
		if !b.running() {
			t.Fatalf("reaper with caps %q killed Bob's job (members %v)", caps, groupMembers(b.pgid))
		}
	}
	// With the packaged capabilities: the orphan is killed, the holder dead.
	v := reap(t, e, bin, reaperCaps, b.ticket("bobs"))
	if want := fmt.Sprintf("orphaned process group %d killed", b.pgid); !strings.Contains(v, "dead=true") || !strings.Contains(v, want) {
		t.Errorf("orphaned job: %s; want dead, %q", v, want)
	}
	b.waitJob()
	if ws := b.job.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("Bob's orphaned job leader: %v, want SIGKILL", b.job.ProcessState)
	}
	for _, g := range b.grandkids {
		proctest.ReapOrphan(g)
	}
	if !GroupEmpty(b.pgid) {
		t.Errorf("group %d after the kill: %v", b.pgid, groupMembers(b.pgid))
	}
	// Proof of death without a kill: supervisor gone, group empty.
	v = reap(t, e, bin, reaperCaps, b.ticket("bobs"))
	if want := fmt.Sprintf("process group %d empty", b.pgid); !strings.Contains(v, "dead=true") || !strings.Contains(v, want) {
		t.Errorf("after the kill: %s; want dead, %q", v, want)
	}
}
