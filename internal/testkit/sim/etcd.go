package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
)

// Etcd is the etcd store on a real server, one key prefix per run. The
// server expires leases by its own clock, which nothing here can drive, so
// the simulation's clock follows real time: Advance sleeps. A step still
// happens at one instant: the clock moves only in Advance, by exactly what
// the scheduler asked, so that timers fire exactly when it says (a clock
// that jumped to the real time after each sleep would be late for them by
// the sleep's overshoot). Real time runs ahead of it meanwhile, by what the
// steps since the last sleep took and the sleep's overshoot (Lag): the
// server may expire a lease up to that much before the simulation's clock
// reaches its end, and its readings of the time are that much ahead (see
// slack).
type Etcd struct {
	opts etcdstore.Options
	// lostOn: writes' answers may be lost after they committed
	// (etcdfault.go); rng seeds each handle's injector.
	lostOn atomic.Bool

	mu     sync.Mutex
	now    Instant // its Wall is read with its Mono, then moves with it
	maxLag time.Duration
	rng    *rand.Rand
	notes  []string // the injectors' lines for the trace
	lost   int      // answers lost
	// revoked: holders whose lease was revoked behind their backs, while
	// their job runs (etcdfault.go).
	revoked []revoked
	// peeker is the model's own client, for what it reads of the server
	// beside the store (etcdfault.go); Close closes it.
	peeker *clientv3.Client
}

// etcdRuns numbers the runs of a process: each has a prefix of its own.
var etcdRuns atomic.Int64

// NewEtcd returns the NewBackend of the etcd store on the server at
// endpoint (host:port).
func NewEtcd(endpoint string) NewBackend {
	return func(dir string, j Judges, mut mutation.Set) (Backend, error) {
		for _, b := range mutation.All() {
			if mut.Has(b) && b != mutation.LostRecounted && b != mutation.SupersedeFirst {
				return nil, fmt.Errorf("etcd store: store-side mutation %s: it switches only %s and %s", b, mutation.LostRecounted, mutation.SupersedeFirst)
			}
		}
		e := &Etcd{opts: etcdstore.Options{Endpoints: []string{endpoint},
			Prefix: fmt.Sprintf("/sim/%d", etcdRuns.Add(1)),
			// Dead is the host's judge as slotctl gives it; etcd keeps no
			// ticket for an orphaned job (Judges.Keep is bbolt's).
			Dead: j.Dead, Mutations: mut,
			DialTimeout: 10 * time.Second, RequestTimeout: 10 * time.Second}}
		e.now = e.read()
		e.rng = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(etcdRuns.Load())))
		return e, nil
	}
}

// read is the real clocks: the boot-time clock the store's lease clock
// reads (proc.Boottime), and the wall clock.
func (e *Etcd) read() Instant {
	return Instant{Boot: "etcd", Mono: proc.Boottime(), Wall: time.Now()}
}

// Open implements Backend.
// Each handle has its own client, and in it its own injector of the etcd
// store's faults (etcdfault.go).
func (e *Etcd) Open() (store.Store, error) {
	e.mu.Lock()
	l := &lostAnswers{e: e, rng: rand.New(rand.NewPCG(e.rng.Uint64(), e.rng.Uint64()))}
	e.mu.Unlock()
	o := e.opts
	o.DialOptions = append(slices.Clip(o.DialOptions), grpc.WithChainUnaryInterceptor(l.unary))
	return etcdstore.New(o)
}

// Now implements Backend.
func (e *Etcd) Now() Instant {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

// Advance implements Backend: the clock moves by d, once real time has.
func (e *Etcd) Advance(d time.Duration) {
	e.mu.Lock()
	// The lag is at its longest now, after the steps since the last tick.
	e.maxLag = max(e.maxLag, proc.Boottime()-e.now.Mono)
	e.now.Mono += d
	e.now.Wall = e.now.Wall.Add(d)
	target := e.now.Mono
	e.mu.Unlock()
	if left := target - proc.Boottime(); left > 0 {
		time.Sleep(left)
	}
	// The wall clock may run slower than the boot-time clock (a slewing
	// NTP): the store's readings of it must not fall behind the step's.
	if left := time.Until(e.now.Wall); left > 0 {
		time.Sleep(left)
	}
}

// Lag is how far real time has run ahead of the clock.
func (e *Etcd) Lag() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := proc.Boottime() - e.now.Mono
	e.maxLag = max(e.maxLag, l)
	return l
}

// Close closes the model's own client, if it made one.
func (e *Etcd) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.peeker != nil {
		e.peeker.Close()
		e.peeker = nil
	}
}

// MaxLag is the longest Lag measured.
func (e *Etcd) MaxLag() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.maxLag
}

