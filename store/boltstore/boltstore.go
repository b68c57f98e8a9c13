package boltstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// DefaultTimeout bounds how long an operation waits for the store's file lock.
const DefaultTimeout = 5 * time.Second

// Options tune a Store. The zero value is the production setting.
type Options struct {
	// Clock judges deadlines; nil means SystemClock (boot-time clock + boot id).
	Clock Clock
	// Timeout bounds the wait for the file lock of one operation; 0 means DefaultTimeout.
	Timeout time.Duration
	// Dead, if set, proves a ticket's holder dead on this host (docs/leases.md §4.3)
	// and gives the evidence. Expiry and tickets from an earlier boot are
	// judged without it.
	Dead store.Judge
	// Keep, if set, keeps an expired ticket that Dead did not prove dead
	// (policy.SettleInput.Keep): one whose orphaned job provably runs.
	Keep func(store.Ticket) bool
	// Alive, if set, proves a waiting ticket's supervisor alive on this host
	// (same boot and pid namespace, same pid and start time): a settle keeps
	// such a waiter however late its renewal (docs/leases.md rule 17).
	Alive func(store.Ticket) bool
	// Loud makes waiters renew from their first write, as on a replicated
	// store, instead of waiting quietly until they come into line. Tests
	// use it to compare the two.
	Loud bool
	// MakeDir creates the store's directory (private, 0700) when it is
	// missing. Without it a missing directory is ErrUnavailable: a store
	// path someone named and mistyped must not become a new, separate store
	// that excludes nobody (docs/leases.md §4.5). Callers set it for their
	// default location only.
	MakeDir bool
	// NoSync skips fsync at commit. Only for tests and benchmarks.
	NoSync bool
	// Mutations is test-only: it re-introduces known bugs so that the
	// simulation (internal/testkit/sim) can prove it catches them. Without the
	// build tag slotctl_mutations it is empty and the bugs are compiled out.
	Mutations mutation.Set
}

// Store is the embedded bbolt store. It holds no file open between
// operations but its directory: each one opens the file, takes the lock,
// runs one transaction and closes it, so a process that waits or runs a
// child never blocks others. Every file is reached from the directory's
// descriptor (see dirfd.go).
type Store struct {
	*policy.Store // the rules, over this file's transactions (steps)

	path    string // absolute
	name    string // the store file's name in its directory
	fds     *dirFDs
	mode    fs.FileMode
	clock   Clock
	timeout time.Duration
	dead    store.Judge
	keep    func(store.Ticket) bool
	alive   func(store.Ticket) bool
	loud    bool
	noSync  bool

	mut mutation.Set // test-only: nil in production, empty without the tag
}

var _ store.Store = (*Store)(nil)

// New returns the store kept in the bbolt file at path, creating its
// directory (private, 0700) if it is missing and opts.MakeDir is set. The
// file itself is created by the first write: 0600 in a private directory,
// 0660 in a group-writable (shared) one. A directory on a network filesystem is refused: use etcd there; so is
// one whose last component is a symlink, or that everyone may write to
// without its sticky bit (docs/leases.md §4.5).
func New(path string, opts Options) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("%w: store path %q: %v", store.ErrUnavailable, path, err)
	}
	dir := filepath.Dir(abs)
	dirfd, err := openDirFD(dir)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		dirfd, err = openTrustedLink(dir, err)
	}
	if errors.Is(err, unix.ENOENT) {
		if !opts.MakeDir {
			return nil, fmt.Errorf("%w: store directory %s does not exist: create it, or name another store (only the default store's directory is made)", store.ErrUnavailable, dir)
		}
		if err = os.MkdirAll(dir, 0o700); err == nil {
			dirfd, err = openDirFD(dir)
		}
	}
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			if st, lerr := os.Lstat(dir); lerr != nil || st.Mode()&fs.ModeSymlink == 0 {
				return nil, fmt.Errorf("%w: store directory %s is not a directory", store.ErrUnavailable, dir)
			}
			return nil, fmt.Errorf("%w: store directory %s is a symbolic link: slotctl does not follow one to a store; "+
				"name the directory it points to", store.ErrUnavailable, dir)
		}
		return nil, fmt.Errorf("%w: store directory %v", store.ErrUnavailable, pathError(dir, unwrapPath(err)))
	}
	fds := &dirFDs{dir: dirfd, bells: -1}
	var st unix.Stat_t
	if err := fds.checkDir(dir, &st); err != nil {
		fds.close()
		return nil, err
	}
	if fsName, remote := networkFS(dirfd); remote {
		fds.close()
		return nil, &NetworkFSError{Dir: dir, FS: fsName}
	}
	mode := fs.FileMode(0o600)
	if st.Mode&0o020 != 0 {
		mode = 0o660
	}
	s := &Store{path: abs, name: filepath.Base(abs), fds: fds, mode: mode, clock: opts.Clock, timeout: opts.Timeout, dead: opts.Dead, keep: opts.Keep, alive: opts.Alive, loud: opts.Loud, noSync: opts.NoSync, mut: opts.Mutations}
	// Close closes the descriptors; a Store dropped without Close has them
	// closed by this cleanup. Whatever uses them keeps the Store alive until
	// done (runtime.KeepAlive), so that a number is never used after it was
	// closed, or reused.
	runtime.AddCleanup(s, func(fds *dirFDs) { fds.shut() }, fds)
	if s.clock == nil {
		s.clock = SystemClock{}
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	s.Store = policy.New(steps{s}, policy.Options{Judge: s.dead, Keep: s.keepTicket, Quiet: !s.loud, BellUID: ownUID(), Mutations: s.mut})
	return s, nil
}

