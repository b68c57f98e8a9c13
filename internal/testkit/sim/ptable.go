package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// The process table: the machines the holders run on and their processes,
// which the real death judge (internal/proc's Judge) reads through a
// proc.Host, as it reads /proc. The store's host (machine 0) runs the
// reapers; other machines share the store and a host name with it.

// rootPidNS is the inode of the initial pid namespace, the same on every
// Linux host: a pid namespace names no machine.
const rootPidNS = 4026531836

// guardBound is how long a job's processes may outlive their supervisor:
// its guard SIGKILLs the whole tree as soon as the kernel closes the
// supervisor's end of its socket, again every few milliseconds until
// none is left.
const guardBound = 100 * time.Millisecond

// A machine is one host of the model.
type machine struct {
	n     int
	name  string // another machine's, for a clone or a container host
	boot  string // "" on the store's host: its boot is the store clock's
	clk   *hostClock
	procs map[int]*mproc
}

type pkind int

const (
	pInit pkind = iota
	pReaper
	pSupervisor
	pGuard
	pCommand    // the job's command, the guard's child
	pDescendant // started by the command, or by one of those
	pDaemon     // handed to a service manager: not the job's tree, but carries its variables
)

// An mproc is one process.
type mproc struct {
	mc                   *machine
	pid, ppid, pgrp, sid int
	start                uint64 // clock ticks after boot, on the host's clock
	pidns                uint64
	off                  time.Duration // its time namespace's boottime offset
	env                  []byte        // NUL-separated; empty once cleared (env -i)
	uid                  int
	h                    *holder // the run it belongs to
	kind                 pkind
	ignoreTerm           bool
	end                  time.Duration // it exits by itself then
}

type ptable struct {
	s        *sim
	rng      *rand.Rand
	machines []*machine
	reaper   *mproc // the reapers' process: root, in the store's host's root namespaces
	reboots  int
	keeps    bool // the store keeps a ticket whose orphaned job provably runs (Judges.Keep)
}

func newPtable(s *sim) *ptable {
	pt := &ptable{s: s, rng: rand.New(rand.NewPCG(s.cfg.Seed, s.cfg.Seed^0x9f0c7ab))}
	// Machine 1 is a clone of the store's host (same name); 2 another host.
	for i, name := range []string{"ci", "ci", "build2"} {
		mc := &machine{n: i, name: name, procs: map[int]*mproc{}}
		if i > 0 {
			mc.boot = fmt.Sprintf("boot-of-%d", i)
		}
		pt.machines = append(pt.machines, mc)
	}
	_, pt.keeps = s.be.(*Bolt)
	pt.boot()
	return pt
}

// boot starts each machine's init, and the reapers' process.
func (pt *ptable) boot() {
	for _, mc := range pt.machines {
		clear(mc.procs)
		mc.procs[1] = &mproc{mc: mc, pid: 1, pgrp: 1, sid: 1, start: 1, pidns: rootPidNS, end: never, kind: pInit}
	}
	pt.reaper = pt.spawn(pt.machines[0], pt.machines[0].procs[1], pReaper, nil)
}

// reboot: every process of every machine dies (the simulation's reboot),
// and each machine starts a new boot.
func (pt *ptable) reboot() {
	pt.reboots++
	for _, mc := range pt.machines[1:] {
		mc.boot = fmt.Sprintf("boot-of-%d.%d", mc.n, pt.reboots)
	}
	pt.boot()
}

func (mc *machine) bootID(s *sim) string {
	if mc.boot == "" {
		return s.now().Boot
	}
	return mc.boot
}

// ticks is the boot-time clock in /proc's clock ticks.
func (pt *ptable) ticks() uint64 { return uint64(pt.s.now().Mono / (10 * time.Millisecond)) }

// spawn starts a process under parent, in its groups and namespaces, with
// its environment (env, if not nil) and uid.
func (pt *ptable) spawn(mc *machine, parent *mproc, kind pkind, env []byte) *mproc {
	p := &mproc{mc: mc, ppid: parent.pid, pgrp: parent.pgrp, sid: parent.sid, start: pt.ticks(), pidns: parent.pidns,
		off: parent.off, env: parent.env, uid: parent.uid, h: parent.h, kind: kind, end: never}
	if env != nil {
		p.env = env
	}
	// A free pid, at random: pids of gone processes come back, and pids
	// of different machines meet. As the kernel does, not one that names a
	// live process group or session.
	for {
		p.pid = 300 + pt.rng.IntN(2000)
		if !mc.inUse(p.pid) {
			break
		}
	}
	mc.procs[p.pid] = p
	return p
}