// StepWall implements Backend: the server's leases do not read the wall
// clock, but its planner's rate windows and aging do, on the real one.
func (e *Etcd) StepWall(time.Duration) bool { return false }

// Reboot implements Backend: not modelled (the server and its leases
// outlive the hosts of the holders; a real reboot is out of reach).
func (e *Etcd) Reboot() bool { return false }

// etcdJitter bounds what the server adds to the lag on its side: its
// revoker acts within 10 ms of a lease's end, on a loaded machine later.
const etcdJitter = 100 * time.Millisecond

// slack is how far the store's clock may be from the simulation's: 0 on a
// driven clock; on etcd's, the longest lag so far (real time was ahead by
// up to that when the server read its clock for a renewal, and is now) and
// the server's jitter.
func (s *sim) slack() time.Duration {
	if e, ok := s.be.(*Etcd); ok {
		e.Lag()
		return e.MaxLag() + etcdJitter
	}
	return 0
}

// etcdTTLRound is how far the etcd store's reading of a lease it did not
// grant or renew itself may be from the lease's end: the server answers
// whole seconds, rounded down, and the store adds half of one.
const etcdTTLRound = 500 * time.Millisecond

// remainingOff reports whether a store's reading of a lease's time left, r,
// is not the model's, want (S13): exactly on a driven clock; on etcd's,
// within the server's rounding and the slack, and 0 for an expired lease
// (its record outlives it until a settle: the server no longer says when it
// ended).
func (s *sim) remainingOff(r, want time.Duration) bool {
	if _, ok := s.be.(*Etcd); ok {
		slack := etcdTTLRound + s.slack()
		if r == 0 {
			return want > s.slack()
		}
		return r-want > slack || want-r > slack
	}
	return r != want
}

// admissionRenews: the store gives a ticket a whole lease when it admits it
// (docs/leases.md rule 17). etcd's cannot: only a keep-alive renews a
// lease, so an admitted ticket keeps the deadline of its last renewal, as
// its holder counts it.
func (s *sim) admissionRenews() bool {
	_, ok := s.be.(*Etcd)
	return !ok
}

// near: t's lease ends within the slack of now, where a store on a clock
// of its own (etcd's) may judge it either way: expired (the server's clock
// is ahead) or not yet (it read its clock at the renewal's arrival, after
// the simulation's send time). A driven clock has no such band.
func (m *model) near(t *mTicket, now Instant) bool {
	d := m.s.slack()
	if d == 0 || t.quiet || t.boot != now.Boot {
		return false
	}
	return now.Mono >= t.dl-d && now.Mono < t.dl+d
}

// mayPrecede: on a store that reads its own clock as it plans (etcd's, up
// to the slack ahead of the step's), whether p goes before w in a priority
// limit of aging at some instant of [now, now+slack], where the planner's
// clock was: at either end, or as p gains a point of aging.
func (m *model) mayPrecede(p, w *mTicket, now time.Time, aging time.Duration) bool {
	d := m.s.slack()
	if d == 0 || aging <= 0 {
		return false
	}
	at := []time.Time{now, now.Add(d)}
	if p.created.Before(now) {
		next := p.created.Add((now.Sub(p.created)/aging + 1) * aging)
		for ; !next.After(now.Add(d)); next = next.Add(aging) {
			at = append(at, next)
		}
	}
	for _, t := range at {
		ep, ew := effective(p, t, aging), effective(w, t, aging)
		if ep > ew || ep == ew && p.fence < w.fence {
			return true
		}
	}
	return false
}

// restarts: the restart fault applies. A holder keeps its etcd handle for
// its life, and the handle the send times of its own renewals (to the
// millisecond); a new one reads the lease from the server (whole seconds
// plus half of one, up to half a second late), which a waiter would count
// its lease on: a loss of memory no process of slotctl suffers.
func (s *sim) restarts() bool {
	_, ok := s.be.(*Etcd)
	return !ok
}

// awaitsSettle: a ticket the model swept (a call found it gone) is still
// listed by the etcd store, shown expired: its lease ended and took its
// ticket key and slot, its record stays until a settle removes it. A call
// that finds the lease gone does not settle (a host-local store's sweeps
// remove what they find expired).
func (s *sim) awaitsSettle(v store.Ticket, g goneRec) bool {
	_, ok := s.be.(*Etcd)
	return ok && g.swept && v.Remaining == 0
}

// recordLeft: a ticket the model swept because a call found its lease gone
// may still have its record on etcd (awaitsSettle), which a release then
// removes, once: the removal the model took for done.
func (s *sim) recordLeft(g goneRec) bool {
	_, ok := s.be.(*Etcd)
	return ok && g.swept && g.found
}
