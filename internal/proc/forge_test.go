//go:build linux

package proc

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc/proctest"
	"github.com/slotctl/slotctl/store"
)

// docs/leases.md §4.5: a member edits another member's ticket so
// that its supervisor pid names a pid not in use (and its group hints point
// anywhere). The job still runs under its live supervisor, whose pid and
// start time its own processes carry (SLOTCTL_SUPERVISOR): nothing is
// killed and nothing is proven.
func TestDeadForgedSupervisorPid(t *testing.T) {
	sup := spawn(t, false, "sleep", "30") // the victim's supervisor, alive
	job := proctest.JobOf(t, ticketID, proctest.SupervisorVar(sup.Pid, sup.Start))
	members := groupMembers(job.Pid)
	gone, goneStart := gonePid(t)
	empty, emptyStart := goneGroup(t)
	for _, forged := range []store.Ticket{
		ticket(store.Held, gone, goneStart, job.Pid, job.Start),      // supervisor pid forged
		ticket(store.Held, gone, goneStart, job.Pid, 0),              // and the group's start
		ticket(store.Held, sup.Pid, sup.Start+1, job.Pid, job.Start), // "reused"
		ticket(store.Held, gone, goneStart, empty, emptyStart),       // the group too: an empty one
	} {
		for _, act := range []bool{false, true} {
			if ev, dead := owner.Dead(forged, act); dead {
				t.Errorf("Dead(forged holder %+v, act=%v) = %q, true: the victim's job runs under its live supervisor %d", forged.Holder, act, ev, sup.Pid)
			}
		}
		if JobRunning(forged) {
			t.Errorf("JobRunning(forged holder %+v) = true: its supervisor lives", forged.Holder)
		}
	}
	if got := groupMembers(job.Pid); len(got) != len(members) || Identify(job.Pid, job.Start) != Alive {
		t.Fatalf("the victim's job was signalled: members %v, were %v", got, members)
	}
	if got := Identify(sup.Pid, sup.Start); got != Alive {
		t.Errorf("the victim's supervisor: %v, want Alive", got)
	}
	// Once the victim's supervisor is really gone, the same forged ticket
	// finds the job orphaned, and kills exactly it.
	sup.Kill()
	ev, dead := owner.Dead(ticket(store.Held, gone, goneStart, job.Pid, job.Start), true)
	if !dead || !strings.Contains(ev, "killed") {
		t.Errorf("Dead(orphaned job, forged supervisor pid) = %q, %v; want it killed", ev, dead)
	}
	if !GroupEmpty(job.Pid) {
		t.Errorf("orphaned group %d still has members %v", job.Pid, groupMembers(job.Pid))
	}
}

// A process that carries the victim's ticket but a supervisor marker of its
// own (a decoy naming a gone supervisor) proves nothing: the job's processes
// disagree about their supervisor, so none is killed.
func TestDeadDecoyMarker(t *testing.T) {
	sup := spawn(t, false, "sleep", "30")
	job := proctest.JobOf(t, ticketID, proctest.SupervisorVar(sup.Pid, sup.Start))
	gone, goneStart := gonePid(t)
	decoy := proctest.JobOf(t, ticketID, proctest.SupervisorVar(gone, goneStart))
	for _, pgid := range []int{decoy.Pid, job.Pid} {
		if ev, dead := owner.Dead(ticket(store.Held, gone, goneStart, pgid, 0), true); dead {
			t.Errorf("Dead(decoy beside a live job, group %d) = %q, true", pgid, ev)
		}
	}
	if len(groupMembers(job.Pid)) != 2 || len(groupMembers(decoy.Pid)) != 2 {
		t.Errorf("signalled: job members %v, decoy members %v", groupMembers(job.Pid), groupMembers(decoy.Pid))
	}
}

// A job whose processes carry no supervisor marker (a foreign or older
// program that set SLOTCTL_TICKET) is not provably orphaned: never killed.
func TestDeadNoMarkerNotKilled(t *testing.T) {
	gone, goneStart := gonePid(t)
	job := proctest.JobOf(t, ticketID)
	if ev, dead := owner.Dead(ticket(store.Held, gone, goneStart, job.Pid, job.Start), true); dead {
		t.Errorf("Dead(job without a supervisor marker) = %q, true", ev)
	}
	if len(groupMembers(job.Pid)) != 2 {
		t.Errorf("signalled: members %v", groupMembers(job.Pid))
	}
}

