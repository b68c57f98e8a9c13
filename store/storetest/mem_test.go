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
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/storetest"
)

// memStore is a small in-memory reference Store for testing the suite itself:
// the correct version must pass every case, and each bug (a mutant) must make
// its case fail. bug names one deliberate defect; "" is the correct store.
type memStore struct {
	d   *memData
	bug string
}

type memData struct {
	mu      sync.Mutex
	now     time.Duration
	wall    time.Time
	limits  map[string]*memLimit
	tickets map[string]*memTicket
	tombs   map[string]bool
	fence   uint64
	bells   map[string]map[*memBell]bool
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

func (s *memStore) is(bug string) bool { return s.bug == bug }

func (d *memData) ring(id string) {
	for b := range d.bells[id] {
		select {
		case b.c <- struct{}{}:
		default:
		}
	}
}

func (d *memData) wallNow() time.Time { return d.wall.Add(d.now) }

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

func (d *memData) view(t *memTicket) store.Ticket {
	v := t.t
	v.Remaining = t.deadline - d.now
	v.Slot, v.Position = -1, 0
	if v.State == store.Held {
		v.Slot = t.t.Slot
		return v
	}
	_, waiting := d.inLimit(v.Limit)
	for i, w := range waiting {
		if w == t {
			v.Position = i + 1
		}
	}
	return v
}

func (s *memStore) remove(t *memTicket) {
	delete(s.d.tickets, t.t.ID)
	if !s.is("no-tombstone") {
		s.d.tombs[t.t.ID] = true
	}
	if l := s.d.limits[t.t.Limit]; l != nil && t.t.State == store.Held {
		l.used--
	}
	s.d.ring(t.t.ID)
}

func (s *memStore) sweep(limit string) {
	if s.is("no-sweep") || s.is("expired-not-counted") {
		return
	}
	held, waiting := s.d.inLimit(limit)
	for _, t := range append(held, waiting...) {
		if t.deadline <= s.d.now && !(s.is("sweep-held-only") && t.t.State == store.Waiting) {
			s.remove(t)
		}
	}
}

func (s *memStore) promote(l *memLimit) {
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
			if h.deadline > s.d.now {
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
	free := slots - n
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
		w.t.State, w.t.Slot, w.t.Admitted = store.Held, slot, s.d.wallNow()
		held = append(held, w)
		l.used++
		free--
		s.d.ring(w.t.ID)
	}
}

func (s *memStore) lax() bool { return s.is("lax-input") }

func (s *memStore) Enqueue(_ context.Context, r store.EnqueueRequest) (store.Ticket, error) {
	if !s.lax() {
		if r.ID == "" {
			return store.Ticket{}, fmt.Errorf("%w: empty id", store.ErrInvalid)
		}
		if err := store.CheckLimitName(r.Limit); err != nil {
			return store.Ticket{}, err
		}
		if err := store.CheckSlots(r.Slots); err != nil {
			return store.Ticket{}, err
		}
		if r.TTL <= 0 {
			return store.Ticket{}, fmt.Errorf("%w: ttl %v", store.ErrInvalid, r.TTL)
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.d.tombs[r.ID] {
		return store.Ticket{}, store.ErrRemoved
	}
	if t := s.d.tickets[r.ID]; t != nil {
		if !s.is("enqueue-dup") {
			return s.d.view(t), nil
		}
		delete(s.d.tickets, r.ID)
	}
	l := s.d.limits[r.Limit]
	switch {
	case l == nil:
		l = &memLimit{name: r.Limit, slots: r.Slots, created: s.d.wallNow()}
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
	t := &memTicket{deadline: s.d.now + r.TTL, t: store.Ticket{
		ID: r.ID, Limit: r.Limit, State: store.Waiting, Fence: fence, Slot: -1,
		TTL: r.TTL, Holder: h, Created: s.d.wallNow(),
	}}
	s.d.tickets[r.ID] = t
	s.sweep(r.Limit)
	s.promote(l)
	if s.d.tickets[r.ID] != t {
		return store.Ticket{}, fmt.Errorf("ticket %s vanished", r.ID)
	}
	return s.d.view(t), nil
}

func (s *memStore) Get(_ context.Context, id string) (store.Ticket, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[id]
	if t == nil {
		return store.Ticket{}, fmt.Errorf("%w: %s", store.ErrNotFound, id)
	}
	return s.d.view(t), nil
}

func (s *memStore) Renew(_ context.Context, tk store.Ticket, ttl time.Duration) (store.Ticket, error) {
	if ttl <= 0 && !s.lax() {
		return store.Ticket{}, fmt.Errorf("%w: ttl %v", store.ErrInvalid, ttl)
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	if t == nil {
		if !s.is("renew-resurrect") {
			return store.Ticket{}, fmt.Errorf("%w: %s is gone", store.ErrLost, tk.ID)
		}
		t = &memTicket{t: tk}
		t.t.State, t.t.Slot = store.Waiting, -1
		s.d.tickets[tk.ID] = t
	}
	if t.t.Fence != tk.Fence && !s.is("no-fence-check") {
		return store.Ticket{}, fmt.Errorf("%w: %s has another fence", store.ErrLost, tk.ID)
	}
	if t.deadline <= s.d.now && !s.is("renew-expired") {
		return store.Ticket{}, fmt.Errorf("%w: %s expired", store.ErrLost, tk.ID)
	}
	if !s.is("renew-noop") {
		t.deadline = s.d.now + ttl
	}
	t.t.Renewed = s.d.wallNow()
	return s.d.view(t), nil
}

func (s *memStore) Release(_ context.Context, tk store.Ticket, _ store.Reason) (bool, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	t := s.d.tickets[tk.ID]
	if t == nil || t.t.Fence != tk.Fence && !s.is("no-fence-check") {
		if l := s.d.limits[tk.Limit]; l != nil && s.is("counter") {
			l.used--
			s.promote(l)
		}
		return s.is("release-missing-true"), nil
	}
	s.remove(t)
	if l := s.d.limits[t.t.Limit]; l != nil {
		s.promote(l)
	}
	return true, nil
}

func (s *memStore) Snapshot(_ context.Context, limits ...string) (store.Snapshot, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	sn := store.Snapshot{Now: s.d.wallNow()}
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
			sn.Tickets = append(sn.Tickets, s.d.view(t))
		}
	}
	if s.is("snapshot-order") {
		slices.SortFunc(sn.Tickets, func(a, b store.Ticket) int { return int(a.Fence) - int(b.Fence) })
	}
	return sn, nil
}

func (s *memStore) SetLimit(_ context.Context, name string, slots int) (store.Limit, error) {
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
		l = &memLimit{name: name, created: s.d.wallNow()}
		s.d.limits[name] = l
	}
	l.slots = slots
	if s.is("shrink-evicts") {
		held, _ := s.d.inLimit(name)
		for i := len(held) - 1; i >= slots; i-- {
			s.remove(held[i])
		}
	}
	if !s.is("grow-no-promote") {
		s.promote(l)
	}
	held, waiting := s.d.inLimit(name)
	return store.Limit{Name: name, Slots: l.slots, Held: len(held), Waiting: len(waiting), Created: l.created}, nil
}

func (s *memStore) RemoveLimit(_ context.Context, name string, force bool) error {
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
			s.remove(t)
		}
	}
	delete(s.d.limits, name)
	return nil
}

