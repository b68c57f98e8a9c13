package sim

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// Clocks. The simulation's time is the store's clock: the boot-time clock
// of the store's host (machine 0), which judges every lease (docs/leases.md
// rule 5), whoever makes the call: the bbolt file is that host's (the
// design refuses network filesystems), so a supervisor elsewhere reaches
// it through that host, and its own clock never judges a lease. Each
// process reads its own host's clock, though: every process of one host
// reads the same CLOCK_BOOTTIME (a time namespace shifts only what
// proc.Boottime takes off again), while another host's boot clock has
// its own offset and runs at its own rate (fault "clock-drift"). A
// holder keeps its lease on its host's clock (gate/holder's Config.Now,
// renew.Lease), so its deadline arithmetic meets the store's across two
// clocks: the offset cancels (only differences count), the rate does
// not, and the margin must absorb it.
//
// A host may be suspended (fault "suspend"): its boot-time clock counts on,
// but CLOCK_MONOTONIC, and with it every Go timer, stops, and none of its
// processes runs. On resume each timer that was armed fires as late as
// the suspend was long; a supervisor whose job runs notices its lease's
// end at the latest at its Keeper's next watchdog tick (renew.Options
// Watchdog, a second after the resume), and its first act then is to
// find the lease lost (rule 6). Its job, suspended too, did nothing
// meanwhile: it runs beside the slot's next holder from the resume until
// its supervisor stops it (S31). The deadline timer stays late until an
// acknowledged renewal, a watchdog tick or Hold (the job's start) arms it
// again, so a lease whose local deadline
// comes after the resume is also found lost up to a watchdog period
// late: the job may outlive the lease's expiry in the store (local
// deadline + margin) when a second + margin/2 exceeds the margin, as with
// TTLs under 20 s (S31 bounds it; S9 and S30 give way to it).

// maxDriftPPM bounds how much faster or slower another host's boot clock
// runs than the store's host's, in millionths: 500 ppm, the most an
// NTP-disciplined clock may be slewed (ntpd's and chrony's limit), and
// far more than a crystal's error. The margin (TTL/10 here) absorbs it:
// over a lease of TTL the clocks part by TTL·500e-6, a two-hundredth of
// the margin. S9 allows exactly that drift, and S30 none at all.
const maxDriftPPM = 500

// watchdog is the Keeper's default watchdog period (renew.Options), which
// bounds how late a held lease's end is noticed after a resume.
const watchdog = time.Second

// A hostClock is one host's boot-time clock, read against the store's.
type hostClock struct {
	off time.Duration // its reading when the store's reads 0
	ppm int64         // how much faster it runs, in millionths (±maxDriftPPM)
	// asleepUntil is when the host resumes from a suspend, on the store's
	// clock (0: awake); slept is how long it was suspended in all, which
	// CLOCK_MONOTONIC does not count.
	asleepUntil time.Duration
	slept       time.Duration
	suspends    int
}

// boot is the host's boot-time clock when the store's reads t.
func (c *hostClock) boot(t time.Duration) time.Duration {
	return c.off + t + time.Duration(int64(t)*c.ppm/1e6)
}

// mono is CLOCK_MONOTONIC's reading then: boot time less the suspends.
func (c *hostClock) mono(t time.Duration) time.Duration { return c.boot(t) - c.slept }

// at is the store's reading at which the host's boot clock first reads l
// or more: when a timer set for l on the host is due.
func (c *hostClock) at(l time.Duration) time.Duration {
	if l >= never/2 {
		return never
	}
	if c.ppm == 0 {
		return l - c.off
	}
	t := time.Duration(float64(l-c.off) / (1 + float64(c.ppm)/1e6))
	for c.boot(t) < l {
		t++
	}
	for c.boot(t-1) >= l {
		t--
	}
	return t
}

// span is how long d on the host's clock lasts on the store's, rounded up.
func (c *hostClock) span(d time.Duration) time.Duration {
	return time.Duration((int64(d)*1e6 + 1e6 + c.ppm - 1) / (1e6 + c.ppm))
}

func (c *hostClock) asleep(t time.Duration) bool { return t < c.asleepUntil }

