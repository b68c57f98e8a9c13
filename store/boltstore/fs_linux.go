package boltstore

import (
	"errors"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// networkFS reports whether the directory dirfd is on NFS or SMB/CIFS, where flock does not
// protect a bbolt file reliably.
func networkFS(dirfd int) (string, bool) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(dirfd, &st); err != nil {
		return "", false
	}
	switch uint32(st.Type) {
	case unix.NFS_SUPER_MAGIC:
		return "NFS", true
	case unix.CIFS_SUPER_MAGIC, unix.SMB_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC:
		return "SMB/CIFS", true
	}
	return "", false
}

// mkfifoat makes the named pipe name in dirfd; path is its name for
// systems without mkfifoat.
func mkfifoat(dirfd int, name, path string, mode uint32) error {
	return unix.Mknodat(dirfd, name, unix.S_IFIFO|mode, 0)
}

func ctime(st *unix.Stat_t) time.Time { return time.Unix(st.Ctim.Unix()) }

// openPipe opens the named pipe name in dirfd for writing without blocking,
// if it is a named pipe of uid; anything else is not opened at all (a
// regular file is not opened for writing, even one hard-linked here): an
// O_PATH descriptor is checked first and the pipe then opened through it.
// ENXIO: no reader.
func openPipe(dirfd int, name string, uid int) (int, error) {
	pfd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFIFO || int(st.Uid) != uid {
		return -1, unix.EPERM
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if errors.Is(err, unix.ENOENT) && !procMounted() {
		return openPipeAt(dirfd, name, uid) // no /proc: check, open, check again
	}
	return fd, err
}

func procMounted() bool {
	var st unix.Stat_t
	return unix.Stat("/proc/self/fd", &st) == nil
}

// openRegular opens the regular file name in dirfd with flags if it is a
// regular file with one link (else errNotRegular, and st says what it is),
// never through a symlink. Nothing else is opened at all: an O_PATH
// descriptor is checked first and the file then opened through it.
func openRegular(dirfd int, name string, flags int, st *unix.Stat_t) (int, error) {
	pfd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, st); err != nil {
		return -1, err
	}
	if !isRegular(st) {
		return -1, errNotRegular
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if errors.Is(err, unix.ENOENT) && !procMounted() {
		return openRegularAt(dirfd, name, flags, st) // no /proc
	}
	return fd, err
}
