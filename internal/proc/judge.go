package proc

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/slotctl/slotctl/store"
)

var hostname = sync.OnceValue(func() string { h, _ := os.Hostname(); return h })

// Dead proves a ticket's holder dead on this host (SPEC §4.3, LEASES rule 9)
// and says how. A ticket from an earlier boot of this host is dead. On this
// boot and in this pid namespace the holder is dead when its supervisor is
// gone (or its pid now names another process) and its child's process group
// has no running member. Anything less — another host, another pid
// namespace, a process we cannot see — is left to the TTL.
//
// A group still running after its supervisor died is an orphaned job: the
// parent-death signal took the child, but not what the child had started.
// Nobody renews its lease and nobody will stop it, so with act set Dead
// kills the group (SIGKILL, after checking it is still the job's group) and
// then calls the holder dead; a reaper without the permission to do so
// leaves it to the TTL. Without act (a dry run) it only says so.
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
	switch {
	case h.Pgid > 0:
		if GroupEmpty(h.Pgid) {
			return fmt.Sprintf("%s, process group %d empty", sup, h.Pgid), true
		}
		if !sameGroup(h.Pgid, h.PgidStart) || !jobGroup(h.Pgid, t.ID) {
			return "", false
		}
		if !act {
			return fmt.Sprintf("%s, orphaned process group %d still running: would be killed", sup, h.Pgid), true
		}
		if !KillGroup(h.Pgid, 2*time.Second) {
			return "", false
		}
		return fmt.Sprintf("%s, orphaned process group %d killed", sup, h.Pgid), true
	case t.State == store.Waiting:
		return sup + ", no child started", true
	default:
		// Held, but the child's group was never recorded: the supervisor
		// died between admission and recording it. Its child (if any) got
		// the parent-death signal, but that is not proof: the TTL decides.
		return "", false
	}
}

// JobRunning reports whether a ticket's job provably still runs on this host
// although its supervisor is gone: an orphaned job, which reap would stop
// before freeing its slot.
func JobRunning(t store.Ticket) bool {
	h := t.Holder
	if h.BootID != BootID() || h.PidNS == 0 || h.PidNS != PidNS() || h.Pgid <= 0 {
		return false
	}
	return Identify(h.Pid, h.PidStart) != Alive && !GroupEmpty(h.Pgid) &&
		sameGroup(h.Pgid, h.PgidStart) && jobGroup(h.Pgid, t.ID)
}
