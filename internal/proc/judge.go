package proc

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/slotctl/slotctl/store"
)

var hostname = sync.OnceValue(func() string { h, _ := os.Hostname(); return h })

// Dead proves a ticket's holder dead on this host (docs/leases.md §4.3, rule 9)
// and says how. A ticket from an earlier boot of this host is dead. On this
// boot and in this pid namespace the holder is dead when its supervisor is
// gone (or its pid now names another process) and no process of its job
// runs. Anything less — another host, another pid namespace, a process we
// cannot see — is left to the TTL.
//
// The store's pids are only hints: a member of a shared store's group can
// write any of them (docs/leases.md §4.5). The job is what its own processes carry:
// SLOTCTL_TICKET with the ticket's id and SLOTCTL_SUPERVISOR naming their
// supervisor (pid, start time, pid namespace), which its owner's processes
// got from that supervisor and nobody else can put there. While a process
// carries the ticket and names a live supervisor, the holder is alive,
// whatever the store says.
//
// A job still running after its supervisor died is an orphaned job: the
// parent-death signal took the child, but not what the child had started.
// Nobody renews its lease and nobody will stop it, so with act set Dead
// kills it and then calls the holder dead — only when every running member
// of the recorded process group, and every other process found with the
// ticket, carries the ticket and the same marker, and the supervisor that
// the marker (not the store) names is gone. Each process is signalled
// through a pidfd opened and checked before the signal (killJob). A reaper
// that cannot read a member's environment (another user's process, without
// CAP_SYS_PTRACE) or may not signal it leaves the ticket to the TTL.
// Without act (a dry run) it only says so.
func Dead(t store.Ticket, act bool) (string, bool) {
	h := t.Holder
	if h.BootID == "" || h.Pid <= 0 {
		return "", false
	}
	if h.BootID != BootID() {
		if h.Host != "" && h.Host == hostname() {
			return "previous boot", true
		}
		return "", false // another host: its own clock and processes are not ours to judge
	}
	if h.PidNS == 0 || h.PidNS != PidNS() {
		return "", false
	}
	var sup string
	switch Identify(h.Pid, h.PidStart) {
	case Alive:
		return "", false
	case Gone:
		sup = fmt.Sprintf("supervisor %d gone", h.Pid)
	case Reused:
		sup = fmt.Sprintf("supervisor %d gone (pid reused by another process)", h.Pid)
	}
	if h.Pgid > 0 && !sameGroup(h.Pgid, h.PgidStart) {
		return "", false // the recorded group is another now: nothing to prove by it
	}
	j, err := findJob(t.ID, h.Pgid)
	if err != nil {
		return "", false
	}
	if len(j.procs) == 0 {
		switch {
		case h.Pgid > 0 && GroupEmpty(h.Pgid):
			return fmt.Sprintf("%s, process group %d empty", sup, h.Pgid), true
		case h.Pgid > 0:
			return "", false // a member we cannot see
		case t.State == store.Waiting:
			return sup + ", no child started", true
		case j.unread == 0:
			// Held, but the child's group was never recorded: the supervisor
			// died between admission and recording it (the job's first
			// 50ms). Its child got the parent-death signal, and every process
			// that could be the job's was read: none carries the ticket.
			return sup + ", no process carries the ticket", true
		default:
			// The same, but a process that could be the job's cannot be read
			// (another user's): it might carry the ticket, so the TTL decides.
			return "", false
		}
	}
	if !orphaned(j) {
		return "", false
	}
	what := fmt.Sprintf("orphaned job of %d processes", len(j.procs))
	if h.Pgid > 0 && allIn(j, h.Pgid) {
		what = fmt.Sprintf("orphaned process group %d", h.Pgid)
	}
	if !act {
		return fmt.Sprintf("%s, %s still running: would be killed", sup, what), true
	}
	if !killJob(t.ID, h.Pgid, j, 2*time.Second) {
		return "", false
	}
	return fmt.Sprintf("%s, %s killed", sup, what), true
}

// orphaned: the supervisor the job's own processes name is provably gone —
// in this pid namespace, its pid free or another process's.
func orphaned(j job) bool {
	m := j.marker
	return m.PidNS == PidNS() && m.PidNS != 0 && Identify(m.Pid, m.Start) != Alive
}

func allIn(j job, pgid int) bool {
	for _, p := range j.procs {
		if p.pgrp != pgid {
			return false
		}
	}
	return true
}

// JobRunning reports whether a ticket's job provably still runs on this host
// although its supervisor is gone: an orphaned job, which reap would stop
// before freeing its slot.
func JobRunning(t store.Ticket) bool {
	h := t.Holder
	if h.BootID != BootID() || h.PidNS == 0 || h.PidNS != PidNS() || h.Pgid <= 0 {
		return false
	}
	if Identify(h.Pid, h.PidStart) == Alive || !sameGroup(h.Pgid, h.PgidStart) {
		return false
	}
	j, err := findJob(t.ID, h.Pgid)
	return err == nil && len(j.procs) > 0 && orphaned(j)
}
