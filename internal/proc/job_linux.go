package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A job is the set of running processes that carry one ticket: each has
// SLOTCTL_TICKET=<id> and the same SLOTCTL_SUPERVISOR marker in its
// environment. A process's environment is set by whoever started it and can
// be read only by its own user (or with CAP_SYS_PTRACE): a member can forge
// the store's pids, not what another member's processes carry.
type job struct {
	procs  []jobProc
	marker Marker // the supervisor all of them name
	// unread counts the running processes outside the group whose
	// environment could not be read and that might be the job's: not
	// kernel threads, not this process's ancestors.
	unread int
}

// pfKthread is PF_KTHREAD in /proc/PID/stat's flags: a kernel thread,
// which has no environment and is nobody's job.
const pfKthread = 0x00200000

type jobProc struct {
	pid   int
	start uint64
	pgrp  int
	uid   int // its one uid (real, effective, saved and filesystem), -1 if they differ
}

// errNotTheJob: something that is not provably the job's would be in the way.
type errNotTheJob struct{ why string }

func (e errNotTheJob) Error() string { return e.why }

// findJob scans /proc for the job of ticket id. Every running member of
// process group pgid (a hint from the store, 0 if none) must be one of its
// processes; a member that cannot be read, or that carries another ticket or
// supervisor, is not the reaper's to kill, and makes findJob fail. Outside
// that group, a process that carries the ticket is the job's; one that
// cannot be read is not known to be. A job whose processes name different
// supervisors, or none, or that includes this very process, is not provably
// one job either.
func findJob(id string, pgid int) (job, error) { return local.findJob(id, pgid) }

func (r reader) findJob(id string, pgid int) (job, error) {
	var j job
	if id == "" {
		return j, errNotTheJob{"no ticket id"}
	}
	pids, err := r.h.Pids()
	if err != nil {
		return j, errNotTheJob{err.Error()}
	}
	s := jobScan{r: r, id: id, pgid: pgid, self: r.h.Self()}
	for _, pid := range pids {
		if err := s.visit(pid); err != nil {
			return s.j, err
		}
	}
	return s.j, nil
}

// jobScan is findJob's state while it reads /proc: the job found so far.
// Its own type so that each process's judgement is a method of its own.
type jobScan struct {
	r    reader
	id   string // the ticket
	pgid int    // the recorded process group, 0 if none
	self int    // this process, which must not be the job's
	seen bool   // a process of the job was found: j.marker is set
	j    job
}

// visit reads process pid: one of the job's processes is added to it, one
// in the way fails the scan.
func (s *jobScan) visit(pid int) error {
	st, err := s.r.stat(pid)
	if err != nil || s.r.h.Dying(pid, st) {
		return nil
	}
	inGroup := s.pgid > 0 && st.Pgrp == s.pgid
	env, err := s.r.h.Environ(pid)
	if err != nil {
		return s.unreadable(pid, st, inGroup, err)
	}
	ticket, ok := getenv(env, TicketVar)
	if !ok || ticket != s.id {
		if inGroup && !s.r.goneSince(pid, st) {
			return errNotTheJob{fmt.Sprintf("member %d of process group %d is not the job of ticket %s", pid, s.pgid, s.id)}
		}
		return nil
	}
	return s.carrier(pid, st, env)
}

// unreadable judges a running process whose environment could not be read
// (err): in the group it fails the scan; elsewhere it is counted, as one
// that might be the job's, unless it cannot be (a kernel thread, an
// ancestor of this process) or has gone since.
func (s *jobScan) unreadable(pid int, st Stat, inGroup bool, err error) error {
	if inGroup && !s.r.goneSince(pid, st) {
		return errNotTheJob{fmt.Sprintf("member %d of process group %d cannot be read: %v", pid, s.pgid, unwrap(err))}
	}
	if st.Flags&pfKthread == 0 && !s.r.isAncestor(pid, st.Start) && !s.r.goneSince(pid, st) {
		s.j.unread++
	}
	return nil
}

// carrier adds process pid, which carries the ticket (env), to the job,
// unless it shows the processes are not provably one job: a malformed
// marker, another supervisor than the others name, or this very process.
func (s *jobScan) carrier(pid int, st Stat, env []byte) error {
	raw, _ := getenv(env, SupervisorVar)
	m, err := ParseMarker(raw)
	if err != nil {
		return errNotTheJob{fmt.Sprintf("process %d carries ticket %s but %s %q: %v", pid, s.id, SupervisorVar, raw, err)}
	}
	if s.seen && m != s.j.marker {
		return errNotTheJob{fmt.Sprintf("the processes of ticket %s name different supervisors (%s, %s)", s.id, s.j.marker, m)}
	}
	if pid == s.self {
		return errNotTheJob{"this process belongs to the job"}
	}
	s.j.marker, s.seen = m, true
	s.j.procs = append(s.j.procs, jobProc{pid: pid, start: st.Start, pgrp: st.Pgrp, uid: s.r.h.UID(pid)})
	return nil
}