// The kill goes through a pidfd to the process found, checked again once
// the pidfd is open: a pid that names another process by then (start time
// differs) or no longer carries the ticket is not signalled.
func TestKillChecksThroughPidfd(t *testing.T) {
	gone, goneStart := gonePid(t)
	m, err := ParseMarker(strings.TrimPrefix(proctest.SupervisorVar(gone, goneStart), SupervisorVar+"="))
	if err != nil {
		t.Fatal(err)
	}
	job := proctest.JobOf(t, ticketID, proctest.SupervisorVar(gone, goneStart))
	other := spawn(t, false, "sleep", "30") // carries no ticket
	for _, p := range []jobProc{
		{pid: job.Pid, start: job.Start + 1, pgrp: job.Pid}, // another process by now
		{pid: other.Pid, start: other.Start},                // not the job's
	} {
		if err := p.kill(ticketID, m); err != nil {
			t.Errorf("kill(%+v) = %v", p, err)
		}
		if err := p.kill("t2", m); err != nil {
			t.Errorf("kill(%+v, other ticket) = %v", p, err)
		}
	}
	if Identify(job.Pid, job.Start) != Alive || Identify(other.Pid, other.Start) != Alive {
		t.Fatalf("a process that is not the one found was signalled")
	}
	if err := (jobProc{pid: job.Pid, start: job.Start}).kill(ticketID, Marker{Pid: m.Pid, Start: m.Start + 1, PidNS: m.PidNS}); err != nil || Identify(job.Pid, job.Start) != Alive {
		t.Fatalf("kill with another marker: %v; leader %v", err, Identify(job.Pid, job.Start))
	}
	if err := (jobProc{pid: job.Pid, start: job.Start}).kill(ticketID, m); err != nil {
		t.Fatalf("kill(the job's leader) = %v", err)
	}
	waitState(t, job.Pid, "ZX")
}

func TestParseMarker(t *testing.T) {
	m, err := ParseMarker("4242:987654:4026531836")
	if err != nil || m != (Marker{4242, 987654, 4026531836}) || m.String() != "4242:987654:4026531836" {
		t.Fatalf("ParseMarker = %+v, %v", m, err)
	}
	for _, bad := range []string{"", "1:2", "1:2:3:4", "0:1:1", "-1:1:1", "1:0:1", "1:1:0", "+1:1:1", "01:1:1", "1: 1:1", "x:1:1"} {
		if _, err := ParseMarker(bad); err == nil {
			t.Errorf("ParseMarker(%q) accepted", bad)
		}
	}
	if s, ok := SelfMarker(); !ok || s.Pid != os.Getpid() || !IsAncestor(os.Getppid(), mustStart(t, os.Getppid())) {
		t.Errorf("SelfMarker = %+v, %v; or the parent is not an ancestor", s, ok)
	}
}

func TestIsAncestor(t *testing.T) {
	if IsAncestor(os.Getpid(), mustStart(t, os.Getpid())) {
		t.Errorf("IsAncestor(self) = true")
	}
	if p := os.Getppid(); IsAncestor(p, mustStart(t, p)+1) || IsAncestor(p, 0) {
		t.Errorf("IsAncestor(parent, another start) = true")
	}
	if !IsAncestor(1, mustStart(t, 1)) && os.Getpid() != 1 {
		t.Errorf("IsAncestor(1) = false")
	}
	k := spawn(t, false, "sleep", "30") // a child, not an ancestor
	if IsAncestor(k.Pid, k.Start) {
		t.Errorf("IsAncestor(child) = true")
	}
}

// Without pidfds (an old kernel, a seccomp filter), the kill checks the
// process again and signals its pid: still only the job's processes.
func TestKillWithoutPidfd(t *testing.T) {
	t.Cleanup(func() { pidfdOpen = unix.PidfdOpen })
	for _, errno := range []error{unix.ENOSYS, unix.EPERM} {
		pidfdOpen = func(int, int) (int, error) { return -1, errno }
		gone, goneStart := gonePid(t)
		m := Marker{Pid: gone, Start: goneStart, PidNS: PidNS()}
		job := proctest.JobOf(t, ticketID, proctest.SupervisorVar(gone, goneStart))
		if err := (jobProc{pid: job.Pid, start: job.Start + 1}).kill(ticketID, m); err != nil || Identify(job.Pid, job.Start) != Alive {
			t.Errorf("%v: kill(another start) = %v, leader %v", errno, err, Identify(job.Pid, job.Start))
		}
		ev, dead := owner.Dead(ticket(store.Held, gone, goneStart, job.Pid, job.Start), true)
		if !dead || !strings.Contains(ev, "killed") || !GroupEmpty(job.Pid) {
			j, err := findJob(ticketID, job.Pid)
			t.Errorf("%v: owner.Dead(orphan) = %q, %v; members %v; findJob = %+v, %v", errno, ev, dead, groupMembers(job.Pid), j, err)
		}
	}
}

func TestParseStatFields(t *testing.T) {
	line := []byte("4242 (evil ) name) S 17 4242 4242 0 -1 4194564 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100")
	st, err := parseStat(line)
	if err != nil || st.Ppid != 17 || st.Pgrp != 4242 || st.Flags != 4194564 || st.Start != 987654 || st.State != 'S' {
		t.Fatalf("parseStat = %+v, %v", st, err)
	}
	// PF_EXITING (0x4) is set: the process is in exit(2), as good as a zombie.
	if !st.gone() {
		t.Errorf("a task with PF_EXITING is not gone")
	}
	st.Flags &^= pfExiting
	if st.gone() {
		t.Errorf("a sleeping task is gone")
	}
}
