package storetest_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/storetest"
)

// memStore is a small in-memory reference Store for testing the suite itself:
// the correct version must pass every case, and each bug (a mutant) must make
// its case fail. bug names one deliberate defect; "" is the correct store.
// Several memStores may share one memData: a reopened store, or a handle whose
// clock reads skew ahead (another reaper).
type memStore struct {
	d    *memData
	bug  string
	skew time.Duration
	hint []store.Ticket // bugs "reap-trusts-scan", "reap-double-free": this handle's last dry-run scan

	closed atomic.Bool
}

// closedErr is the error of an operation after Close.
func (s *memStore) closedErr() error {
	if s.closed.Load() && !s.is("close-noop") {
		return fmt.Errorf("%w: mem://", store.ErrClosed)
	}
	return nil
}

func (s *memStore) Close() error {
	s.closed.Store(true)
	return nil
}

func (s *memStore) Cancel(ctx context.Context, tk store.Ticket) (bool, error) {
	switch {
	case s.is("cancel-as-released"):
		return s.Release(ctx, tk, store.Released)
	case s.is("cancel-waiting-only"):
		if err := s.closedErr(); err != nil {
			return false, err
		}
		s.d.mu.Lock()
		t := s.d.tickets[tk.ID]
		held := t != nil && t.t.State == store.Held
		s.d.mu.Unlock()
		if held {
			return false, nil // "promoted meanwhile": left to its lease
		}
	case s.is("cancel-missing-frees"):
		s.d.mu.Lock()
		t, l := s.d.tickets[tk.ID], s.d.limits[tk.Limit]
		if t == nil && l != nil {
			s.promote(l, 1)
		}
		s.d.mu.Unlock()
	}
	return s.Release(ctx, tk, store.Cancelled)
}

type memData struct {
	mu      sync.Mutex
	now     time.Duration
	wall    time.Time
	limits  map[string]*memLimit
	tickets map[string]*memTicket
	tombs   map[string]store.Reason
	fence   uint64
	bells   map[string]map[*memBell]bool
	judge   store.Judge
	events  []store.Event // the newest store.MaxEvents, oldest first
	seq     uint64        // last event sequence number
}

type memLimit struct {
	name    string
	slots   int
	created time.Time
	used    int    // bug "counter": a counter beside the tickets
	fence   uint64 // bug "fence-per-limit"
}

type memTicket struct {
	t        store.Ticket
	deadline time.Duration
}

type memBell struct {
	c  chan struct{}
	d  *memData
	id string
}

func (b *memBell) C() <-chan struct{} { return b.c }
func (b *memBell) Close() error {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	delete(b.d.bells[b.id], b)
	return nil
}

// staleWindow is how long the racy mutants act on a read after dropping the lock.
const staleWindow = 5 * time.Millisecond

func (s *memStore) is(bug string) bool { return s.bug == bug }

// now is this handle's reading of the store's clock.
func (s *memStore) now() time.Duration { return s.d.now + s.skew }

func (s *memStore) wallNow() time.Time { return s.d.wall.Add(s.now()) }

func (d *memData) ring(id string) {
	for b := range d.bells[id] {
		select {
		case b.c <- struct{}{}:
		default:
		}
	}
}

// inLimit returns the limit's holders and waiters, each in fence order.
func (d *memData) inLimit(limit string) (held, waiting []*memTicket) {
	for _, t := range d.tickets {
		if t.t.Limit != limit {
			continue
		}
		if t.t.State == store.Held {
			held = append(held, t)
		} else {
			waiting = append(waiting, t)
		}
	}
	byFence := func(a, b *memTicket) int { return int(a.t.Fence) - int(b.t.Fence) }
	slices.SortFunc(held, byFence)
	slices.SortFunc(waiting, byFence)
	return held, waiting
}

func (s *memStore) view(t *memTicket) store.Ticket {
	v := t.t
	v.Remaining = t.deadline - s.now()
	v.Slot, v.Position = -1, 0
	if v.State == store.Held {
		v.Slot = t.t.Slot
		return v
	}
	_, waiting := s.d.inLimit(v.Limit)
	for i, w := range waiting {
		if w == t {
			v.Position = i + 1
		}
	}
	return v
}

