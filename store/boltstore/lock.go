package boltstore

import (
	"context"
	"errors"
	"io/fs"
	"time"

	"golang.org/x/sys/unix"
)

var errLockTimeout = errors.New("lock timeout")

// lockFile takes an flock on the lock file name in dirfd (exclusive for
// writers, shared for readers) and returns its release. The file is opened
// as the store file is (regularFile): never through a symlink, a regular
// file with one link, made with O_EXCL and its mode set on the descriptor;
// path is its name in messages. bbolt's own lock polls every 50 ms; this one
// blocks in the kernel, so the next process gets the store the moment the
// previous one lets go. The blocking call runs in a goroutine so that the
// timeout and ctx still bound the wait.
func lockFile(ctx context.Context, dirfd int, name, path string, mode fs.FileMode, exclusive bool, timeout time.Duration) (func(), error) {
	f, _, err := regularFile(dirfd, name, path, unix.O_RDWR, true, mode)
	if err != nil && !exclusive && errors.Is(err, fs.ErrPermission) {
		// a reader without write access may still lock shared
		f, _, err = regularFile(dirfd, name, path, unix.O_RDONLY, false, 0)
	}
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	fd := int(f.Fd())
	release := func() { f.Close() } // closing the only descriptor drops the lock
	if err := unix.Flock(fd, how|unix.LOCK_NB); err == nil {
		return release, nil
	} else if !errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		for {
			err := unix.Flock(fd, how)
			if !errors.Is(err, unix.EINTR) {
				done <- err
				return
			}
		}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, err
		}
		return release, nil
	case <-timer.C:
		err = errLockTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	// Abandon the wait; if the lock is granted later, drop it at once.
	go func() { <-done; f.Close() }()
	return nil, err
}
