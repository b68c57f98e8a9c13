//go:build !linux && !darwin

package boltstore

import (
	"time"

	"golang.org/x/sys/unix"
)

// networkFS cannot tell here; the README says to keep the store local.
func networkFS(dirfd int) (string, bool) { return "", false }

// mkfifoat makes the named pipe name by path here (see fs_darwin.go).
func mkfifoat(dirfd int, name, path string, mode uint32) error {
	return unix.Mkfifo(path, mode)
}

func ctime(st *unix.Stat_t) time.Time { return time.Unix(st.Ctim.Unix()) }

// openPipe opens the named pipe name of uid in dirfd for writing without
// blocking (see openPipeAt).
func openPipe(dirfd int, name string, uid int) (int, error) { return openPipeAt(dirfd, name, uid) }

// openRegular opens the regular file name in dirfd (see openRegularAt).
func openRegular(dirfd int, name string, flags int, st *unix.Stat_t) (int, error) {
	return openRegularAt(dirfd, name, flags, st)
}
