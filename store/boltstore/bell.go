package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// Bells are named pipes, one per ticket. The transaction that promotes a
// ticket writes one byte to its pipe after the commit, so a release wakes
// exactly the waiters it admitted, not the whole queue. A holder may keep
// its bell open while its job runs: admission does not delete it, and the
// enqueue that asks a held ticket to stop (docs/leases.md §2.1 item 10) rings
// it. The removal of a ticket rings its bell and deletes it. A ring is a
// hint; a waiter or holder that misses one finds out by its poll or renewal.
//
// A bell lives in its waiter's own directory, <store>.bells/<uid>/<id>,
// which only that user (and root) can write: in a sticky shared directory
// nobody else could remove a bell that a dead waiter left behind, so the
// user's own later Watch sweeps them; and nobody can plant or swap an entry
// in a directory that is not theirs. The ticket records whose directory its
// bell is in (ticketRec.BellUID). A ringer opens the bell without following a
// symlink, relative to the directory's descriptor, and writes only to a named
// pipe owned by that directory's user (openPipe: on Linux nothing else is even
// opened); a remover deletes only such a pipe.
// The bells directory is 0700 in a private store directory, 1770 (plus the
// setgid bit it inherits) in a shared one; a user's directory 0700 or 2750
// (others of the group may open a bell, not change the directory: opening a
// directory to work relative to it takes read permission); a bell 0600 or
// 0620 (the group may ring it, not read its rings).

// bellsName is the bells directory's name in the store directory.
func (s *Store) bellsName() string { return s.name + ".bells" }

// bellDir is the bells directory's path, for messages and tests.
func bellDir(storePath string) string { return storePath + ".bells" }

// bellRef names one ticket's bell: its id and the uid whose directory holds
// it (-1: not recorded, a record of an older slotctl; the caller's own).
type bellRef struct {
	id  string
	uid int
}

func refOf(r policy.Rec) bellRef {
	if r.BellUID == nil {
		return bellRef{id: r.ID, uid: -1}
	}
	return bellRef{id: r.ID, uid: int(*r.BellUID)}
}

// sweepAge is how old a bell without a reader must be before its owner's
// sweep deletes it: a Watch makes its pipe and opens it a moment later.
// (A variable for tests.)
var sweepAge = time.Minute

type fifoBell struct {
	dirfd int // the user's bell directory, for the removal
	name  string
	f     *os.File
	c     chan struct{}
	once  sync.Once
}

// bellsDir returns the descriptor of the bells directory, opening it the
// first time (and with create, making it).
func (s *Store) bellsDir(create bool) (int, error) {
	d := s.fds
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.bells >= 0 {
		return d.bells, nil
	}
	path := bellDir(s.path)
	mode := uint32(0o700)
	if s.mode&0o060 != 0 {
		mode = 0o1770 // sticky: members cannot remove each other's directories
	}
	made := false
	fd, err := openDirAt(d.dir, s.bellsName())
	if errors.Is(err, unix.ENOENT) && create {
		err = unix.Mkdirat(d.dir, s.bellsName(), mode)
		made = err == nil
		if err == nil || errors.Is(err, unix.EEXIST) {
			fd, err = openDirAt(d.dir, s.bellsName())
		}
	}
	if err != nil {
		return -1, pathError(path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, pathError(path, err)
	}
	if why := unsafeDir(&st); why != "" {
		unix.Close(fd)
		return -1, fmt.Errorf("%s %s", path, why)
	}
	if made && int(st.Uid) == euid() {
		// The umask narrowed it. Keep the setgid bit a setgid store directory
		// passed on, so that every bell gets the shared group.
		if err := unix.Fchmod(fd, mode|uint32(st.Mode)&unix.S_ISGID); err != nil {
			unix.Close(fd)
			return -1, pathError(path, err)
		}
	}
	d.bells = fd
	return fd, nil
}

// Watch makes the bell of ticket id: a named pipe the waiter keeps open for
// reading and writing, so that a ring never blocks and never finds no reader.
func (s *Store) Watch(ctx context.Context, id string) (store.Bell, error) {
	if err := store.CheckID(id); err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(s) // its cleanup closes the bells directory
	if err := s.fds.acquire(s.path); err != nil {
		return nil, err
	}
	defer s.fds.release()
	ufd, path, err := s.ownBellDir()
	if err != nil {
		return nil, fmt.Errorf("%w: bell directory %v", store.ErrUnavailable, err)
	}
	b, err := s.watchIn(ufd, path, euid(), id)
	if err != nil {
		unix.Close(ufd)
		return nil, fmt.Errorf("%w: bell %v", store.ErrUnavailable, err)
	}
	go b.listen()
	return b, nil
}

// watchIn makes the bell id in the user's own directory ufd.
func (s *Store) watchIn(ufd int, dir string, uid int, id string) (*fifoBell, error) {
	var st unix.Stat_t
	if err := unix.Fstat(ufd, &st); err != nil {
		return nil, pathError(dir, err)
	}
	if int(st.Uid) != uid {
		return nil, fmt.Errorf("directory %s belongs to uid %d, not to this user (uid %d)", dir, st.Uid, uid)
	}
	dirMode, fifoMode := uint32(0o700), uint32(0o600)
	if s.mode&0o060 != 0 {
		dirMode, fifoMode = 0o750|uint32(st.Mode)&unix.S_ISGID, 0o620
	}
	if uint32(st.Mode)&0o7777 != dirMode {
		if err := unix.Fchmod(ufd, dirMode); err != nil {
			return nil, pathError(dir, err)
		}
	}
	sweepBells(ufd, uid, id)
	path := filepath.Join(dir, id)
	// Nobody but this user (and root) can add an entry here: the pipe made
	// is the one opened.
	if err := mkfifoat(ufd, id, path, fifoMode); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, pathError(path, err)
	}
	fd, err := openat(ufd, id, unix.O_RDWR|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, pathError(path, err)
	}
	if err := unix.Fstat(fd, &st); err != nil || uint32(st.Mode)&unix.S_IFMT != unix.S_IFIFO || int(st.Uid) != uid {
		unix.Close(fd)
		if err != nil {
			return nil, pathError(path, err)
		}
		return nil, fmt.Errorf("%s is %s of uid %d, not this user's named pipe", path, kind(uint32(st.Mode)), st.Uid)
	}
	if uint32(st.Mode)&0o7777 != fifoMode {
		if err := unix.Fchmod(fd, fifoMode); err != nil { // the umask narrowed it
			unix.Close(fd)
			return nil, pathError(path, err)
		}
	}
	return &fifoBell{dirfd: ufd, name: id, f: os.NewFile(uintptr(fd), path), c: make(chan struct{}, 1)}, nil
}