// newClocks draws the hosts' clocks: the store's host reads the store's
// clock; the others' boot clocks read anything from a minute to a month
// at the start and drift within maxDriftPPM. From a stream of their own,
// so that switching them off leaves a seed's other draws as they were.
// Only the bbolt store judges by a host's boot clock (PostgreSQL by its
// server's wall clock, which the simulation reads as its nanoseconds).
func (s *sim) newClocks() {
	s.clockRng = rand.New(rand.NewPCG(s.cfg.Seed, s.cfg.Seed^0xc10c4))
	_, bolt := s.be.(*Bolt)
	for _, mc := range s.pt.machines {
		mc.clk = &hostClock{}
		if mc.n == 0 || !s.cfg.Faults.Has(ClockDrift) || !bolt {
			continue
		}
		now := s.now().Mono
		mc.clk.ppm = s.clockRng.Int64N(2*maxDriftPPM+1) - maxDriftPPM
		mc.clk.off = time.Minute + time.Duration(s.clockRng.Int64N(int64(30*24*time.Hour))) - mc.clk.boot(now)
	}
}

// rebootClocks: every host boots again, its boot clock near zero.
func (s *sim) rebootClocks() {
	now := s.now().Mono
	for _, mc := range s.pt.machines {
		c := mc.clk
		c.asleepUntil, c.slept = 0, 0
		if c.off != 0 || c.ppm != 0 {
			c.off = 0
			c.off = time.Duration(5+s.clockRng.IntN(60))*time.Second - c.boot(now)
		}
	}
}

// hostNow is what h's process reads as its clock now (gate/holder's
// Config.Now): its host's boot-time clock, or, with
// mutation.MonotonicDeadline, CLOCK_MONOTONIC.
func (h *holder) hostNow() time.Duration {
	c := h.sup.mc.clk
	if h.s.cfg.Mutations.Has(mutation.MonotonicDeadline) { // mutation (test-only): the clock that stops in suspend (D4)
		return c.mono(h.s.now().Mono)
	}
	return c.boot(h.s.now().Mono)
}

// storeAt is the store's reading when h's clock reads l.
func (h *holder) storeAt(l time.Duration) time.Duration {
	if l >= never/2 {
		return never
	}
	c := h.sup.mc.clk
	if h.s.cfg.Mutations.Has(mutation.MonotonicDeadline) {
		return c.at(l + c.slept) // a later suspend makes it later still
	}
	return c.at(l)
}

// span is how long d on h's clock lasts on the store's.
func (h *holder) span(d time.Duration) time.Duration { return h.sup.mc.clk.span(d) }

// slack is how much later than d on the store's clock a span of d on h's
// clock may end: what a clock slower than the store's, within the bound,
// adds; nothing on the store's host.
func (h *holder) slack(d time.Duration) time.Duration {
	if h.sup.mc.clk.ppm >= 0 {
		return 0
	}
	return h.span(d) - d
}

// asleep: h's host is suspended now.
func (h *holder) asleep() bool { return h.sup != nil && h.sup.mc.clk.asleep(h.s.now().Mono) }

// suspendOne suspends one host other than the store's for up to 3 of the
// longest TTLs: its processes stop, and its timers with them.
func (s *sim) suspendOne() bool {
	r := s.clockRng
	mc := s.pt.machines[1+r.IntN(len(s.pt.machines)-1)]
	now := s.now().Mono
	if mc.clk.asleep(now) {
		return false
	}
	d := time.Duration(r.Int64N(int64(3*ttls[len(ttls)-1]))) + time.Second
	mc.clk.asleepUntil = now + d
	mc.clk.slept += d
	mc.clk.suspends++
	s.stats.Suspends++
	var who []string
	for _, h := range s.holders {
		if h.sup == nil || h.sup.mc != mc || !h.live() {
			continue
		}
		who = append(who, h.name)
		h.suspend(now, d)
	}
	s.tracef("host %d (%s) suspended for %v: %v stop, their timers with them", mc.n, mc.name, d, who)
	return true
}

// suspend: h's host sleeps from now for d. Every timer of its process is
// late by d (Go's timers count CLOCK_MONOTONIC); its job's processes do
// nothing meanwhile, so they end d later than they would have.
func (h *holder) suspend(now, d time.Duration) {
	if !h.s.cfg.Mutations.Has(mutation.MonotonicDeadline) { // on CLOCK_MONOTONIC the timers stop with the clock
		h.timerLate += d
		h.deadLate += d
		if h.nextRenew != 0 {
			h.nextRenew += d
		}
	}
	if ch := &h.child; ch.guardKill != 0 && ch.guardKill < never {
		// The guard's timers are Go's too, whatever the supervisor's
		// deadlines are kept on.
		ch.guardTerm, ch.guardKill = ch.guardTerm+d, ch.guardKill+d
	}
	h.watchAt = 0
	for _, p := range h.tree() {
		if p.end < never && p.end >= now {
			p.end += d
		}
	}
	if h.child.running && h.child.end >= now {
		h.child.end += d
	}
	h.wokeAt = now + d
}

// resumeActor resumes a suspended host when its suspend is over.
type resumeActor struct {
	s  *sim
	mc *machine
}

