package sim

import (
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/store"
)

// The store's file replaced by an older copy (fault "restore"): an
// operator copies the file, as a backup tool does, under the store's lock
// (shared, a reader's: slotctl never leaves a half-written file to copy),
// and later renames the copy over the live file under running holders.
// The store then holds what it held at the copy: what was removed since is
// back (released, reaped, superseded tickets, each with its old deadline),
// what was made since is gone (tickets, tombstones, fences, counters,
// events, limit changes), and the tickets that were waiting then are
// waiting again. The model takes back the same (restoreTo): its own record
// as of the copy, the tickets made since removed as if force-released with
// the file (their jobs may run to their lease's end, S2), and the fences,
// counters and log the store has forgotten forgotten too (S8, S22: a fence
// may be issued twice across a restore, as across a deleted file).
//
// What must hold across it: a job whose ticket the copy lacks, or has
// waiting, learns it at its next renewal, which the store answers lost
// (and so removes a waiting ticket renewed as held, rather than admit it
// later with nobody behind it): it stops within the kill grace of that
// answer (S9) and by its lease's end at the latest (S2); a ticket the copy
// holds has the copy's older deadline, which its holder's next renewal
// puts right (S9 judges the holder's deadline against the store's again
// from then on); the copy's stale tickets leave by their deadlines
// through the reapers (L1, counted from the restore), so that no slot is
// lost for good; no live holder is reaped (S6); and nothing of a job runs
// past its lease (S2, S9, S26).
//
// The store's file cut short (fault "truncate"): an operator's copy that
// did not finish, a disk that lost the file's tail. The store must say so:
// every call answers store.ErrCorrupt (or, cut to nothing, sees an empty
// store), never a half-read state, and the model learns nothing from the
// refused calls (S12 is kept for errors outside such a window). After a
// while the operator deletes the file: from then on it is the store-lost
// case. A cut that took only the file's slack leaves a sound store, and
// nothing happens.

type restoreState struct {
	rng      *rand.Rand
	copyPath string        // the copy taken, not yet restored
	restorAt time.Duration // when it is renamed over the file
	boot     string        // the boot restorAt and cutUntil count in
	saved    *modelCopy    // the model as of the copy
	// setBack: the deadline a ticket had in the copy, for the tickets the
	// restore put back; S9 excuses a holder whose ticket still has it.
	setBack map[string]time.Duration
	// cutUntil: the file is cut short and answers ErrCorrupt until the
	// operator deletes it then; 0 when it is sound.
	cutUntil time.Duration
}

func newRestoreRng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x2e5702e)) }

// fileFault copies, restores or cuts the store's file now and then: a
// stream of its own, drawn only in runs with those faults on.
func (s *sim) fileFault() bool {
	if s.diskFull() {
		return true
	}
	if s.diskBroken() {
		return false
	}
	b, ok := s.be.(*Bolt)
	if !ok || !s.cfg.Faults.Has(Restore) && !s.cfg.Faults.Has(Truncate) {
		return false
	}
	rs := &s.rs
	if rs.rng == nil {
		rs.rng = newRestoreRng(s.cfg.Seed)
	}
	r := rs.rng.Float64()
	switch {
	case rs.cutUntil != 0:
		return false
	case rs.copyPath != "" && s.now().Mono >= s.due(rs.restorAt, rs.boot):
		return s.restoreCopy(b)
	case s.cfg.Faults.Has(Restore) && rs.copyPath == "" && r < 1.0/400:
		return s.copyFile(b)
	case s.cfg.Faults.Has(Truncate) && r >= 1-1.0/1500:
		return s.cutFile(b)
	}
	return false
}