// exit ends p. Its children go to the job's guard, their subreaper, or
// to init once the guard is gone.
func (pt *ptable) exit(p *mproc) {
	if p == nil || p.mc.procs[p.pid] != p {
		return
	}
	delete(p.mc.procs, p.pid)
	heir := 1
	if h := p.h; h != nil && (p.kind == pCommand || p.kind == pDescendant) && h.child.guard.alive() {
		heir = h.child.guard.pid
	}
	for _, q := range p.mc.procs {
		if q.ppid == p.pid {
			q.ppid = heir
		}
	}
	h := p.h
	if h == nil || p.kind != pCommand && p.kind != pDescendant {
		return
	}
	if p == h.child.leader && h.child.running {
		h.child.running = false
		close(h.child.exited)
	}
	h.jobGone()
}

func (p *mproc) alive() bool { return p != nil && p.mc.procs[p.pid] == p }

// tidy ends the processes whose time has come, and tells a job's holder
// that nothing of the job is left.
func (pt *ptable) tidy() {
	now := pt.s.now().Mono
	for _, mc := range pt.machines {
		for _, pid := range mc.pids() {
			if p := mc.procs[pid]; p != nil && p.kind >= pDescendant && p.end <= now {
				pt.exit(p)
			}
		}
	}
	for _, h := range pt.s.holders {
		h.jobGone()
	}
}

func (mc *machine) inUse(pid int) bool {
	if mc.procs[pid] != nil {
		return true
	}
	for _, q := range mc.procs {
		if q.pgrp == pid || q.sid == pid {
			return true
		}
	}
	return false
}