// event appends to the log, which keeps the newest store.MaxEvents.
func (s *memStore) event(kind string, t store.Ticket, evidence string) {
	s.d.seq++
	e := store.Event{Seq: s.d.seq, Time: s.wallNow(), Kind: kind, Limit: t.Limit, Ticket: t.ID, Fence: t.Fence,
		Slot: t.Slot, Host: t.Holder.Host, Pid: t.Holder.Pid, User: t.Holder.User, Command: t.Holder.Command(), Evidence: evidence}
	if len(s.d.events) >= store.MaxEvents {
		s.d.events = s.d.events[len(s.d.events)-store.MaxEvents+1:]
	}
	s.d.events = append(s.d.events, e)
}

// remove deletes a live ticket, tombstones its id and logs why.
func (s *memStore) remove(t *memTicket, why store.Reason, evidence string) {
	v := s.view(t)
	delete(s.d.tickets, t.t.ID)
	if !s.is("no-tombstone") {
		s.d.tombs[t.t.ID] = why
	}
	if l := s.d.limits[t.t.Limit]; l != nil && t.t.State == store.Held {
		l.used--
	}
	s.event(string(why), v, evidence)
	s.d.ring(t.t.ID)
}

// verdict judges a ticket by this handle's clock and, if withDeath, by the
// judge, which may act (stop an orphaned job) unless this is a dry run.
func (s *memStore) verdict(t *memTicket, withDeath, act bool) (string, bool) {
	if late := s.now() - t.deadline; late >= 0 {
		return fmt.Sprintf("expired %v ago", late), true
	}
	if withDeath && s.d.judge != nil {
		ev, dead := s.d.judge(s.view(t), act)
		if dead || s.is("judge-verdict-ignored") {
			return ev, true
		}
	}
	return "", false
}

// sweep removes the limit's expired and proven-dead tickets (Enqueue's sweep).
func (s *memStore) sweep(limit string) {
	if s.is("no-sweep") || s.is("expired-not-counted") {
		return
	}
	held, waiting := s.d.inLimit(limit)
	for _, t := range append(held, waiting...) {
		if s.is("sweep-held-only") && t.t.State == store.Waiting {
			continue
		}
		if ev, gone := s.verdict(t, !s.is("admission-ignores-judge"), true); gone {
			s.remove(t, store.Reaped, ev)
		}
	}
}

// promote admits waiters while fewer than slots are held; extra is capacity a
// buggy store believes was freed.
func (s *memStore) promote(l *memLimit, extra int) {
	held, waiting := s.d.inLimit(l.name)
	n := len(held)
	switch {
	case s.is("counter"):
		n = l.used
	case s.is("shrink-admits"):
		n = 0
		for _, h := range held {
			if h.t.Slot < l.slots {
				n++
			}
		}
	case s.is("expired-not-counted"):
		n = 0
		for _, h := range held {
			if h.deadline > s.now() {
				n++
			}
		}
	}
	slots := l.slots
	if s.is("pause-admits") && slots == 0 {
		slots = 1
	}
	if s.is("no-cap") {
		slots++
	}
	if s.is("lifo") {
		slices.Reverse(waiting)
	}
	free := slots + extra - n
	if s.is("racy") && free > 0 {
		// Decide on a stale count: the check and the promotion are two steps.
		s.d.mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		s.d.mu.Lock()
		held, waiting = s.d.inLimit(l.name)
		if s.d.limits[l.name] != l {
			return
		}
	}
	for _, w := range waiting {
		if free <= 0 {
			break
		}
		used := map[int]bool{}
		for _, h := range held {
			used[h.t.Slot] = true
		}
		slot := 0
		if s.is("slot-count") {
			slot = len(held)
		} else {
			for used[slot] {
				slot++
			}
		}
		w.t.State, w.t.Slot, w.t.Admitted = store.Held, slot, s.wallNow()
		held = append(held, w)
		l.used++
		free--
		s.event("admitted", s.view(w), "")
		s.d.ring(w.t.ID)
	}
}

func (s *memStore) lax() bool { return s.is("lax-input") }