// copyFile copies the store's file under its lock, shared, and notes the
// model as of now.
func (s *sim) copyFile(b *Bolt) bool {
	if _, err := os.Stat(b.path); err != nil {
		return false // nothing to copy yet
	}
	lk, err := os.OpenFile(b.path+".lock", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer lk.Close()
	if unix.Flock(int(lk.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil {
		return false // a stalled writer holds it: the backup tool waits, the next draw tries again
	}
	dst := b.path + ".backup"
	if err := copyFile(b.path, dst); errors.Is(err, unix.ENOSPC) {
		os.Remove(dst) // the disk is full: the backup fails, the next draw tries again
		return false
	} else if err != nil {
		s.fail("setup", "copy the store's file: %v", err)
		return true
	}
	rs := &s.rs
	rs.copyPath = dst
	rs.saved = s.m.save()
	// Long enough that jobs come and go; at times past every lease.
	rs.restorAt = s.now().Mono + time.Second/2 + time.Duration(rs.rng.Int64N(int64(3*ttls[len(ttls)-1]/2)))
	rs.boot = s.now().Boot
	s.stats.Copies++
	s.tracef("an operator copies the store's file (restored in %v)", rs.restorAt-s.now().Mono)
	return true
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// restoreCopy renames the copy over the store's file.
func (s *sim) restoreCopy(b *Bolt) bool {
	rs := &s.rs
	if err := os.Rename(rs.copyPath, b.path); err != nil {
		s.fail("setup", "restore the copy: %v", err)
		return true
	}
	s.stats.Restores++
	s.fileReplaced()
	s.tracef("an operator renames the copy over the store's file: the store is as it was %v ago", s.now().Mono-rs.saved.at)
	s.m.restoreTo(rs.saved)
	rs.copyPath, rs.saved = "", nil
	return true
}

// cutFile cuts the store's file short, at a random length below its size.
// Not while a stalled process holds the store's lock (store-lock): what the
// cut did is read back at once, and that read would wait for the lock.
func (s *sim) cutFile(b *Bolt) bool {
	fi, err := os.Stat(b.path)
	if _, held := s.lockHeld(); err != nil || fi.Size() < 2 || held {
		return false
	}
	rs := &s.rs
	n := rs.rng.Int64N(fi.Size())
	if err := os.Truncate(b.path, n); err != nil {
		s.fail("setup", "cut the store's file: %v", err)
		return true
	}
	s.stats.Truncates++
	defer s.fileReplaced()
	_, err = s.checker.Snapshot(s.ctx)
	switch {
	case err == nil:
		// Only slack went, or nothing at all (cut to nothing: an empty
		// store, the store-lost case at once).
		s.tracef("the store's file is cut from %d to %d bytes: the store still reads", fi.Size(), n)
		if n == 0 {
			s.stats.StoresLost++
			s.m.storeLost()
		}
	case errors.Is(err, store.ErrCorrupt):
		d := time.Second + time.Duration(rs.rng.Int64N(int64(truncatedMax-time.Second)))
		rs.cutUntil, rs.boot = s.now().Mono+d, s.now().Boot
		for id, g := range s.m.gone {
			g.forgot, g.sure = true, false // no call reads it now, and the file's deletion forgets it
			s.m.gone[id] = g
		}
		s.tracef("the store's file is cut from %d to %d bytes: corrupt, until an operator deletes it in %v", fi.Size(), n, d)
	default:
		s.fail("S12", "the store's file cut from %d to %d bytes: snapshot: %v, want store.ErrCorrupt", fi.Size(), n, err)
	}
	return true
}

// truncatedMax bounds how long a cut file stays: L1's bound is counted
// from each ticket's expiry, and a deleted file ends them all.
const truncatedMax = 15 * time.Second

type cutActor struct{ s *sim }

func (a cutActor) wake() time.Duration { return a.s.due(a.s.rs.cutUntil, a.s.rs.boot) }

// act: the operator deletes the cut file; the store starts afresh.
func (a cutActor) act() {
	s := a.s
	s.rs.cutUntil = 0
	s.tracef("an operator deletes the cut file")
	s.storeLost()
}

// fileActors are the actors of the file faults now pending.
func (s *sim) fileActors() []actor {
	var out []actor
	if s.disk.until != 0 {
		out = append(out, diskActor{s})
	}
	if s.rs.cutUntil != 0 {
		out = append(out, cutActor{s})
	}
	return out
}

// fileQuiet ends the file faults for the quiescent phase: the disk has
// room, a cut file is deleted, a pending copy is dropped.
func (s *sim) fileQuiet() {
	s.diskFreed()
	if s.rs.cutUntil != 0 {
		cutActor{s}.act()
	}
	if s.rs.copyPath != "" {
		os.Remove(s.rs.copyPath)
		s.rs.copyPath, s.rs.saved = "", nil
	}
}

// fileRefused reports whether a call failed on a file fault: the disk
// full (S45), or the file cut short (store.ErrCorrupt until it is
// deleted). Nothing ran.
func (s *sim) fileRefused(o *op) bool {
	if s.diskRefused(o) {
		return true
	}
	if s.rs.cutUntil != 0 && errors.Is(o.err, store.ErrCorrupt) {
		s.stats.CorruptRefused++
		if h := o.owner; h != nil && h.inside && o.kind == "get" && h.stopHeard && h.child.stopAt == 0 {
			// A stop request Run heard and could not read back is not
			// acted on, as behind a held lock (storelock.go's lockWait).
			h.stopHeard = false
		}
		return true
	}
	return false
}

// A modelCopy is the model's record of what the store held at a copy.
type modelCopy struct {
	at       time.Duration
	live     map[string]*mTicket
	refused  map[string]bool
	removals map[string]int
	maxFence uint64
	limits   map[string]*mLimit
}

func (t *mTicket) clone() *mTicket {
	c := *t
	c.limits = slices.Clone(t.limits)
	c.repl = slices.Clone(t.repl)
	c.slots = map[string][]int{}
	for k, v := range t.slots {
		c.slots[k] = slices.Clone(v)
	}
	return &c
}

func (m *model) save() *modelCopy {
	c := &modelCopy{at: m.s.now().Mono, live: map[string]*mTicket{}, refused: maps.Clone(m.refused),
		removals: maps.Clone(m.removals), maxFence: m.maxFence, limits: map[string]*mLimit{}}
	for id, t := range m.live {
		c.live[id] = t.clone()
	}
	for name, l := range m.limits {
		lc := *l
		lc.admits = slices.Clone(l.admits)
		c.limits[name] = &lc
	}
	return c
}

// restoreTo: the store's file is the copy c again. The tickets made since
// are gone with the file (as if force-released); the copy's are back as
// they were then, their deadlines and states the copy's (L1 counts from
// now); tombstones, fences, limits and counters are the copy's.
func (m *model) restoreTo(c *modelCopy) {
	now := m.s.now()
	for _, t := range m.sorted() {
		if c.live[t.id] == nil {
			m.remove(t, goneRec{why: "not in the restored copy", force: true, file: true})
		}
	}
	for id, g := range m.gone {
		g.sure = false // the store may have forgotten its successor
		if c.live[id] != nil {
			g.forgot = true
		}
		m.gone[id] = g
	}
	if m.s.rs.setBack == nil {
		m.s.rs.setBack = map[string]time.Duration{}
	}
	for id, ct := range c.live {
		t := ct.clone()
		t.keptAt = now.Mono
		if h := t.owner; h != nil && h.live() && t.state != store.Held {
			// Its job, if it runs (or what its command left), runs on a
			// ticket waiting again: as if force-released, until its next
			// renewal removes it (S2).
			m.gone[id] = goneRec{why: "waiting again in the restored copy", force: true, file: true, at: now.Mono}
		}
		m.live[id] = t
		m.s.rs.setBack[id] = t.dl
	}
	m.refused, m.removals = maps.Clone(c.refused), maps.Clone(c.removals)
	m.maxFence = c.maxFence
	m.limits = map[string]*mLimit{}
	for name, l := range c.limits {
		lc := *l
		lc.admits = slices.Clone(l.admits)
		m.limits[name] = &lc
	}
	m.counts = nil
}

// setBackBy: t still has the deadline a restored copy gave it, older than
// its holder's lease (S9 does not judge it until a renewal).
func (m *model) setBackBy(t *mTicket) bool {
	dl, ok := m.s.rs.setBack[t.id]
	return ok && dl == t.dl
}

// setBackGone: a ticket that leaves with the deadline or the state a
// restored copy gave it leaves as if force-released with the file: its
// holder's lease, not the copy's deadline, bounds its job (S2).
func (m *model) setBackGone(t *mTicket, g goneRec) goneRec {
	if m.setBackBy(t) && !g.file {
		// Nor is its holder told by its ticket's state what it is: a
		// supersede may remove a ticket its holder runs on (S16).
		g.force, g.file, g.sure = true, true, false
		g.why += " (its deadline set back by a restored copy)"
	}
	if prev, ok := m.gone[t.id]; ok && prev.file && !g.file {
		// Its id came back after the file lost it (a late duplicate of
		// its enqueue, as a new ticket): its holder's job still runs on
		// the lease of the ticket the file lost (S2).
		g.force, g.file, g.sure = true, true, false
		g.why += " (its id made again after the file lost it)"
	}
	return g
}

// lostWaiting checks a renewal that says held of a ticket the store has
// waiting, which nothing but a restored copy makes (S46): it is lost, and
// removes the ticket, so that its job stops and it is not admitted later
// with nobody behind it.
func (m *model) lostWaiting(o *op, t *mTicket) bool {
	if o.t.State != store.Held || t.state != store.Waiting {
		return false
	}
	if o.err == nil && !o.first {
		return false // a call before it in this step may have admitted it
	}
	if !errors.Is(o.err, store.ErrLost) {
		m.fail("S46", "renewal by %s of ticket %s, held by its holder, waiting in the store: %s, want lost", o.who, short(t.id), result(o.res, o.err))
		return true
	}
	m.s.stats.HeldNoMore++
	m.remove(t, goneRec{why: "renewed as held while waiting in the store", force: true, file: true})
	return true
}

// quietPast: t is a quiet waiter past its deadline, which SetChild judges
// as it judges any (only a restored copy puts the ticket of a job that
// runs back among the waiters).
func (m *model) quietPast(t *mTicket, now Instant) bool {
	return t.quiet && t.state == store.Waiting && t.boot == now.Boot && now.Mono >= t.dl
}