// sweepBells removes the bells that the user's dead waiters left in its own
// directory ufd: named pipes of the user, older than sweepAge, that nobody
// reads (a non-blocking open for writing reports ENXIO).
func sweepBells(ufd, uid int, keep string) {
	// Read ufd itself: nothing else reads it, and the *at calls ignore its offset.
	var names []string
	buf := make([]byte, 4096)
	for {
		n, err := unix.ReadDirent(ufd, buf)
		if n <= 0 || err != nil {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	for _, name := range names {
		if name == keep || store.CheckID(name) != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(ufd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil ||
			uint32(st.Mode)&unix.S_IFMT != unix.S_IFIFO || int(st.Uid) != uid ||
			time.Since(ctime(&st)) < sweepAge {
			continue
		}
		fd, err := openPipe(ufd, name, uid)
		if err == nil {
			unix.Close(fd) // a live waiter's
			continue
		}
		if errors.Is(err, unix.ENXIO) {
			_ = unix.Unlinkat(ufd, name, 0)
		}
	}
}

func (b *fifoBell) listen() {
	buf := make([]byte, 64)
	for {
		if _, err := b.f.Read(buf); err != nil {
			return // closed
		}
		select {
		case b.c <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

func (b *fifoBell) C() <-chan struct{} { return b.c }

func (b *fifoBell) Close() error {
	b.once.Do(func() {
		_ = unix.Unlinkat(b.dirfd, b.name, 0) // in the user's own directory
		b.f.Close()
		unix.Close(b.dirfd)
	})
	return nil
}

// bell wakes the waiter of a ticket, if it is listening, and with remove
// deletes its bell (which a dead waiter may have left behind). It never
// blocks, follows no symlink, writes to nothing but a named pipe and
// deletes nothing but one, owned by the user whose directory it is in.
func (s *Store) bell(b bellRef, remove bool) {
	if store.CheckID(b.id) != nil {
		return // decode refused it already; never a path
	}
	uid := b.uid
	if uid < 0 {
		uid = euid()
	}
	defer runtime.KeepAlive(s) // its cleanup closes the bells directory
	if s.fds.acquire(s.path) != nil {
		return // closed: nobody here to wake
	}
	defer s.fds.release()
	bells, err := s.bellsDir(false)
	if err != nil {
		return // no bells yet: nobody to wake
	}
	ufd, err := openDirAt(bells, strconv.Itoa(uid))
	if err != nil {
		return
	}
	defer unix.Close(ufd)
	// No bell (ENOENT), no reader (ENXIO), not a pipe of uid: nobody to wake.
	if fd, err := openPipe(ufd, b.id, uid); err == nil {
		_, _ = unix.Write(fd, []byte{1}) // EAGAIN: the pipe is full of rings already
		unix.Close(fd)
	}
	if !remove {
		return
	}
	var st unix.Stat_t
	if unix.Fstatat(ufd, b.id, &st, unix.AT_SYMLINK_NOFOLLOW) == nil &&
		uint32(st.Mode)&unix.S_IFMT == unix.S_IFIFO && int(st.Uid) == uid {
		_ = unix.Unlinkat(ufd, b.id, 0) // EACCES: another user's; its owner sweeps it
	}
	// The job's marker goes with its ticket: with no ticket there is nothing
	// left for it to authorise (jobmark.go).
	if unix.Fstatat(ufd, b.id+markSuffix, &st, unix.AT_SYMLINK_NOFOLLOW) == nil &&
		uint32(st.Mode)&unix.S_IFMT == unix.S_IFREG && int(st.Uid) == uid {
		_ = unix.Unlinkat(ufd, b.id+markSuffix, 0) // EACCES: another member's; its run removes it
	}
}