func (s *memStore) Enqueue(_ context.Context, r store.EnqueueRequest) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	if !s.lax() {
		if err := r.Check(); err != nil {
			return store.Ticket{}, err
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if _, removed := s.d.tombs[r.ID]; removed {
		return store.Ticket{}, store.ErrRemoved
	}
	if t := s.d.tickets[r.ID]; t != nil {
		if !s.is("enqueue-dup") {
			return s.view(t), nil
		}
		delete(s.d.tickets, r.ID)
	}
	l := s.d.limits[r.Limit]
	switch {
	case l == nil:
		l = &memLimit{name: r.Limit, slots: r.Slots, created: s.wallNow()}
		s.d.limits[r.Limit] = l
	case r.CheckSlots && l.slots != r.Slots && !s.is("no-conflict"):
		return store.Ticket{}, &store.SlotsConflictError{Limit: r.Limit, Have: l.slots, Want: r.Slots}
	case s.is("resize-on-enqueue"):
		l.slots = r.Slots
	}
	s.d.fence++
	fence := s.d.fence
	if s.is("fence-per-limit") {
		l.fence++
		fence = l.fence
	}
	h := r.Holder
	if s.is("holder-lost") {
		h = store.Holder{Host: h.Host}
	}
	t := &memTicket{deadline: s.now() + r.TTL, t: store.Ticket{
		ID: r.ID, Limit: r.Limit, State: store.Waiting, Fence: fence, Slot: -1,
		TTL: r.TTL, Holder: h, Created: s.wallNow(),
	}}
	s.d.tickets[r.ID] = t
	s.sweep(r.Limit)
	s.promote(l, 0)
	if s.d.tickets[r.ID] != t {
		return store.Ticket{}, fmt.Errorf("ticket %s vanished", r.ID)
	}
	return s.view(t), nil
}

func (s *memStore) Get(_ context.Context, id string) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[id]
	if t == nil {
		return store.Ticket{}, fmt.Errorf("%w: %s", store.ErrNotFound, id)
	}
	return s.view(t), nil
}

func (s *memStore) Renew(_ context.Context, tk store.Ticket, ttl time.Duration) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	if ttl <= 0 && !s.lax() {
		return store.Ticket{}, fmt.Errorf("%w: ttl %v", store.ErrInvalid, ttl)
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	if t == nil {
		why := s.d.tombs[tk.ID]
		switch {
		case s.is("renew-resurrect"):
			t = &memTicket{t: tk}
			t.t.State, t.t.Slot = store.Waiting, -1
		case s.is("renew-resurrect-released") && why == store.Released,
			s.is("renew-resurrect-reaped") && why == store.Reaped:
			// A late write puts the ticket back as its holder last saw it.
			t = &memTicket{t: tk, deadline: s.now() + ttl}
		default:
			return store.Ticket{}, fmt.Errorf("%w: %s is gone", store.ErrLost, tk.ID)
		}
		s.d.tickets[tk.ID] = t
	}
	if t.t.Fence != tk.Fence && !s.is("no-fence-check") {
		return store.Ticket{}, fmt.Errorf("%w: %s has another fence", store.ErrLost, tk.ID)
	}
	if t.deadline <= s.now() && !s.is("renew-expired") {
		return store.Ticket{}, fmt.Errorf("%w: %s expired", store.ErrLost, tk.ID)
	}
	if !s.is("renew-noop") {
		t.deadline = s.now() + ttl
	}
	t.t.Renewed = s.wallNow()
	return s.view(t), nil
}