func (s *memStore) Watch(_ context.Context, id string) (store.Bell, error) {
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
		s.d.tombs = map[string]bool{}
	case "reopen-resets-fence":
		s.d.fence = 0
	}
	return &memStore{d: s.d, bug: s.bug}
}

func memHarness(bug string) storetest.Harness {
	return storetest.Harness{
		TTL: 10 * time.Second,
		New: func(t *testing.T) storetest.Backend {
			d := &memData{
				now: time.Hour, wall: time.Now(),
				limits: map[string]*memLimit{}, tickets: map[string]*memTicket{},
				tombs: map[string]bool{}, bells: map[string]map[*memBell]bool{},
			}
			s := &memStore{d: d, bug: bug}
			return storetest.Backend{
				Store: s,
				Advance: func(dur time.Duration) {
					d.mu.Lock()
					defer d.mu.Unlock()
					d.now += dur
				},
				Reopen: s.reopen,
			}
		},
	}
}

const mutantEnv = "STORETEST_MUTANT"

// TestMemStore runs the suite against the reference store, or against the
// mutant named by $STORETEST_MUTANT (see TestMutants).
func TestMemStore(t *testing.T) {
	storetest.Run(t, memHarness(os.Getenv(mutantEnv)))
}

// mutants maps each deliberate bug to the cases that must catch it.
var mutants = map[string][]string{
	"resize-on-enqueue":       {"LimitCreatedOnceWithFirstSize"},
	"no-conflict":             {"SlotsConflict"},
	"lifo":                    {"FIFOPromotion"},
	"no-cap":                  {"HeldAtMostSlots"},
	"slot-count":              {"SlotIndexesUniqueLowestFirst"},
	"counter":                 {"DoubleReleaseFreesOneSlot"},
	"release-missing-true":    {"ReleaseMissingIsNoop"},
	"no-fence-check":          {"ReleaseWrongFenceRemovesNothing"},
	"renew-expired":           {"RenewExpiredIsLost"},
	"renew-noop":              {"RenewBeforeExpiryExtends"},
	"renew-resurrect":         {"RenewReleasedIsLost"},
	"no-tombstone":            {"RemovedIDCannotReturn"},
	"enqueue-dup":             {"EnqueueIdempotent"},
	"fence-per-limit":         {"FencesIncrease"},
	"no-sweep":                {"ExpiredHolderSweptByEnqueue"},
	"expired-not-counted":     {"ExpiredHolderSweptByEnqueue"},
	"sweep-held-only":         {"WaitersAreLeased"},
	"grow-no-promote":         {"Resize", "Pause"},
	"shrink-evicts":           {"Resize"},
	"shrink-admits":           {"Resize"},
	"pause-admits":            {"Pause"},
	"remove-inuse":            {"RemoveLimit"},
	"remove-leaves-tickets":   {"RemoveLimit"},
	"snapshot-order":          {"Snapshot"},
	"snapshot-filter-ignored": {"Snapshot"},
	"holder-lost":             {"GetTicket"},
	"silent-bell":             {"WatchRings"},
	"lax-input":               {"InvalidInput"},
	"reopen-loses-tombs":      {"Reopen"},
	"reopen-resets-fence":     {"Reopen"},
	"racy":                    {"Concurrent"},
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
