package proc

import (
	"fmt"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// A Judge proves a ticket's holder dead on this host (docs/leases.md §4.3,
// rule 9) for one store. Its zero value proves deaths and kills nobody.
type Judge struct {
	// Authority finds the evidence, kept by the job's owner outside the
	// shared store, that the job of ticket id run by uid was admitted and
	// not released: the supervisor it names. With it, Dead may kill what is
	// left of an orphaned job (reap); nil, it never signals anyone.
	Authority func(uid int, id string) (Marker, bool)
	// Host is the machine judged on; nil is this process's own.
	Host Host
	// Mutations is test-only (internal/mutation): known judge bugs
	// switched back on. Without the build tag it is empty.
	Mutations mutation.Set
}

// Dead is the judge that kills nobody: Judge{}.Dead.
func Dead(t store.Ticket, act bool) (string, bool) { return Judge{}.Dead(t, act) }

// Dead proves a ticket's holder dead on this host and says how. Only this
// boot and pid namespace can be judged here: a ticket of another boot id
// may be another machine's (a cloned VM and a container share host names),
// so it is left to the TTL, and to the store that knows which boots were
// its own (a host-local store judges its previous boots by its clock). On
// this boot and in this pid namespace the holder is dead when its
// supervisor is gone (or its pid now names another process) and no
// process of its job runs.
//
// The store's pids are only hints: a member of a shared store's group can
// write any of them (docs/leases.md §4.5). The job is what its own processes carry:
// SLOTCTL_TICKET with the ticket's id and SLOTCTL_SUPERVISOR naming their
// supervisor (pid, start time, pid namespace), which its owner's processes
// got from that supervisor and nobody else can put there. While a process
// carries the ticket and names a live supervisor, the holder is alive,
// whatever the store says.
//
// A job still running after its supervisor died is an orphaned job. A
// ticket in the store cannot authorise killing it: any member can write
// back a ticket that a job's leftover daemon still carries. So Dead kills
// an orphaned job (and then calls the holder dead) only with act set and
// with the owner's evidence (j.Authority) naming the same supervisor, the
// uid of every one of the job's processes, and only when every running
// member of the recorded process group, and every other process found
// with the ticket, carries the ticket and that marker, and the supervisor
// it names is gone. Each process is signalled through a pidfd opened and
// checked before the signal (killJob). Without that evidence, or where a
// member cannot be read (another user's process, without CAP_SYS_PTRACE)
// or may not be signalled, the ticket is left to the TTL. Without act (a
// dry run) it only says what it would do.
func (jd Judge) Dead(t store.Ticket, act bool) (string, bool) {
	r, h := jd.r(), t.Holder
	sup, ok := r.supervisorGone(h)
	if !ok {
		return "", false
	}
	if h.Pgid > 0 && !r.sameGroup(h.Pgid, h.PgidStart) {
		return "", false // the recorded group is another now: nothing to prove by it
	}
	j, err := r.findJob(t.ID, h.Pgid)
	if err != nil {
		return "", false
	}
	if len(j.procs) == 0 {
		return r.noJobLeft(t, j, sup)
	}
	return jd.orphanedJob(t, j, sup, act)
}

// supervisorGone says how the ticket's supervisor is gone (sup), when the
// ticket is of this boot and pid namespace, the only ones judged here, and
// its supervisor is not alive. Otherwise ok is false: the holder is not
// proved dead.
func (r reader) supervisorGone(h store.Holder) (sup string, ok bool) {
	switch {
	case r.mut.Has(mutation.HostNameIdentity): // mutation (test-only): the host by its name
		if h.Host == "" || h.Pid <= 0 || h.Host != r.h.Hostname() {
			return "", false
		}
	case h.BootID == "" || h.Pid <= 0 || h.BootID != r.h.BootID():
		return "", false
	}
	if h.PidNS == 0 || h.PidNS != r.h.PidNS() {
		return "", false
	}
	switch r.identify(h.Pid, h.PidStart) {
	case Alive:
		return "", false
	case Gone:
		sup = fmt.Sprintf("supervisor %d gone", h.Pid)
	case Reused:
		sup = fmt.Sprintf("supervisor %d gone (pid reused by another process)", h.Pid)
	}
	return sup, true
}

// noJobLeft judges a holder whose supervisor is gone (sup) and of whose
// job no process was found (j): dead only when that absence proves it.
func (r reader) noJobLeft(t store.Ticket, j job, sup string) (string, bool) {
	h := t.Holder
	switch {
	case h.Pgid > 0 && r.groupEmpty(h.Pgid):
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

// orphanedJob judges a holder whose supervisor is gone (sup) but whose job
// j still runs: dead once the job is killed, which only the owner's
// evidence allows (act false: only says it would be).
func (jd Judge) orphanedJob(t store.Ticket, j job, sup string, act bool) (string, bool) {
	r, h := jd.r(), t.Holder
	if !r.orphaned(j) || !jd.authorised(t, j) {
		return "", false
	}
	what := fmt.Sprintf("orphaned job of %d processes", len(j.procs))
	if h.Pgid > 0 && allIn(j, h.Pgid) {
		what = fmt.Sprintf("orphaned process group %d", h.Pgid)
	}
	if !act {
		return fmt.Sprintf("%s, %s still running: would be killed", sup, what), true
	}
	if !r.killJob(t.ID, h.Pgid, j, 2*time.Second) {
		return "", false
	}
	return fmt.Sprintf("%s, %s killed", sup, what), true
}

// authorised: the owner of every process of job j (one uid for all) keeps
// evidence that ticket t's job under the supervisor they name was never
// released.
func (jd Judge) authorised(t store.Ticket, j job) bool {
	if jd.Mutations.Has(mutation.ReplayedKill) && len(j.procs) > 0 { // mutation (test-only): the record authorises
		h := t.Holder
		return Marker{Pid: h.Pid, Start: h.PidStart, PidNS: h.PidNS} == j.marker
	}
	if jd.Authority == nil || len(j.procs) == 0 {
		return false
	}
	uid := j.procs[0].uid
	for _, p := range j.procs {
		if p.uid != uid || uid < 0 {
			return false
		}
	}
	m, ok := jd.Authority(uid, t.ID)
	return ok && m == j.marker
}

// orphaned: the supervisor the job's own processes name is provably gone —
// in this pid namespace, its pid free or another process's.
func (r reader) orphaned(j job) bool {
	m := j.marker
	return m.PidNS == r.h.PidNS() && m.PidNS != 0 && r.identify(m.Pid, m.Start) != Alive
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
func JobRunning(t store.Ticket) bool { return Judge{}.JobRunning(t) }

// JobRunning is [JobRunning] on the judge's host.
func (jd Judge) JobRunning(t store.Ticket) bool {
	r, h := jd.r(), t.Holder
	if h.BootID != r.h.BootID() || h.PidNS == 0 || h.PidNS != r.h.PidNS() || h.Pgid <= 0 {
		return false
	}
	if r.identify(h.Pid, h.PidStart) == Alive || !r.sameGroup(h.Pgid, h.PgidStart) {
		return false
	}
	j, err := r.findJob(t.ID, h.Pgid)
	return err == nil && len(j.procs) > 0 && r.orphaned(j)
}

// SupervisorAlive reports whether a ticket's supervisor provably runs on
// this host: the ticket's boot and pid namespace are this process's, and its
// pid names a running process with the recorded start time. A late renewal
// of such a waiter is the machine's load, not its death (docs/leases.md
// rule 17). Only what can be read counts: a process that cannot be read, or
// a record without a start time, proves nothing.
func SupervisorAlive(t store.Ticket) bool { return Judge{}.SupervisorAlive(t) }

// SupervisorAlive is [SupervisorAlive] on the judge's host.
func (jd Judge) SupervisorAlive(t store.Ticket) bool {
	r, h := jd.r(), t.Holder
	if h.BootID == "" || h.BootID != r.h.BootID() || h.PidNS == 0 || h.PidNS != r.h.PidNS() || h.Pid <= 0 || h.PidStart == 0 {
		return false
	}
	return r.running(h.Pid, h.PidStart)
}