func (s *memStore) Release(_ context.Context, tk store.Ticket, why store.Reason) (bool, error) {
	if err := s.closedErr(); err != nil {
		return false, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	match := t != nil && (tk.Fence == 0 || t.t.Fence == tk.Fence || s.is("no-fence-check"))
	if match && s.is("release-stale-read") {
		// Read present, act later: by then a reaper may have removed it.
		s.d.mu.Unlock()
		time.Sleep(staleWindow)
		s.d.mu.Lock()
		if s.d.tickets[tk.ID] != t {
			if l := s.d.limits[tk.Limit]; l != nil {
				s.promote(l, 1) // frees the slot it read as held
			}
			return true, nil
		}
	}
	if !match {
		if t == nil {
			if _, removed := s.d.tombs[tk.ID]; !removed && !s.is("no-tombstone") {
				s.d.tombs[tk.ID] = why // cancel before create
			}
			if why == store.Lost && tk.Limit != "" && !s.is("lost-not-logged") {
				s.event(string(store.Lost), tk, "holder presumed its lease lost")
			}
		}
		if l := s.d.limits[tk.Limit]; l != nil {
			switch {
			case s.is("counter"):
				l.used--
				s.promote(l, 0)
			case s.is("release-missing-frees") && t == nil:
				s.promote(l, 1) // the fallback decrement of a missing lease
			}
		}
		return s.is("release-missing-true"), nil
	}
	s.remove(t, why, "")
	if l := s.d.limits[t.t.Limit]; l != nil {
		s.promote(l, 0)
	}
	return true, nil
}

func (s *memStore) SetChild(_ context.Context, tk store.Ticket, pgid int, pgidStart uint64) (store.Ticket, error) {
	if err := s.closedErr(); err != nil {
		return store.Ticket{}, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	if t == nil || t.t.Fence != tk.Fence {
		if s.is("setchild-gone-ok") {
			tk.Holder.Pgid, tk.Holder.PgidStart = pgid, pgidStart
			return tk, nil
		}
		return store.Ticket{}, fmt.Errorf("%w: %s is gone", store.ErrLost, tk.ID)
	}
	if s.is("setchild-not-stored") {
		v := s.view(t)
		v.Holder.Pgid, v.Holder.PgidStart = pgid, pgidStart
		return v, nil
	}
	t.t.Holder.Pgid, t.t.Holder.PgidStart = pgid, pgidStart
	if s.is("setchild-renews") {
		t.deadline = s.now() + t.t.TTL
	}
	return s.view(t), nil
}

// reapNames returns the limits a Reap covers: all when none are named.
func (s *memStore) reapNames(limits []string) ([]string, error) {
	var names []string
	if len(limits) == 0 || s.is("reap-ignores-names") {
		for n := range s.d.limits {
			names = append(names, n)
		}
		slices.Sort(names)
		return names, nil
	}
	for _, n := range limits {
		if s.d.limits[n] == nil {
			if s.is("reap-unknown-ok") {
				continue
			}
			return nil, fmt.Errorf("%w: %s", store.ErrLimitNotFound, n)
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names, nil
}

func (s *memStore) removal(v store.Ticket, evidence string) store.Removal {
	if s.is("reap-no-evidence") {
		evidence = ""
	}
	return store.Removal{Ticket: v, Reason: store.Reaped, Evidence: evidence}
}

// scan lists the tickets of names a reap would remove now.
func (s *memStore) scan(names []string) []store.Removal {
	var out []store.Removal
	for _, n := range names {
		held, waiting := s.d.inLimit(n)
		for _, t := range append(held, waiting...) {
			if s.is("reap-dryrun-held-only") && t.t.State == store.Waiting {
				continue
			}
			if ev, gone := s.verdict(t, !s.is("judge-ignored"), s.is("dryrun-acts")); gone {
				out = append(out, s.removal(s.view(t), ev))
			}
		}
	}
	return out
}

func (s *memStore) Reap(_ context.Context, o store.ReapOptions) ([]store.Removal, error) {
	dryRun, limits := o.DryRun, o.Limits
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	if !s.lax() {
		for _, l := range limits {
			if err := store.CheckLimitName(l); err != nil {
				return nil, err
			}
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	names, err := s.reapNames(limits)
	if err != nil {
		return nil, err
	}
	out := []store.Removal{}
	if s.is("reap-dryrun-removes") {
		dryRun = false
	}
	if dryRun {
		out = append(out, s.scan(names)...)
		s.hint = nil
		for _, r := range out {
			s.hint = append(s.hint, r.Ticket)
		}
		return out, nil
	}
	hint := s.hint
	s.hint = nil
	switch {
	case s.is("reap-trusts-scan"):
		// The scan decides: what it listed goes, renewed since or not.
		for _, v := range hint {
			if t := s.d.tickets[v.ID]; t != nil && slices.Contains(names, t.t.Limit) {
				out = append(out, s.removal(s.view(t), "listed by a scan"))
				s.remove(t, store.Reaped, "listed by a scan")
			}
		}
	case s.is("reap-double-free"):
		// Act on a read made earlier: remove what is still there, and free
		// a slot for every ticket read, removed by someone else or not.
		if hint == nil {
			for _, r := range s.scan(names) {
				hint = append(hint, r.Ticket)
			}
			s.d.mu.Unlock()
			time.Sleep(staleWindow)
			s.d.mu.Lock()
		}
		for _, v := range hint {
			extra := 1
			if t := s.d.tickets[v.ID]; t != nil {
				s.remove(t, store.Reaped, "expired")
				extra = 0
			}
			out = append(out, s.removal(v, "expired"))
			if l := s.d.limits[v.Limit]; l != nil {
				s.promote(l, extra)
			}
		}
		return out, nil
	}
	for _, n := range names {
		held, waiting := s.d.inLimit(n)
		for _, t := range append(held, waiting...) {
			if ev, gone := s.verdict(t, !s.is("judge-ignored"), true); gone {
				out = append(out, s.removal(s.view(t), ev))
				s.remove(t, store.Reaped, ev)
			}
		}
		if l := s.d.limits[n]; l != nil && !s.is("reap-no-promote") {
			s.promote(l, 0)
		}
	}
	return out, nil
}

func (s *memStore) Events(_ context.Context, limit string, n int) ([]store.Event, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	if limit != "" && !s.lax() {
		if err := store.CheckLimitName(limit); err != nil {
			return nil, err
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	out := []store.Event{}
	match := func(e store.Event) bool { return limit == "" || e.Limit == limit || s.is("events-unfiltered") }
	if s.is("events-oldest") {
		for _, e := range s.d.events {
			if len(out) < n && match(e) {
				out = append(out, e)
			}
		}
		return out, nil
	}
	for i := len(s.d.events) - 1; i >= 0 && len(out) < n; i-- {
		if match(s.d.events[i]) {
			out = append(out, s.d.events[i])
		}
	}
	if !s.is("events-newest-first") {
		slices.Reverse(out)
	}
	return out, nil
}

func (s *memStore) Snapshot(_ context.Context, limits ...string) (store.Snapshot, error) {
	if err := s.closedErr(); err != nil {
		return store.Snapshot{}, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	sn := store.Snapshot{Now: s.wallNow()}
	var names []string
	if len(limits) == 0 || s.is("snapshot-filter-ignored") {
		for n := range s.d.limits {
			names = append(names, n)
		}
	} else {
		for _, n := range limits {
			if s.d.limits[n] != nil && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	for _, n := range names {
		l := s.d.limits[n]
		held, waiting := s.d.inLimit(n)
		sn.Limits = append(sn.Limits, store.Limit{Name: n, Slots: l.slots, Held: len(held), Waiting: len(waiting), Created: l.created})
		for _, t := range append(held, waiting...) {
			sn.Tickets = append(sn.Tickets, s.view(t))
		}
	}
	if s.is("snapshot-order") {
		slices.SortFunc(sn.Tickets, func(a, b store.Ticket) int { return int(a.Fence) - int(b.Fence) })
	}
	return sn, nil
}

func (s *memStore) SetLimit(_ context.Context, name string, slots int) (store.Limit, error) {
	if err := s.closedErr(); err != nil {
		return store.Limit{}, err
	}
	if !s.lax() {
		if err := store.CheckLimitName(name); err != nil {
			return store.Limit{}, err
		}
		if err := store.CheckSlots(slots); err != nil {
			return store.Limit{}, err
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	l := s.d.limits[name]
	if l == nil {
		l = &memLimit{name: name, created: s.wallNow()}
		s.d.limits[name] = l
	}
	l.slots = slots
	if s.is("shrink-evicts") {
		held, _ := s.d.inLimit(name)
		for i := len(held) - 1; i >= slots; i-- {
			s.remove(held[i], store.ForceReleased, "limit shrunk")
		}
	}
	if !s.is("grow-no-promote") {
		s.promote(l, 0)
	}
	held, waiting := s.d.inLimit(name)
	return store.Limit{Name: name, Slots: l.slots, Held: len(held), Waiting: len(waiting), Created: l.created}, nil
}

func (s *memStore) RemoveLimit(_ context.Context, name string, force bool) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	if err := store.CheckLimitName(name); err != nil && !s.lax() {
		return err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.d.limits[name] == nil {
		return fmt.Errorf("%w: %s", store.ErrLimitNotFound, name)
	}
	held, waiting := s.d.inLimit(name)
	if len(held)+len(waiting) > 0 && !force && !s.is("remove-inuse") {
		return fmt.Errorf("%w: %s", store.ErrLimitInUse, name)
	}
	if !s.is("remove-leaves-tickets") {
		for _, t := range append(held, waiting...) {
			s.remove(t, store.ForceReleased, "limit removed")
		}
	}
	delete(s.d.limits, name)
	return nil
}

func (s *memStore) Watch(_ context.Context, id string) (store.Bell, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	b := &memBell{c: make(chan struct{}, 1), d: s.d, id: id}
	if s.is("silent-bell") {
		return b, nil
	}
	if s.d.bells[id] == nil {
		s.d.bells[id] = map[*memBell]bool{}
	}
	s.d.bells[id][b] = true
	return b, nil
}

func (s *memStore) String() string { return "mem://" }

// reopen is a restart: the data stays, except what a buggy store loses.
func (s *memStore) reopen() store.Store {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	switch s.bug {
	case "reopen-loses-tombs":
		s.d.tombs = map[string]store.Reason{}
	case "reopen-resets-fence":
		s.d.fence = 0
	}
	return &memStore{d: s.d, bug: s.bug}
}

func newMem(bug string, j store.Judge) (*memStore, storetest.Backend) {
	d := &memData{
		now: time.Hour, wall: time.Now(),
		limits: map[string]*memLimit{}, tickets: map[string]*memTicket{},
		tombs: map[string]store.Reason{}, bells: map[string]map[*memBell]bool{},
		judge: j,
	}
	s := &memStore{d: d, bug: bug}
	return s, storetest.Backend{
		Store: s,
		Advance: func(dur time.Duration) {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.now += dur
		},
		Reopen: s.reopen,
		Skewed: func(skew time.Duration) store.Store { return &memStore{d: d, bug: bug, skew: skew} },
	}
}

func memHarness(bug string) storetest.Harness {
	return storetest.Harness{
		TTL: 10 * time.Second,
		New: func(t *testing.T) storetest.Backend {
			_, b := newMem(bug, nil)
			return b
		},
		NewWithJudge: func(t *testing.T, j store.Judge) storetest.Backend {
			_, b := newMem(bug, j)
			return b
		},
	}
}

const mutantEnv = "STORETEST_MUTANT"

// TestMemStore runs the suite against the reference store, or against the
// mutant named by $STORETEST_MUTANT (see TestMutants).
func TestMemStore(t *testing.T) {
	storetest.Run(t, memHarness(os.Getenv(mutantEnv)))
}

// TestMemEventsBounded checks the reference store's event log keeps the
// newest store.MaxEvents (too many writes for the shared suite).
func TestMemEventsBounded(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("running as a mutant")
	}
	s, _ := newMem("", nil)
	ctx := t.Context()
	const pairs = store.MaxEvents/2 + 20
	for i := range pairs {
		tk, err := s.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("t%d", i), Limit: "q", Slots: 1, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Release(ctx, tk, store.Released); !ok || err != nil {
			t.Fatalf("Release %s = %v, %v", tk.ID, ok, err)
		}
	}
	for _, limit := range []string{"", "q"} {
		ev, err := s.Events(ctx, limit, 2*store.MaxEvents)
		if err != nil {
			t.Fatal(err)
		}
		if len(ev) != store.MaxEvents {
			t.Fatalf("Events(%q, %d): %d events after %d were logged, want the newest %d", limit, 2*store.MaxEvents, len(ev), 2*pairs, store.MaxEvents)
		}
		if first, last := ev[0].Seq, ev[len(ev)-1].Seq; last != 2*pairs || first != last-store.MaxEvents+1 {
			t.Fatalf("Events(%q): seq %d..%d, want %d..%d", limit, first, last, 2*pairs-store.MaxEvents+1, 2*pairs)
		}
	}
	if len(s.d.events) > store.MaxEvents {
		t.Fatalf("the log holds %d events, more than %d", len(s.d.events), store.MaxEvents)
	}
}

// mutants maps each deliberate bug to the cases that must catch it.
var mutants = map[string][]string{
	"resize-on-enqueue":        {"LimitCreatedOnceWithFirstSize"},
	"no-conflict":              {"SlotsConflict"},
	"lifo":                     {"FIFOPromotion"},
	"no-cap":                   {"HeldAtMostSlots"},
	"slot-count":               {"SlotIndexesUniqueLowestFirst"},
	"counter":                  {"DoubleReleaseFreesOneSlot", "ReleaseAfterReap"},
	"release-missing-true":     {"ReleaseMissingIsNoop"},
	"no-fence-check":           {"ReleaseWrongFenceRemovesNothing"},
	"renew-expired":            {"RenewExpiredIsLost"},
	"renew-noop":               {"RenewBeforeExpiryExtends"},
	"renew-resurrect":          {"RenewReleasedIsLost", "LateRenewAfterRelease", "LateRenewAfterReap"},
	"no-tombstone":             {"RemovedIDCannotReturn"},
	"enqueue-dup":              {"EnqueueIdempotent"},
	"fence-per-limit":          {"FencesIncrease"},
	"no-sweep":                 {"ExpiredHolderSweptByEnqueue"},
	"expired-not-counted":      {"ExpiredHolderSweptByEnqueue"},
	"sweep-held-only":          {"WaitersAreLeased"},
	"grow-no-promote":          {"Resize", "Pause"},
	"shrink-evicts":            {"Resize"},
	"shrink-admits":            {"Resize"},
	"pause-admits":             {"Pause"},
	"remove-inuse":             {"RemoveLimit"},
	"remove-leaves-tickets":    {"RemoveLimit"},
	"snapshot-order":           {"Snapshot"},
	"snapshot-filter-ignored":  {"Snapshot"},
	"holder-lost":              {"GetTicket"},
	"silent-bell":              {"WatchRings"},
	"lax-input":                {"InvalidInput"},
	"reopen-loses-tombs":       {"Reopen"},
	"reopen-resets-fence":      {"Reopen"},
	"racy":                     {"Concurrent"},
	"reap-trusts-scan":         {"RenewAfterScanWins"},
	"reap-double-free":         {"TwoReapersFreeOnce"},
	"release-stale-read":       {"ReleaseRacingReap"},
	"release-missing-frees":    {"ReleaseAfterReap"},
	"lost-not-logged":          {"ReleaseAfterReap"},
	"renew-resurrect-released": {"LateRenewAfterRelease"},
	"renew-resurrect-reaped":   {"LateRenewAfterReap"},
	"reap-ignores-names":       {"ReapNamedLimitsOnly"},
	"reap-unknown-ok":          {"ReapNamedLimitsOnly"},
	"reap-dryrun-removes":      {"ReapDryRunMatchesReap"},
	"reap-dryrun-held-only":    {"ReapDryRunMatchesReap"},
	"reap-no-promote":          {"ReapFreesAndPromotes"},
	"reap-no-evidence":         {"ReapFreesAndPromotes"},
	"judge-ignored":            {"DeadHolderReapedAtOnce"},
	"dryrun-acts":              {"DeadHolderReapedAtOnce"},
	"admission-ignores-judge":  {"DeadHolderSweptOnAdmission"},
	"judge-verdict-ignored":    {"LiveHolderKeptUntilTTL"},
	"setchild-not-stored":      {"SetChild"},
	"setchild-renews":          {"SetChild"},
	"setchild-gone-ok":         {"SetChild"},
	"events-newest-first":      {"Events"},
	"events-unfiltered":        {"Events"},
	"events-oldest":            {"Events"},
	"cancel-as-released":       {"CancelWaiting", "CancelPromoted"},
	"cancel-waiting-only":      {"CancelPromoted"},
	"cancel-missing-frees":     {"CancelWaiting", "CancelPromoted"},
	"close-noop":               {"Close"},
}

// TestMutants shows that the suite is not vacuous: each bug, planted in the
// reference store, makes the cases that target it fail.
func TestMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("running as a mutant")
	}
	if testing.Short() {
		t.Skip("runs the suite once per mutant")
	}
	for bug, want := range mutants {
		t.Run(bug, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestMemStore$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+bug)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passes on a store with bug %q", bug)
			}
			for _, c := range want {
				if !strings.Contains(string(out), "--- FAIL: TestMemStore/"+c+" ") {
					t.Errorf("bug %q: case %s did not fail; output:\n%s", bug, c, out)
				}
			}
		})
	}
}
