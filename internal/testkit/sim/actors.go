package sim

import (
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// A reaper is `slotctl reap` from a timer: it scans (a dry run, what
// `slotctl reap --dry-run` prints), and reaps a while later. The correct
// store judges again inside the reaping transaction; the scan is a hint.
type reaper struct {
	s       *sim
	n       int
	c       *conn
	next    time.Duration // next scan
	scanned bool
	reapAt  time.Duration
}

func (r *reaper) wake() time.Duration {
	if r.scanned {
		return r.reapAt
	}
	return r.next
}

func (r *reaper) act() {
	s := r.s
	now := s.now().Mono
	if !r.scanned {
		list, err := r.c.Reap(s.ctx, store.ReapOptions{DryRun: true})
		r.scanned, r.reapAt = true, now+s.between(0, reapGapMax)
		s.tracef("reaper%d scans: %d expired %s", r.n, len(list), errString(err))
		return
	}
	list, err := r.c.Reap(s.ctx, store.ReapOptions{})
	r.scanned = false
	r.next = now + s.jitter(reapEvery)
	s.stats.Reaped += len(list)
	if s.cfg.Trace {
		var ids []string
		for _, x := range list {
			ids = append(ids, short(x.Ticket.ID)+" ("+x.Evidence+")")
		}
		s.tracef("reaper%d reaps %v %s", r.n, ids, errString(err))
	}
	r.replayed()
}

// replayed: now and then a reaper's sweep meets a record of a finished
// run that a member of the store wrote back (the file's owner can write
// anything, past any tombstone), and hands it to the judge.
func (r *reaper) replayed() {
	s := r.s
	if !s.judgeOn || len(s.records) == 0 || s.pt.rng.IntN(4) != 0 {
		return
	}
	t := s.records[s.pt.rng.IntN(len(s.records))]
	s.stats.Procs.Replays++
	why, dead := s.judge(t, true)
	s.tracef("reaper%d judges a replayed record of %s: dead=%v %s", r.n, short(t.ID), dead, why)
}

// crash: the reaper process dies; the timer starts a new one, which knows
// nothing of the old one's scan.
func (r *reaper) crash() {
	s := r.s
	r.scanned = false
	r.next = s.now().Mono + s.jitter(reapEvery)
	st, err := s.be.Open()
	if err != nil {
		s.fail("setup", "open: %v", err)
		return
	}
	r.c.st.Close()
	r.c.st = st
	s.tracef("reaper%d crashes; the timer starts a new one", r.n)
}

// The operator lists tickets and releases one by hand (after a while: what
// it read may be stale by then), and resizes or pauses limits. In the
// quiescent phase it puts every limit back to its size.
type operator struct {
	s        *sim
	c        *conn
	pending  *pendingRelease
	reopened bool // no rate is left closed by a step back of the wall clock (reopen)
}

type pendingRelease struct {
	at time.Duration
	t  store.Ticket
}

func (o *operator) wake() time.Duration {
	if o.pending != nil {
		return o.pending.at
	}
	return never
}

func (o *operator) act() {
	s := o.s
	p := o.pending
	o.pending = nil
	removed, err := o.c.Release(s.ctx, p.t, store.ForceReleased)
	s.tracef("operator releases %s (read %v ago): removed=%v %s", short(p.t.ID), s.now().Mono-(p.at), removed, errString(err))
}

// act1 is one operator action of the random phase; false if none applies.
func (o *operator) act1() bool {
	s := o.s
	rel, resize := s.cfg.Faults.Has(OpRelease) && o.pending == nil, s.cfg.Faults.Has(OpResize)
	switch {
	case rel && (!resize || s.chance(0.5)):
		snap, err := o.c.Snapshot(s.ctx)
		if err != nil || len(snap.Tickets) == 0 {
			s.tracef("operator lists tickets: %d %s", len(snap.Tickets), errString(err))
			return true
		}
		t := snap.Tickets[s.rng.IntN(len(snap.Tickets))]
		if h := s.byHolder(t.Holder); h != nil && h.live() && !s.chance(0.15) {
			// slotctl release refuses a provably alive holder without --force.
			s.tracef("operator would release %s of live %s: refused without --force", short(t.ID), h.name)
			return true
		}
		o.pending = &pendingRelease{at: s.now().Mono + s.between(0, 8*time.Second), t: t}
		s.tracef("operator picks %s (%s) to release", short(t.ID), t.State)
		return true
	case resize:
		l := s.limits[s.rng.IntN(len(s.limits))]
		n := s.rng.IntN(5)
		lim, err := o.c.SetLimit(s.ctx, l.name, n)
		s.tracef("operator sets %s to %d slots (held %d, waiting %d) %s", l.name, n, lim.Held, lim.Waiting, errString(err))
		return true
	}
	return false
}

// restore puts one limit back to its configured size, or clears a rate
// that a step back of the wall clock keeps closed (sched.go); false when
// there is nothing left to do.
func (o *operator) restore() bool {
	s := o.s
	for _, l := range s.limits {
		if ml := s.m.limits[l.name]; ml != nil && ml.slots != l.slots {
			lim, err := o.c.SetLimit(s.ctx, l.name, l.slots)
			s.tracef("operator restores %s to %d slots (held %d, waiting %d) %s", l.name, l.slots, lim.Held, lim.Waiting, errString(err))
			return true
		}
	}
	return o.reopen()
}

// reopen clears the rate of one limit whose window counts admissions
// ahead of the wall clock, after the clock stepped back: the window stays
// closed until the clock passes them, which may be hours. false when no
// rate is left so.
func (o *operator) reopen() bool {
	s := o.s
	if !s.sched || s.wallBacks == 0 || o.reopened {
		return false
	}
	snap, err := s.checker.Snapshot(s.ctx)
	if err != nil {
		s.fail("S12", "snapshot: %v", err)
		return false
	}
	for _, l := range snap.Limits {
		if l.Policy.Rate.N == 0 || !slices.ContainsFunc(l.Starts, func(t time.Time) bool { return t.After(snap.Now) }) {
			continue
		}
		none := store.Rate{}
		lim, err := o.c.SetPolicy(s.ctx, l.Name, store.PolicyChange{Rate: &none})
		s.tracef("operator clears %s's rate (its window counts admissions ahead of the wall clock): %s %s", l.Name, lim.Policy, errString(err))
		return true
	}
	o.reopened = true
	return false
}