// steps is the file as the rules see it: a step is one transaction.
type steps struct{ s *Store }

func (b steps) Update(ctx context.Context, fn func(policy.Tx) error) error {
	return b.s.update(ctx, func(x *txn) error { return fn(x) })
}

func (b steps) View(ctx context.Context, fn func(policy.Tx) error) error {
	return b.s.view(ctx, func(x *txn) error { return fn(x) })
}

func (b steps) Watch(ctx context.Context, id string) (store.Bell, error) { return b.s.Watch(ctx, id) }
func (b steps) String() string                                           { return b.s.String() }
func (b steps) Close() error                                             { return b.s.Close() }

// Events implements policy.EventReader.
func (b steps) Events(ctx context.Context, limit string, n int) ([]store.Event, error) {
	out := []store.Event{}
	err := b.s.view(ctx, func(x *txn) error {
		bk := x.bucket(bucketEvents)
		if bk == nil || n <= 0 {
			return nil
		}
		c := bk.Cursor()
		for k, v := c.Last(); k != nil && len(out) < n; k, v = c.Prev() {
			var e eventRec
			if err := decode(v, &e); err != nil {
				return fmt.Errorf("event %x: %w", k, err)
			}
			if limit == "" || e.Limit == limit {
				out = append(out, e.Event)
			}
		}
		slices.Reverse(out)
		return nil
	})
	return out, err
}

// NetworkFSError refuses a store directory on a network filesystem, where
// bbolt's file lock is not reliable. It wraps store.ErrUnavailable.
type NetworkFSError struct {
	Dir string // the store directory
	FS  string // the filesystem's name, e.g. "nfs"
}

func (e *NetworkFSError) Error() string {
	return fmt.Sprintf("%v: store directory %s is on %s: bbolt's file lock is not reliable there; "+
		"use a local path, or an etcd store for limits shared across hosts", store.ErrUnavailable, e.Dir, e.FS)
}

// Unwrap makes a NetworkFSError an ErrUnavailable.
func (e *NetworkFSError) Unwrap() error { return store.ErrUnavailable }

// dirFDs are a Store's descriptors: its directory, opened in New, and its
// bells directory, opened by the first Watch or ring that finds it. Every
// use of them holds them (acquire, release), so that Close never closes a
// descriptor in use: the last user closes them.
type dirFDs struct {
	dir    int
	mu     sync.Mutex // guards bells, users, closed
	bells  int        // -1 until opened
	users  int        // operations using the descriptors now
	closed bool       // Close was called
	shutFD bool       // the descriptors are closed
}

func (d *dirFDs) close() {
	if d.shutFD {
		return
	}
	d.shutFD = true
	unix.Close(d.dir)
	if d.bells >= 0 {
		unix.Close(d.bells)
	}
}

// acquire holds the descriptors for one use; it fails once the store is closed.
func (d *dirFDs) acquire(path string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("%w: %s", store.ErrClosed, path)
	}
	d.users++
	return nil
}