func (mc *machine) pids() []int {
	pids := make([]int, 0, len(mc.procs))
	for pid := range mc.procs {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// tree is what is left of h's job: its command and every process started
// under it, in whatever group or session (not the daemons it handed off).
func (h *holder) tree() []*mproc {
	var out []*mproc
	for _, p := range h.child.procs {
		if p.alive() && (p.kind == pCommand || p.kind == pDescendant) {
			out = append(out, p)
		}
	}
	return out
}

// jobGone closes the job's Gone once nothing of it is left (its guard
// sees no child left, says so and exits).
func (h *holder) jobGone() {
	c := &h.child
	// A lost guard's job is reported gone once its orphans are killed.
	left := len(h.tree()) > 0 && !h.guardLost
	if h.foreground && h.s.cfg.Mutations.Has(mutation.ForegroundUndrained) { // mutation (test-only): a terminal's job drained by its command alone
		left = false
	}
	if c.gone == nil || closed(c.gone) || c.running || left {
		return
	}
	h.s.pt.exit(c.guard)
	close(c.gone)
}

// deliver is the kernel delivering sig to p (by: who sent it, for the
// rules). SIGTERM ends a process that does not ignore it within 1.5 kill
// graces of its holder; SIGKILL at once.
func (pt *ptable) deliver(p *mproc, sig syscall.Signal, by *mproc) {
	if sig == 0 || !p.alive() {
		return
	}
	if by != nil && by.kind == pReaper && sig == syscall.SIGKILL {
		pt.s.tracef("the judge kills process %d (of %s)", p.pid, ownerName(p.h))
		pt.s.stats.Procs.JudgeKills++
		pt.s.m.reaperKill(p)
	}
	switch sig {
	case syscall.SIGKILL:
		pt.exit(p)
	case syscall.SIGTERM:
		if p.ignoreTerm || p.kind == pCommand || p.h == nil {
			return // the command's own answer is simChild.Signal's
		}
		p.end = min(p.end, pt.s.now().Mono+time.Duration(pt.rng.Int64N(int64(3*p.h.grace/2)+1)))
	}
}

// newJob starts h's job under its supervisor: the guard, the command
// (leading a group of its own, or in the supervisor's on a terminal), and
// 0-3 processes under it, some of which move to a session of their own,
// ignore SIGTERM, clear their environment, or outlive the command; and
// now and then a daemon handed to the service manager.
func (pt *ptable) newJob(h *holder, m proc.Marker) {
	s, c, sup := pt.s, &h.child, h.sup
	env := []byte(proc.TicketVar + "=" + h.id + "\x00" + proc.SupervisorVar + "=" + m.String() + "\x00PATH=/usr/bin\x00")
	c.guard = pt.spawn(sup.mc, sup, pGuard, nil)
	if !h.foreground {
		c.guard.pgrp = c.guard.pid
	}
	c.leader = pt.spawn(sup.mc, c.guard, pCommand, env)
	c.leader.end = c.end
	if !h.foreground {
		c.leader.pgrp = c.leader.pid
	}
	c.procs = []*mproc{c.guard, c.leader}
	st := &s.stats.Procs
	st.JobProcs++
	now := s.now().Mono
	for range pt.rng.IntN(4) {
		parent := c.procs[1+pt.rng.IntN(len(c.procs)-1)]
		p := pt.spawn(sup.mc, parent, pDescendant, nil)
		st.JobProcs++
		if pt.rng.IntN(3) == 0 {
			p.sid, p.pgrp = p.pid, p.pid // setsid
			st.Setsid++
		}
		if pt.rng.IntN(4) == 0 {
			p.ignoreTerm = true
			st.IgnoreTerm++
		}
		if pt.rng.IntN(5) == 0 {
			p.env = []byte{} // env -i
			st.ClearEnv++
		}
		p.end = now + time.Duration(pt.rng.Int64N(int64(h.runFor)+1))
		if pt.rng.IntN(3) == 0 {
			p.end = c.end + time.Duration(pt.rng.Int64N(int64(h.ttl)+1))
			st.Outlive++
		}
		c.procs = append(c.procs, p)
	}
	if pt.rng.IntN(6) == 0 {
		d := pt.spawn(sup.mc, sup.mc.procs[1], pDaemon, env)
		d.uid, d.h, d.end = sup.uid, h, now+h.ttl+time.Duration(pt.rng.Int64N(int64(3*h.ttl)))
		d.pgrp, d.sid = d.pid, d.pid
		c.procs = append(c.procs, d)
		st.Daemons++
	}
}

// supervisorDied: the kernel closes the supervisor's end of the guard's
// socket, and the guard kills the whole job; without it
// (mutation.PdeathsigOnly) only the command, whose parent-death signal is
// SIGKILL, dies.
func (pt *ptable) supervisorDied(h *holder) {
	pt.exit(h.sup)
	c := &h.child
	if c.guard == nil {
		return
	}
	if pt.s.cfg.Mutations.Has(mutation.PdeathsigOnly) {
		pt.exit(c.guard)
		pt.exit(c.leader)
		return
	}
	if pt.keeps && pt.s.judgeOn && c.guard.alive() && h.reapable() && pt.rng.IntN(4) == 0 {
		// Killed with its supervisor (each SIGKILLed: the OOM killer
		// taking one then the other, kill -9 of both): the command dies by its
		// parent-death signal, and what it started runs on, orphaned,
		// until a reap kills it on its owner's evidence; the store keeps
		// the ticket while it provably runs (docs/crashes.md).
		h.guardKilled = true
		pt.s.stats.Procs.GuardKilled++
		pt.exit(c.guard)
		pt.exit(c.leader)
		pt.s.tracef("%s's guard is killed with it", h.name)
		return
	}
	for _, p := range h.tree() {
		pt.exit(p)
	}
	pt.exit(c.guard)
}

// killGuardAlone SIGKILLs the guard of a running job, its supervisor
// alive: the command dies by its parent-death signal, the rest comes to
// the supervisor, their subreaper, which SIGKILLs every one that carries
// the job's marks (internal/guard's killOrphans; mutation.OrphansLeft:
// none) and reports the job exited and gone. What cleared its environment
// is not found (docs/security.md, "Hidden job processes").
func (s *sim) killGuardAlone() bool {
	h := s.anyHolderFrom(s.guardRng, func(h *holder) bool { return h.child.running && h.child.guard.alive() && h.sup.alive() })
	if h == nil {
		return false
	}
	pt, c := s.pt, &h.child
	h.guardLost = true
	s.stats.Procs.GuardKilledAlone++
	s.tracef("%s's guard is killed (SIGKILL) alone", h.name)
	pt.exit(c.guard)
	for _, p := range h.tree() {
		if p.ppid == 1 {
			p.ppid = h.sup.pid // the supervisor is the job's subreaper
		}
	}
	pt.exit(c.leader)
	if !s.cfg.Mutations.Has(mutation.OrphansLeft) {
		for _, p := range h.tree() {
			if p.carries(h.id) {
				pt.exit(p)
			}
		}
	}
	h.jobGone()
	return true
}

// hidden: p is of h's job but out of every reach once the guard was lost:
// it cleared its environment, so nothing finds it by the job's marks.
func (h *holder) hidden(p *mproc) bool { return h.guardLost && !p.carries(h.id) }

// A view is the machine as one of its processes sees it: a proc.Host.
type view struct {
	pt   *ptable
	mc   *machine
	self *mproc
}

var _ proc.Host = view{}

func (v view) BootID() string            { return v.mc.bootID(v.pt.s) }
func (v view) PidNS() uint64             { return v.self.pidns }
func (v view) Hostname() string          { return v.mc.name }
func (v view) TimeOffset() time.Duration { return v.self.off }
func (v view) Self() int                 { return v.self.pid }
func (v view) Pids() ([]int, error)      { return v.mc.pids(), nil }

func (v view) proc(pid int, what string) (*mproc, error) {
	p := v.mc.procs[pid]
	if p == nil {
		return nil, &fs.PathError{Op: "open", Path: "/proc/" + strconv.Itoa(pid) + "/" + what, Err: fs.ErrNotExist}
	}
	return p, nil
}

// Stat shows the start time with the reader's time offset added, as the
// kernel does. An exiting process leaves the table at once: no zombies.
func (v view) Stat(pid int) (proc.Stat, error) {
	p, err := v.proc(pid, "stat")
	if err != nil {
		return proc.Stat{}, err
	}
	return proc.Stat{State: 'S', Ppid: p.ppid, Pgrp: p.pgrp, Start: p.start + uint64(v.self.off/(10*time.Millisecond))}, nil
}

func (v view) Exited(int, proc.Stat) bool { return false }
func (v view) Dying(int, proc.Stat) bool  { return false }

func (v view) Environ(pid int) ([]byte, error) {
	p, err := v.proc(pid, "environ")
	if err != nil {
		return nil, err
	}
	if v.self.uid != 0 && v.self.uid != p.uid {
		return nil, &fs.PathError{Op: "open", Path: "/proc/" + strconv.Itoa(pid) + "/environ", Err: fs.ErrPermission}
	}
	return p.env, nil
}

func (v view) UID(pid int) int {
	if p := v.mc.procs[pid]; p != nil {
		return p.uid
	}
	return -1
}

func (v view) may(p *mproc) bool { return v.self.uid == 0 || v.self.uid == p.uid }

func (v view) Kill(pid int, sig syscall.Signal) error {
	var to []*mproc
	if pid > 0 {
		if p := v.mc.procs[pid]; p != nil {
			to = append(to, p)
		}
	} else {
		for _, q := range v.mc.pids() {
			if p := v.mc.procs[q]; p.pgrp == -pid {
				to = append(to, p)
			}
		}
	}
	if len(to) == 0 {
		return syscall.ESRCH
	}
	for _, p := range to {
		if !v.may(p) {
			return syscall.EPERM
		}
	}
	for _, p := range to {
		v.pt.deliver(p, sig, v.self)
	}
	return nil
}

func (v view) SignalIf(pid int, sig syscall.Signal, check func() bool) error {
	p := v.mc.procs[pid]
	if p == nil || !check() {
		return nil
	}
	if !v.may(p) {
		return errors.New("not permitted to signal the job")
	}
	v.pt.deliver(p, sig, v.self)
	return nil
}

// reaperKill checks a SIGKILL the death judge sent (S27): only to a job
// whose supervisor is gone and whose owner keeps the evidence that it was
// admitted and not released.
func (m *model) reaperKill(p *mproc) {
	h := p.h
	switch {
	case h == nil:
		m.fail("S27", "the judge killed process %d, nobody's job", p.pid)
	case h.live():
		m.fail("S27", "the judge killed process %d of %s's job, whose supervisor runs", p.pid, h.name)
	case !h.crashed:
		m.fail("S27", "the judge killed process %d of %s's job, whose supervisor exited after its run (%s)", p.pid, h.name, h.exit)
	case !h.markerKept:
		m.fail("S27", "the judge killed process %d of %s's job, released", p.pid, h.name)
	}
}

// jobOutlives checks that nothing of a job runs past its supervisor's
// death by more than the guard's bound, nor past its run's end (S26). A
// job whose guard was killed too is the reapers' (orphansLeft).
func (m *model) jobOutlives(h *holder, now time.Duration) {
	if h.child.guard == nil || h.live() || h.guardKilled {
		return
	}
	for _, p := range h.tree() {
		if p.end <= now || h.hidden(p) {
			continue // exits this instant, or out of reach
		}
		if h.crashed && now > h.diedAt+guardBound {
			m.fail("S26", "process %d of %s's job runs %v after its supervisor died (guard's bound %v)", p.pid, h.name, now-h.diedAt, guardBound)
			return
		}
		if !h.crashed {
			m.fail("S26", "process %d of %s's job runs after its run ended (%s)", p.pid, h.name, h.exit)
			return
		}
	}
}

// orphansLeft checks, as h's ticket leaves the live set other than by an
// operator's hand (g), that no orphan of its job that a reaper can find
// runs on (S26): none carries its ticket. Out of reach, as documented
// (docs/crashes.md): a process that cleared its environment, and the
// members of a recorded group that holds one (the judge cannot tell that
// group is the job's).
func (m *model) orphansLeft(h *holder, g goneRec) {
	if !h.guardKilled {
		return
	}
	now := m.s.now().Mono
	group := h.child.leader.pgrp
	for _, p := range h.tree() {
		if p.pgrp == group && !p.carries(h.id) && p.end > now {
			return
		}
	}
	for _, p := range h.carriers() {
		if p.end > now {
			m.fail("S26", "%s's ticket %s %s while process %d of its job, orphaned (supervisor and guard killed %v ago), runs", h.name, short(h.id), g.why, p.pid, now-h.diedAt)
			return
		}
	}
}

// carries reports whether p's environment names ticket id.
func (p *mproc) carries(id string) bool {
	return bytes.Contains(p.env, []byte(proc.TicketVar+"="+id+"\x00"))
}

// reapable: h runs where the store's reapers can prove things, on the
// store's host and in its pid namespace. Elsewhere an orphaned job is
// nobody's to stop (on a shared store, the lease's end frees its slot:
// docs/crashes.md), so its guard is not killed with it here.
func (h *holder) reapable() bool { return h.sup.mc.n == 0 && h.sup.pidns == rootPidNS }

// orphaned: h's supervisor is dead, or its run ended with its release
// failed (a full disk, a held lock: the ticket stays to its lease's end),
// and a process that carries its ticket (what its job left when its guard
// was killed with it, or a daemon it handed off) runs on: the bbolt store
// keeps the ticket past its lease until a reap stops that (Judges.Keep).
func orphaned(h *holder) bool {
	if h == nil || h.live() {
		return false
	}
	for _, p := range h.child.procs {
		if p.alive() && p.carries(h.id) {
			return true
		}
	}
	return false
}

// carriers is what is left of h's job that carries its ticket.
func (h *holder) carriers() []*mproc {
	var out []*mproc
	for _, p := range h.tree() {
		if p.carries(h.id) {
			out = append(out, p)
		}
	}
	return out
}

// keep is the store's Keep: the real proc.Judge's JobRunning on the
// reapers' view.
func (s *sim) keep(t store.Ticket) bool {
	return s.judgeOn && s.reaperJudge().JobRunning(t)
}

// alive is the store's Alive: the real proc.Judge's SupervisorAlive on
// the reapers' view. A supervisor it vouches for must be running (S28).
func (s *sim) alive(t store.Ticket) bool {
	if !s.judgeOn || !s.reaperJudge().SupervisorAlive(t) {
		return false
	}
	if h := s.byHolder(t.Holder); h == nil || !h.sup.alive() {
		s.fail("S28", "ticket %s's supervisor proven alive, but it is not running", short(t.ID))
	}
	return true
}

func (s *sim) reaperJudge() proc.Judge {
	return proc.Judge{Host: view{pt: s.pt, mc: s.pt.machines[0], self: s.pt.reaper}, Authority: s.authority, Mutations: s.cfg.Mutations}
}

// judge is the store's death judge: the real one, reading the reapers'
// view of the store's host. Its verdicts are checked against what the
// model knows (S25): a holder proven dead has no supervisor and nothing
// of its job left.
func (s *sim) judge(t store.Ticket, act bool) (string, bool) {
	if !s.judgeOn {
		return "", false
	}
	why, dead := s.reaperJudge().Dead(t, act)
	if !dead {
		return why, false
	}
	s.judged[t.ID] = true
	if act {
		s.stats.Procs.ProvenDead++
	}
	h := s.byHolder(t.Holder)
	switch {
	case h == nil:
	case h.sup.alive():
		s.fail("S25", "%s's ticket %s proven dead (%s) while its supervisor (pid %d on %s) runs", h.name, short(t.ID), why, h.sup.pid, h.sup.mc.name)
	case len(h.carriers()) > 0 && act:
		s.fail("S25", "%s's ticket %s proven dead (%s) while process %d of its job runs", h.name, short(t.ID), why, h.carriers()[0].pid)
	}
	return why, true
}

// authority is the owners' evidence (store/boltstore's JobAuthority): a
// run keeps its supervisor's marker from its job's start to its release.
func (s *sim) authority(uid int, id string) (proc.Marker, bool) {
	for _, h := range s.holders {
		if h.id == id && h.markerKept && h.sup.uid == uid {
			return h.marker, true
		}
	}
	return proc.Marker{}, false
}

// byHolder is the run a ticket's record names, if any.
func (s *sim) byHolder(r store.Holder) *holder {
	for _, h := range s.holders {
		if h.sup != nil && h.rec.Pid == r.Pid && h.rec.BootID == r.BootID && h.rec.PidStart == r.PidStart && h.rec.Host == r.Host {
			return h
		}
	}
	return nil
}

// place draws where h runs: mostly on the store's host, some of those in a
// container (a pid namespace of their own) or a time namespace; else on a
// clone of it (same host name) or another host; now and then as a
// terminal's job. Its supervisor starts now.
func (pt *ptable) place(h *holder) {
	mc := pt.machines[0]
	switch r := pt.rng.IntN(20); {
	case r < 3:
		mc = pt.machines[1]
	case r < 5:
		mc = pt.machines[2]
	}
	sup := pt.spawn(mc, mc.procs[1], pSupervisor, []byte("PATH=/usr/bin\x00"))
	sup.h, sup.uid = h, 1000+pt.rng.IntN(2)
	sup.pgrp, sup.sid = sup.pid, sup.pid
	st := &pt.s.stats.Procs
	switch mc.n {
	case 1:
		st.Clone++
	case 2:
		st.OtherHost++
	}
	if mc.n == 0 && pt.rng.IntN(6) == 0 {
		sup.pidns = rootPidNS + 100 + uint64(h.n)
		st.PidNS++
	}
	if pt.rng.IntN(5) == 0 {
		sup.off = time.Duration(1+pt.rng.IntN(30*24)) * time.Hour // unshare -T --boottime
		st.TimeNS++
	}
	h.sup, h.foreground = sup, pt.rng.IntN(8) == 0
	if h.foreground {
		st.Foreground++
	}
}

// record is the holder's part of its ticket, as slotctl run fills it:
// read by the supervisor itself.
func (pt *ptable) record(h *holder) store.Holder {
	jd := h.judge()
	start, _ := jd.StartTime(h.sup.pid)
	return store.Holder{Host: h.sup.mc.name, BootID: h.sup.mc.bootID(pt.s), PidNS: h.sup.pidns, Pid: h.sup.pid, PidStart: start, Label: h.name}
}
