package boltstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// DefaultTimeout bounds how long an operation waits for the store's file lock.
const DefaultTimeout = 5 * time.Second

// Options tune a Store. The zero value is the production setting.
type Options struct {
	// Clock judges deadlines; nil means SystemClock (boot-time clock + boot id).
	Clock Clock
	// Timeout bounds the wait for the file lock of one operation; 0 means DefaultTimeout.
	Timeout time.Duration
	// Dead, if set, proves a ticket's holder dead on this host (SPEC §4.3)
	// and gives the evidence. Expiry and tickets from an earlier boot are
	// judged without it.
	Dead store.Judge
	// NoSync skips fsync at commit. Only for tests and benchmarks.
	NoSync bool
	// Mutations is test-only: it re-introduces known bugs so that the
	// simulation (gate/sim) can prove it catches them. nil in production.
	Mutations mutation.Set
}

// Store is the embedded bbolt store. It holds no file open between
// operations: each one opens the file, takes the lock, runs one transaction
// and closes it, so a process that waits or runs a child never blocks others.
type Store struct {
	path    string // absolute
	mode    fs.FileMode
	clock   Clock
	timeout time.Duration
	dead    store.Judge
	noSync  bool

	mut     mutation.Set // test-only, nil in production
	mutMu   sync.Mutex   // guards mutScan
	mutScan mutScan      // what this handle's last dry-run reap read (mutations only)
}

var _ store.Store = (*Store)(nil)

// New returns the store kept in the bbolt file at path, creating its
// directory (private, 0700) if missing. The file itself is created by the
// first write: 0600 in a private directory, 0660 in a group-writable (shared)
// one. A directory on a network filesystem is refused: use etcd there.
func New(path string, opts Options) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("%w: store path %q: %v", store.ErrUnavailable, path, err)
	}
	dir := filepath.Dir(abs)
	st, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(dir, 0o700); err == nil {
			st, err = os.Stat(dir)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: store directory %s: %v", store.ErrUnavailable, dir, unwrapPath(err))
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%w: store directory %s is not a directory", store.ErrUnavailable, dir)
	}
	if fsName, remote := networkFS(dir); remote {
		return nil, fmt.Errorf("%w: store directory %s is on %s: bbolt's file lock is not reliable there; "+
			"use a local path, or etcd for limits shared across hosts (--store etcd://HOST:2379)", store.ErrUnavailable, dir, fsName)
	}
	mode := fs.FileMode(0o600)
	if st.Mode().Perm()&0o020 != 0 {
		mode = 0o660
	}
	s := &Store{path: abs, mode: mode, clock: opts.Clock, timeout: opts.Timeout, dead: opts.Dead, noSync: opts.NoSync, mut: opts.Mutations}
	if s.clock == nil {
		s.clock = SystemClock{}
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	return s, nil
}

// Path is the store file's absolute path.
func (s *Store) Path() string { return s.path }

// String is the canonical URL: bolt:// and the absolute path.
func (s *Store) String() string { return "bolt://" + s.path }

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// errNoFile tells a read that the store file does not exist yet: an empty store.
var errNoFile = errors.New("no store file")