// release ends a use of acquire; the last use after shut closes them.
func (d *dirFDs) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.users--; d.users == 0 && d.closed {
		d.close()
	}
}

// shut refuses new uses and closes the descriptors once no use holds them.
func (d *dirFDs) shut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.users == 0 {
		d.close()
	}
}

// Close implements [store.Store]: it closes the store's directory
// descriptors (after the operations in flight). Bells made by Watch have
// their own and stay valid until their Close. Idempotent.
func (s *Store) Close() error {
	s.fds.shut()
	return nil
}

// checkDir fstats the store directory, as New does and every operation
// again (its mode may have changed since), into st.
func (d *dirFDs) checkDir(dir string, st *unix.Stat_t) error {
	if err := unix.Fstat(d.dir, st); err != nil {
		return fmt.Errorf("%w: store directory %s: %v", store.ErrUnavailable, dir, err)
	}
	if why := unsafeDir(st); why != "" {
		return fmt.Errorf("%w: store directory %s %s", store.ErrUnavailable, dir, why)
	}
	return nil
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
// The returned func closes both. The file is opened once, relative to the
// store directory and checked (regularFile), before bbolt or any check reads
// it; bbolt gets that very descriptor. A reader opens it before the lock, so
// that reading a store that does not exist yet creates nothing.
func (s *Store) open(ctx context.Context, write bool) (*bolt.DB, func(), error) {
	defer runtime.KeepAlive(s) // its cleanup closes the directory this uses
	var st unix.Stat_t
	if err := s.fds.checkDir(filepath.Dir(s.path), &st); err != nil {
		return nil, nil, err
	}
	var f *os.File
	if !write {
		var err error
		if f, err = s.openToRead(); err != nil {
			return nil, nil, err
		}
	}
	timeout := s.timeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	start := time.Now()
	unlock, err := lockFile(ctx, s.fds.dir, s.name+".lock", s.path+".lock", s.mode, write, timeout)
	if err != nil {
		if f != nil {
			f.Close()
		}
		if errors.Is(err, errLockTimeout) {
			return nil, nil, &store.LockTimeoutError{Path: s.path, Waited: timeout}
		}
		return nil, nil, fmt.Errorf("%w: lock store %s: %v", store.ErrUnavailable, s.path, err)
	}
	var size int64
	if write {
		if f, size, err = regularFile(s.fds.dir, s.name, s.path, unix.O_RDWR, true, s.mode); err != nil {
			unlock()
			return nil, nil, s.fileError(err)
		}
	}
	// The page structure bbolt will read, on the descriptor it will read it
	// through, before it maps a page of it.
	if err := checkPages(f, s.path); err != nil {
		f.Close()
		unlock()
		return nil, nil, err
	}
	left := max(timeout-time.Since(start), 10*time.Millisecond)
	// bbolt reads the freelist while opening: open under guard too, and keep
	// its file so that a fault there does not leave the file locked.
	opts := &bolt.Options{Timeout: left, ReadOnly: !write, NoSync: s.noSync,
		OpenFile: func(string, int, os.FileMode) (*os.File, error) { return f, nil }}
	var db *bolt.DB
	err = s.guard(func() (err error) {
		db, err = bolt.Open(s.path, s.mode, opts)
		return err
	})
	if err != nil {
		f.Close() // bbolt closed it already, unless it faulted
		if write && size == 0 && (noSpace(err) || ioError(err)) {
			s.emptyAgain()
		}
		unlock()
		if errors.Is(err, store.ErrCorrupt) {
			return nil, nil, err
		}
		return nil, nil, s.openError(err)
	}
	return db, func() { db.Close(); unlock() }, nil
}

// openToRead opens the store file for a reader, before the lock:
// errNoFile when there is none yet, or an empty one.
func (s *Store) openToRead() (*os.File, error) {
	f, size, err := regularFile(s.fds.dir, s.name, s.path, unix.O_RDONLY, false, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoFile
	}
	if err != nil {
		return nil, s.fileError(err)
	}
	if size == 0 {
		f.Close()
		return nil, errNoFile
	}
	return f, nil
}

// emptyAgain leaves the store file empty, as it was, after bbolt's first
// pages did not fit or reach the disk: an empty file is an empty store, a
// half initialised one is not. Best effort.
func (s *Store) emptyAgain() {
	if g, _, err := regularFile(s.fds.dir, s.name, s.path, unix.O_RDWR, false, 0); err == nil {
		_ = g.Truncate(0)
		g.Close()
	}
}

// noSpace reports whether err is a write the file system refused for want
// of space: full (ENOSPC) or over the user's quota (EDQUOT).
func noSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// ioError reports whether err is the disk's: an I/O error (a write or its
// fsync failed: EIO) or a file system gone read-only (EROFS).
func ioError(err error) bool {
	return errors.Is(err, unix.EIO) || errors.Is(err, unix.EROFS)
}

// writeError is the error of a commit that failed after the transaction's
// work was done: the disk's (EIO from a write or an fsync), whatever bbolt
// wrapped it in. bbolt writes the new meta page last, only after the pages
// it points to reached the disk: a commit that failed before it left the
// store as it was.
func (s *Store) writeError(err error) error {
	cause := err.Error()
	var errno unix.Errno
	if errors.As(err, &errno) {
		cause = errno.Error()
	} else if i := strings.LastIndex(cause, ": "); i >= 0 {
		// Growing the file, bbolt formats the error with %s ("file sync
		// error: sync PATH: input/output error"): its last part is the cause.
		cause = cause[i+2:]
	}
	return fmt.Errorf("%w: cannot write store %s: %s", store.ErrUnavailable, s.path, cause)
}

// noSpaceError says that the store could not be written for want of space.
// bbolt commits a transaction whole or not at all: nothing was written.
func (s *Store) noSpaceError(err error) error {
	cause := unix.ENOSPC
	if errors.Is(err, unix.EDQUOT) {
		cause = unix.EDQUOT
	}
	return fmt.Errorf("%w: cannot write store %s: %v", store.ErrUnavailable, s.path, cause)
}

// fileError is the error of a store file that regularFile refused.
func (s *Store) fileError(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: open store %s: permission denied", store.ErrUnavailable, s.path)
	}
	return fmt.Errorf("%w: store file %v", store.ErrUnavailable, err)
}