// procUID is the uid process pid runs as when its real, effective, saved
// and filesystem uids are one, else (or unreadable) -1.
func procUID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		rest, ok := bytes.CutPrefix(line, []byte("Uid:"))
		if !ok {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) != 4 || f[0] != f[1] || f[0] != f[2] || f[0] != f[3] {
			return -1
		}
		uid, err := strconv.Atoi(f[0])
		if err != nil || uid < 0 {
			return -1
		}
		return uid
	}
	return -1
}

// goneSince reports whether process pid, seen running as st, has exited
// since (or is exiting): a process that dies while it is read shows no
// environment, or none that can be read, and is not a stranger for that.
func (r reader) goneSince(pid int, st Stat) bool {
	now, err := r.stat(pid)
	return err != nil || now.Start != st.Start || r.h.Dying(pid, now)
}

func unwrap(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// getenv is the first value of name in a /proc/PID/environ block, as the
// process's own getenv(3) would find it.
func getenv(env []byte, name string) (string, bool) {
	prefix := []byte(name + "=")
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		if bytes.HasPrefix(kv, prefix) {
			return string(kv[len(prefix):]), true
		}
	}
	return "", false
}

// carries reports whether process p is still the one found (same start
// time, running) and still carries the job's ticket and marker.
func (r reader) carries(p jobProc, id string, m Marker) bool {
	st, err := r.stat(p.pid)
	if err != nil || st.Start != p.start || r.h.Dying(p.pid, st) {
		return false
	}
	env, err := r.h.Environ(p.pid)
	if err != nil {
		return false
	}
	ticket, _ := getenv(env, TicketVar)
	raw, _ := getenv(env, SupervisorVar)
	got, err := ParseMarker(raw)
	return ticket == id && err == nil && got == m
}

// pidfdOpen is unix.PidfdOpen; tests take it away, as an old kernel does.
var pidfdOpen = unix.PidfdOpen

// errNotOurs: the kernel refused to let this process signal the job.
var errNotOurs = errors.New("not permitted to signal the job")

// kill sends SIGKILL to p through a pidfd, after checking p again (start
// time, ticket, marker): see Host.SignalIf.
func (p jobProc) kill(id string, m Marker) error { return local.kill(p, id, m) }

func (r reader) kill(p jobProc, id string, m Marker) error {
	return r.h.SignalIf(p.pid, unix.SIGKILL, func() bool { return r.carries(p, id, m) })
}

// killJob kills the job of ticket id found by findJob, again and again until
// none of its processes runs (a process forked meanwhile carries the ticket
// too) or wait runs out. It reports false when the kernel refused a signal,
// when something not provably the job's joined its group, or in time.
func killJob(id string, pgid int, j job, wait time.Duration) bool {
	return local.killJob(id, pgid, j, wait)
}

func (r reader) killJob(id string, pgid int, j job, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	var killed []jobProc
	for ; ; time.Sleep(5 * time.Millisecond) {
		for _, p := range j.procs {
			if err := r.kill(p, id, j.marker); err != nil {
				return false
			}
		}
		killed = append(killed, j.procs...)
		next, err := r.findJob(id, pgid)
		if err != nil || (len(next.procs) > 0 && next.marker != j.marker) {
			return false
		}
		if len(next.procs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return false
		}
		j = next
	}
	// Every process is past its own code; wait for each to be done exiting.
	for _, p := range killed {
		for {
			st, err := r.stat(p.pid)
			if err != nil || st.Start != p.start || r.h.Exited(p.pid, st) {
				break
			}
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(time.Millisecond)
		}
	}
	return true
}

// AncestryKnown: IsAncestor can tell, here.
func AncestryKnown() bool { return true }

// IsAncestor reports whether process (pid, start) is on this process's
// parent chain, in this pid namespace: a parent, a grandparent, ... It walks
// /proc/PID/stat upwards, at most 4096 steps.
func IsAncestor(pid int, start uint64) bool { return local.isAncestor(pid, start) }

func (r reader) isAncestor(pid int, start uint64) bool {
	if pid <= 0 || start == 0 {
		return false
	}
	cur := r.h.Self()
	for range 4096 {
		st, err := r.stat(cur)
		if err != nil || st.Ppid <= 0 {
			return false
		}
		if st.Ppid == pid {
			pst, err := r.stat(pid)
			return err == nil && pst.Start == start
		}
		cur = st.Ppid
	}
	return false
}
