package boltstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/store"
)

// Bells are named pipes, one per waiting ticket, in <store>.bells/. The
// transaction that promotes a ticket writes one byte to its pipe after the
// commit, so a release wakes exactly the waiters it admitted, not the whole
// queue. A ring is a hint; a waiter that misses one finds out by its poll.

func bellDir(storePath string) string { return storePath + ".bells" }

type fifoBell struct {
	path string
	f    *os.File
	c    chan struct{}
	once sync.Once
}

// Watch makes the bell of ticket id: a named pipe the waiter keeps open for
// reading and writing, so that a ring never blocks and never finds no reader.
func (s *Store) Watch(ctx context.Context, id string) (store.Bell, error) {
	if err := store.CheckID(id); err != nil {
		return nil, err
	}
	dir := bellDir(s.path)
	dirMode := fs.FileMode(0o700)
	if s.mode&0o060 != 0 {
		dirMode = 0o770
	}
	if err := os.Mkdir(dir, dirMode); err == nil {
		if st, err := os.Stat(dir); err == nil {
			// Inherited from a setgid store directory: keep it, so that every
			// bell gets the shared group and any member can ring it.
			dirMode |= st.Mode() & fs.ModeSetgid
		}
		_ = os.Chmod(dir, dirMode)
	} else if !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: bell directory %s: %v", store.ErrUnavailable, dir, unwrapPath(err))
	}
	p := filepath.Join(dir, id)
	if err := unix.Mkfifo(p, uint32(s.mode)); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("%w: bell %s: %v", store.ErrUnavailable, p, err)
	}
	_ = os.Chmod(p, s.mode)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: bell %s: %v", store.ErrUnavailable, p, err)
	}
	b := &fifoBell{path: p, f: os.NewFile(uintptr(fd), p), c: make(chan struct{}, 1)}
	go b.listen()
	return b, nil
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
		os.Remove(b.path)
		b.f.Close()
	})
	return nil
}

// ring wakes the waiter of ticket id, if it is listening. Never blocks.
func ring(storePath, id string) {
	fd, err := unix.Open(filepath.Join(bellDir(storePath), id), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return // no bell (ENOENT) or no reader (ENXIO): nobody to wake
	}
	_, _ = unix.Write(fd, []byte{1}) // EAGAIN: the pipe is full of rings already
	unix.Close(fd)
}

// removeBell deletes the bell of a removed ticket, which its waiter may have
// left behind if it died.
func removeBell(storePath, id string) {
	_ = os.Remove(filepath.Join(bellDir(storePath), id))
}