func (s *Store) openError(err error) error {
	switch {
	case noSpace(err):
		return s.noSpaceError(err)
	case ioError(err):
		return fmt.Errorf("%w: cannot open store %s: %v", store.ErrUnavailable, s.path, unwrapPath(err))
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: open store %s: permission denied", store.ErrUnavailable, s.path)
	case errors.Is(err, berrors.ErrTimeout):
		return &store.LockTimeoutError{Path: s.path, Waited: s.timeout}
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
	if err := s.fds.acquire(s.path); err != nil {
		return err
	}
	defer s.fds.release()
	db, closeDB, err := s.open(ctx, true)
	if err != nil {
		return err
	}
	defer closeDB()
	x := &txn{s: s, now: s.now()}
	done := false // fn succeeded: an error after it is the commit's
	err = s.guard(func() error {
		return db.Update(func(tx *bolt.Tx) error {
			x.tx = tx
			if err := x.init(); err != nil {
				return err
			}
			if err := fn(x); err != nil {
				return err
			}
			done = true
			return nil
		})
	})
	if err != nil && done && s.mut.Has(mutation.CommitIgnored) { // mutation (test-only): a failed commit taken for done
		err = nil
	}
	if noSpace(err) {
		return s.noSpaceError(err)
	}
	if err != nil && done && !errors.Is(err, store.ErrCorrupt) {
		// bbolt's own errors (a failed fsync, a write) name neither the
		// store nor, once it formats them, the errno: they are the
		// disk's, not the caller's (exit 69, not 70).
		return s.writeError(err)
	}
	if err != nil {
		return err
	}
	for _, b := range x.unbell {
		s.bell(b, true) // a waiter whose ticket was removed learns it at once
	}
	for _, b := range x.rings {
		s.bell(b, false)
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
	if err := s.fds.acquire(s.path); err != nil {
		return err
	}
	defer s.fds.release()
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

// keepTicket vouches for an expired ticket that the judge did not prove dead
// (policy.SettleInput.Keep): a waiter whose supervisor provably lives, late
// only because the machine or the store is busy (docs/leases.md rule 17),
// or a ticket whose orphaned job runs on.
func (s *Store) keepTicket(t store.Ticket) bool {
	if t.State == store.Waiting && s.alive != nil && s.alive(t) {
		return true
	}
	return s.keep != nil && s.keep(t)
}
