package sim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
	"github.com/slotctl/slotctl/store/pgstore"
)

// An Instant is a reading of the store's clock: the boot, the boot-time
// clock within it, and the wall clock (display only, unless a bug judges by it).
type Instant struct {
	Boot string
	Mono time.Duration
	Wall time.Time
}

// A Backend is the store under test and the clock that judges its leases.
// The holders' monotonic clocks read the same boot-time clock (one host).
type Backend interface {
	// Open returns a new handle on the store, as another process opening it
	// would: every actor has its own, and a restart replaces them all.
	Open() (store.Store, error)
	// Now reads the store's clock.
	Now() Instant
	// Advance lets d pass on every clock.
	Advance(d time.Duration)
	// StepWall steps the wall clock alone by d; false if the backend cannot.
	StepWall(d time.Duration) bool
	// Reboot starts a new boot (new boot id, boot clock near zero); false
	// if the backend cannot.
	Reboot() bool
}

// NewBackend makes the backend of one run. j is what the host proves of
// holders (the real judge, reading the simulation's process table); mut is
// the set of store-side bugs switched on.
type NewBackend func(dir string, j Judges, mut mutation.Set) (Backend, error)

// Judges are what the store's host proves of a ticket's holder, as
// slotctl gives them to a store.
type Judges struct {
	// Dead proves the holder dead (boltstore.Options.Dead).
	Dead store.Judge
	// Keep vouches for an expired ticket whose orphaned job provably runs
	// (boltstore.Options.Keep): it stays until a reap stops the job.
	Keep func(store.Ticket) bool
	// Alive proves a waiting ticket's supervisor alive on the store's host
	// (boltstore.Options.Alive): its late renewal is the machine's load.
	Alive func(store.Ticket) bool
}

// Bolt is the bbolt store on a real file, judged by a FakeClock the
// simulation owns, without fsync (the simulation kills processes, not the
// host's page cache).
type Bolt struct {
	path  string
	opts  boltstore.Options
	clock *boltstore.FakeClock
	boots int
	lock  *storeLock // held by a stalled process (storelock.go)
}

// boltTimeout bounds a call's wait for the store's lock (real time).
const boltTimeout = time.Second

// simEpoch is the wall time a run starts at; fixed, so that runs replay.
var simEpoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// NewBolt is the NewBackend of the bbolt store.
func NewBolt(dir string, j Judges, mut mutation.Set) (Backend, error) {
	b := &Bolt{path: filepath.Join(dir, "slots.db"), boots: 1}
	b.clock = boltstore.NewFakeClock(boltstore.Instant{Boot: "boot-1", Mono: time.Hour, Wall: simEpoch})
	b.opts = boltstore.Options{Clock: b.clock, NoSync: true, Dead: j.Dead, Keep: j.Keep, Alive: j.Alive, Mutations: mut, Timeout: boltTimeout}
	return b, nil
}

// KeepsLiveWaiters: the bbolt store keeps an expired waiter that
// Judges.Alive proves alive (a host-local store's rule 17).
func (b *Bolt) KeepsLiveWaiters() bool { return true }

// Lose deletes the store's file: the next call starts a new one.
func (b *Bolt) Lose() error {
	if err := os.Remove(b.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Open implements Backend.
func (b *Bolt) Open() (store.Store, error) {
	st, err := boltstore.New(b.path, b.opts)
	if err != nil {
		return nil, err
	}
	return lockStore{st, b}, nil
}

// Now implements Backend.
func (b *Bolt) Now() Instant {
	i := b.clock.Now()
	return Instant{Boot: i.Boot, Mono: i.Mono, Wall: i.Wall}
}

// Advance implements Backend.
func (b *Bolt) Advance(d time.Duration) { b.clock.Advance(d) }

// StepWall implements Backend.
func (b *Bolt) StepWall(d time.Duration) bool {
	i := b.clock.Now()
	i.Wall = i.Wall.Add(d)
	b.clock.Set(i)
	return true
}

// Reboot implements Backend.
func (b *Bolt) Reboot() bool {
	i := b.clock.Now()
	b.boots++
	b.clock.Set(boltstore.Instant{Boot: fmt.Sprintf("boot-%d", b.boots), Mono: 20 * time.Second, Wall: i.Wall.Add(30 * time.Second)})
	return true
}

// Postgres is the PostgreSQL store on a real server, one new database per
// run, its clock (which judges leases by the wall clock) the simulation's.
type Postgres struct {
	db    PgDB
	opts  pgstore.Options
	clock *boltstore.FakeClock
}

// A PgDB is a run's database: its URL, through a proxy that can lose the
// answer of the next COMMIT after the server ran it (pgtest.Proxy), and
// how many it lost.
type PgDB struct {
	URL            string
	LoseNextCommit func()
	Lost           func() int
}

// NewPostgres returns the NewBackend of the PostgreSQL store; newDB makes
// an empty database for the run in dir.
func NewPostgres(newDB func(dir string) (PgDB, error)) NewBackend {
	return func(dir string, j Judges, mut mutation.Set) (Backend, error) {
		db, err := newDB(dir)
		if err != nil {
			return nil, err
		}
		p := &Postgres{db: db, clock: boltstore.NewFakeClock(boltstore.Instant{Boot: "postgres", Wall: simEpoch})}
		p.opts = pgstore.Options{Judge: j.Dead, Mutations: mut, Timeout: 5 * time.Second,
			Now: func() time.Time { return p.clock.Now().Wall }}
		return p, nil
	}
}

// Open implements Backend.
func (p *Postgres) Open() (store.Store, error) {
	return pgstore.Open(context.Background(), p.db.URL, p.opts)
}

// Now implements Backend: the wall clock is the store's only clock.
func (p *Postgres) Now() Instant {
	w := p.clock.Now().Wall
	return Instant{Boot: "postgres", Mono: time.Duration(w.UnixNano()), Wall: w}
}

// Advance implements Backend.
func (p *Postgres) Advance(d time.Duration) { p.clock.Advance(d) }

// StepWall implements Backend: the server judges leases by its wall clock,
// so a step of it is a step of every lease (not modelled).
func (p *Postgres) StepWall(time.Duration) bool { return false }

// Reboot implements Backend: not modelled (leases run by the server's clock,
// not a host's boot).
func (p *Postgres) Reboot() bool { return false }
