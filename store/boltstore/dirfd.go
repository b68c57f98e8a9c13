package boltstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Every file of a store is reached from one descriptor of its directory
// (docs/leases.md §4.5): the directory is opened once per Store without following a
// symlink and checked, and the store file, its lock and its bells are opened,
// made and removed relative to it, never by a path that a member of a shared
// directory could redirect between two calls. Nothing is followed through a
// symlink (O_NOFOLLOW on every name, and every name is one component), nothing
// is chmodded but through a descriptor, and every file is fstat'ed for its
// type before it is used.

// openDirFD opens the directory at path without following a final symlink.
func openDirFD(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openTrustedLink opens the directory a symlinked store directory points
// to, when the link is root's or the caller's own: nobody else could have
// planted it, so following it redirects nothing (an operator's
// /var/lib/slotctl -> /srv/slotctl, a home on another disk). A link anyone
// else owns is refused with err, what opening it gave (ELOOP or ENOTDIR).
func openTrustedLink(dir string, err error) (int, error) {
	var st unix.Stat_t
	if unix.Lstat(dir, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return -1, err
	}
	if st.Uid != 0 && st.Uid != uint32(os.Geteuid()) {
		return -1, err
	}
	target, rerr := filepath.EvalSymlinks(dir)
	if rerr != nil {
		return -1, err
	}
	return openDirFD(target)
}

// openDirAt opens the directory name in dirfd without following a symlink.
func openDirAt(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openat opens name in dirfd, one component, never through a symlink.
func openat(dirfd int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// unsafeDir says why a directory that others could fill is not to be used:
// writable by everyone without the sticky bit, anyone may replace any file
// in it (docs/leases.md §4.5). "" if it is fine.
func unsafeDir(st *unix.Stat_t) string {
	if uint32(st.Mode)&unix.S_IFMT != unix.S_IFDIR {
		return "is not a directory"
	}
	if uint32(st.Mode)&unix.S_IWOTH != 0 && uint32(st.Mode)&unix.S_ISVTX == 0 {
		return fmt.Sprintf("is writable by everyone and not sticky (mode %s): anyone could replace the store's files; "+
			"remove the write bit for others, or set the sticky bit", fileMode(uint32(st.Mode)))
	}
	return ""
}

// fileMode is a raw st_mode as ls shows it.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	return mode
}

// kind names a file type for an error message.
func kind(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a named pipe"
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device"
	}
	return fmt.Sprintf("a file of type %o", m&unix.S_IFMT)
}

// pathError is an error of an *at call on one of a store's names, naming
// path: a symlink said as such, the rest as the system says (wrapped, so
// that errors.Is sees fs.ErrPermission).
func pathError(path string, err error) error {
	if errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("%s is a symbolic link: slotctl does not follow one in a store", path)
	}
	return fmt.Errorf("%s: %w", path, err)
}

// regularFile opens the regular file name in dirfd for the store: without
// following a symlink, and refusing anything but a regular file with one
// link (a hard link to a file elsewhere has two) before it is opened for
// reading or writing at all (openRegular), so that a named pipe or a device
// put in its place is neither waited for nor touched. With create it makes a
// missing file with mode, learning from O_EXCL whether this call made it,
// and sets the mode on the descriptor (the umask narrowed it; a shared
// store's files must stay group-writable). path is for messages only; errors
// name it. A missing file without create wraps fs.ErrNotExist. The size is
// the file's when it was opened.
func regularFile(dirfd int, name, path string, flags int, create bool, mode fs.FileMode) (*os.File, int64, error) {
	var st unix.Stat_t
	// The file is there but the first time: open it first, create it if not.
	fd, err := openRegular(dirfd, name, flags, &st)
	created := false
	if create && errors.Is(err, unix.ENOENT) {
		fd, err = openat(dirfd, name, flags|unix.O_CREAT|unix.O_EXCL, uint32(mode.Perm()))
		if err == nil {
			created = true
			if err = unix.Fstat(fd, &st); err != nil {
				unix.Close(fd)
			}
		} else if errors.Is(err, unix.EEXIST) { // made by another process just now
			fd, err = openRegular(dirfd, name, flags, &st)
		}
	}
	switch {
	case errors.Is(err, errNotRegular) && uint32(st.Mode)&unix.S_IFMT != unix.S_IFREG:
		return nil, 0, fmt.Errorf("%s is %s, not a regular file: slotctl does not use it", path, kind(uint32(st.Mode)))
	case errors.Is(err, errNotRegular):
		return nil, 0, fmt.Errorf("%s has %d hard links, want 1: it may be another file's name; slotctl does not use it", path, st.Nlink)
	case errors.Is(err, unix.ENOENT):
		return nil, 0, fmt.Errorf("%s: %w", path, fs.ErrNotExist)
	case err != nil:
		return nil, 0, pathError(path, err)
	}
	if created {
		if err := unix.Fchmod(fd, uint32(mode.Perm())); err != nil {
			unix.Close(fd)
			return nil, 0, pathError(path, err)
		}
	}
	return os.NewFile(uintptr(fd), path), st.Size, nil
}

// errNotRegular: openRegular found something else than a regular file with
// one link, and did not open it.
var errNotRegular = errors.New("not a regular file with one link")

func isRegular(st *unix.Stat_t) bool {
	return uint32(st.Mode)&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1
}

// openRegularAt is openRegular without O_PATH: name is opened without
// following a symlink and without blocking (a named pipe in its place
// would block an open for reading forever), then checked on the descriptor.
func openRegularAt(dirfd int, name string, flags int, st *unix.Stat_t) (int, error) {
	fd, err := openat(dirfd, name, flags|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Fstat(fd, st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if !isRegular(st) {
		unix.Close(fd)
		return -1, errNotRegular
	}
	// A regular file: O_NONBLOCK only guarded the open.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