func (a resumeActor) wake() time.Duration { return a.mc.clk.asleepUntil }

// act: the host resumes. A supervisor whose job runs has its Keeper's
// watchdog tick within a second; one whose lease's local deadline passed
// while it slept must have its job gone within that and the stop on a lost
// lease after it (S31).
func (a resumeActor) act() {
	s := a.s
	now := s.now().Mono
	a.mc.clk.asleepUntil = 0
	for _, h := range s.holders {
		if h.sup == nil || h.sup.mc != a.mc || !h.live() || h.wokeAt == 0 {
			continue
		}
		if h.phase == hRun {
			h.watchAt = now + time.Duration(s.clockRng.Int64N(int64(watchdog)+1))
		}
		// One stopped (SIGSTOP) still is judged when it resumes (S24).
		h.resumedPast = !h.paused && h.child.running && s.m.pastLease(h, now)
		if h.resumedPast {
			s.stats.WokePast++
		}
	}
	s.tracef("host %d (%s) resumes", a.mc.n, a.mc.name)
}

// stopAfterWake bounds how long the job of a supervisor whose timers a
// suspend made late may run past its lease's local deadline or the resume,
// whichever is later: until the watchdog's tick, then the stop on a lost
// lease.
func (h *holder) stopAfterWake() time.Duration { return h.span(watchdog + h.stopAfterResume()) }

// late: h's timers may fire late for a suspend of its host: its Keeper's
// deadline timer was armed before it and not since (only an acknowledged
// renewal arms it again), or it resumed just now. Its job may then run past
// its local deadline until the watchdog's tick and the stop after it.
func (h *holder) late(now time.Duration) bool {
	return h.wokeAt != 0 && (h.deadLate > 0 || now <= h.wokeAt+h.stopAfterWake())
}

// wakeBound is when the job of a supervisor whose timers are late must be
// gone (S31). One stopped (SIGSTOP) over the resume checks its lease on
// SIGCONT: from then on.
func (h *holder) wakeBound() time.Duration {
	from := h.wokeAt
	if h.wasPaused {
		from = max(from, h.resumedAt)
	}
	return max(from, h.storeAt(h.lease.Deadline())) + h.stopAfterWake()
}

// sleptPast checks a job whose supervisor's timers a suspend made late
// (S31): gone within stopAfterWake of its lease's local deadline or of the
// resume, whichever is later.
func (m *model) sleptPast(h *holder, now Instant) {
	if !h.child.running || h.paused || !h.late(now.Mono) {
		return // one stopped (SIGSTOP) still is judged when it resumes (S24)
	}
	if b := h.wakeBound(); now.Mono > b {
		m.fail("S31", "%s's host resumed %v ago (its lease's local deadline %v ago) and its child still runs %v past its bound (the watchdog %v, then the kill grace %v cut to half the margin %v)",
			h.name, now.Mono-h.wokeAt, now.Mono-h.storeAt(h.lease.Deadline()), now.Mono-b, watchdog, h.grace, h.margin)
	}
}

// pastLease: h's lease is over by now on the store's clock (its ticket
// gone, not held, or past its deadline there), or h found it lost.
func (m *model) pastLease(h *holder, now time.Duration) bool {
	t := m.live[h.id]
	return h.lost || t == nil || t.state != store.Held || t.boot == m.s.now().Boot && t.dl <= now
}

// outlivesLease checks that a job whose supervisor runs is gone by its
// ticket's end on the store's clock (S30): the whole stop fits inside the
// lease there, whatever the holder's host's clock reads (its offset, and
// its rate within maxDriftPPM). Excused: a supervisor stopped (S24) or
// resumed from a suspend (S31) and still within its bound, and an
// operator's forced release.
func (m *model) outlivesLease(h *holder, now Instant) {
	if !h.child.running || h.stoppedAt(now.Mono) {
		return
	}
	if t := m.live[h.id]; t != nil {
		if t.state == store.Held && t.boot == now.Boot && now.Mono > t.dl && !m.setBackBy(t) {
			m.fail("S30", "%s's child runs %v past its ticket %s's deadline on the store's clock (its host's clock %v)", h.name, now.Mono-t.dl, short(h.id), h.sup.mc.clk)
		}
		return
	}
	if g, ok := m.gone[h.id]; ok && !g.force && now.Mono > g.at {
		m.fail("S30", "%s's child runs %v after its ticket %s was %s (its host's clock %v)", h.name, now.Mono-g.at, short(h.id), g.why, h.sup.mc.clk)
	}
}

func (c *hostClock) String() string {
	return fmt.Sprintf("off %v, %+d ppm", c.off, c.ppm)
}