// open takes the store's lock and opens the bbolt file for one operation.
// The returned func closes both.
func (s *Store) open(ctx context.Context, write bool) (*bolt.DB, func(), error) {
	if !write {
		if st, err := os.Stat(s.path); errors.Is(err, fs.ErrNotExist) || (err == nil && st.Size() == 0) {
			return nil, nil, errNoFile
		}
	}
	timeout := s.timeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	start := time.Now()
	unlock, err := lockFile(ctx, s.path+".lock", s.mode, write, timeout)
	if err != nil {
		if errors.Is(err, errLockTimeout) {
			return nil, nil, fmt.Errorf("%w: store %s stayed locked by another process for %s (--store-timeout)", store.ErrUnavailable, s.path, timeout.Round(time.Millisecond))
		}
		return nil, nil, fmt.Errorf("%w: lock store %s: %v", store.ErrUnavailable, s.path, unwrapPath(err))
	}
	_, statErr := os.Stat(s.path)
	created := errors.Is(statErr, fs.ErrNotExist)
	if err := checkFileSize(s.path); err != nil {
		unlock()
		return nil, nil, err
	}
	left := max(timeout-time.Since(start), 10*time.Millisecond)
	// bbolt reads the freelist while opening: open under guard too, and keep
	// its file so that a fault there does not leave the file locked.
	var f *os.File
	opts := &bolt.Options{Timeout: left, ReadOnly: !write, NoSync: s.noSync,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			var err error
			if f, err = os.OpenFile(name, flag, perm); err == nil {
				if err = checkPages(f, s.path); err != nil { // before bbolt reads a page of it
					f.Close()
					f = nil
				}
			}
			return f, err
		}}
	var db *bolt.DB
	err = s.guard(func() (err error) {
		db, err = bolt.Open(s.path, s.mode, opts)
		return err
	})
	if err != nil {
		if f != nil {
			f.Close() // bbolt closed it already, unless it faulted
		}
		unlock()
		if errors.Is(err, store.ErrCorrupt) {
			return nil, nil, err
		}
		return nil, nil, s.openError(err)
	}
	if created {
		// The umask may have narrowed the mode; a shared store must stay group-writable.
		_ = os.Chmod(s.path, s.mode)
	}
	return db, func() { db.Close(); unlock() }, nil
}

func (s *Store) openError(err error) error {
	switch {
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: open store %s: permission denied", store.ErrUnavailable, s.path)
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: store %s stayed locked by another process for %s (--store-timeout)", store.ErrUnavailable, s.path, s.timeout)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: open store %s: %v", store.ErrUnavailable, s.path, unwrapPath(err))
	default:
		return fmt.Errorf("%w: %s: %v", store.ErrCorrupt, s.path, err)
	}
}

// update runs fn in one write transaction on a freshly opened file. The clock
// is read after the lock is taken, so every deadline is judged in order.
// Bells are rung after the commit.
func (s *Store) update(ctx context.Context, fn func(x *txn) error) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	db, closeDB, err := s.open(ctx, true)
	if err != nil {
		return err
	}
	defer closeDB()
	x := &txn{s: s, now: s.now()}
	err = s.guard(func() error {
		return db.Update(func(tx *bolt.Tx) error {
			x.tx = tx
			if err := x.init(); err != nil {
				return err
			}
			return fn(x)
		})
	})
	if err != nil {
		return err
	}
	for _, id := range x.unbell {
		ring(s.path, id) // a waiter whose ticket was removed learns it at once
		removeBell(s.path, id)
	}
	for _, id := range x.rings {
		ring(s.path, id)
	}
	return nil
}

// now reads the store's clock for one transaction.
func (s *Store) now() Instant {
	i := s.clock.Now()
	if s.mut.Has(mutation.WallClock) { // mutation (test-only): judge deadlines on the wall clock (D2)
		i.Mono = time.Duration(i.Wall.UnixNano())
	}
	return i
}

// view runs fn in one read transaction. A missing store file reads as empty.
func (s *Store) view(ctx context.Context, fn func(x *txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	db, closeDB, err := s.open(ctx, false)
	if errors.Is(err, errNoFile) {
		return fn(&txn{s: s, now: s.now()})
	}
	if err != nil {
		return err
	}
	defer closeDB()
	x := &txn{s: s, now: s.now()}
	return s.guard(func() error {
		return db.View(func(tx *bolt.Tx) error {
			x.tx = tx
			if err := x.checkFormat(); err != nil {
				return err
			}
			return fn(x)
		})
	})
}

// guard turns a panic inside bbolt (it panics on some damaged pages) into
// an error that names the file, and names the file in decoding errors.
func (s *Store) guard(fn func() error) (err error) {
	// bbolt follows page ids read from the file into its memory map: a damaged
	// page can point outside the mapping, and that fault is fatal unless the
	// goroutine asked for a panic instead.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", store.ErrCorrupt, s.path, r)
		}
	}()
	err = fn()
	if errors.Is(err, store.ErrCorrupt) && !strings.Contains(err.Error(), s.path) {
		err = fmt.Errorf("%s: %w", s.path, err)
	}
	return err
}
