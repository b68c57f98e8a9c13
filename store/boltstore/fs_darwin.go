//go:build darwin

package boltstore

import (
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// networkFS reports whether the directory dirfd is on NFS or SMB, where flock does not
// protect a bbolt file reliably.
func networkFS(dirfd int) (string, bool) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(dirfd, &st); err != nil {
		return "", false
	}
	name := unix.ByteSliceToString(st.Fstypename[:])
	switch {
	case strings.HasPrefix(name, "nfs"):
		return "NFS", true
	case strings.HasPrefix(name, "smb"), strings.HasPrefix(name, "cifs"), name == "afpfs", name == "webdav":
		return name, true
	}
	return "", false
}

// mkfifoat makes the named pipe name in dirfd. x/sys has no mkfifoat for
// darwin: the pipe is made by path, then opened relative to dirfd and
// checked like any bell, so a directory swapped in between makes the open
// fail (and may leave an empty pipe behind there).
func mkfifoat(dirfd int, name, path string, mode uint32) error {
	return unix.Mkfifo(path, mode)
}

func ctime(st *unix.Stat_t) time.Time { return time.Unix(st.Ctim.Unix()) }

// openPipe opens the named pipe name of uid in dirfd for writing without
// blocking (see openPipeAt: darwin has no O_PATH).
func openPipe(dirfd int, name string, uid int) (int, error) { return openPipeAt(dirfd, name, uid) }

// openRegular opens the regular file name in dirfd (see openRegularAt).
func openRegular(dirfd int, name string, flags int, st *unix.Stat_t) (int, error) {
	return openRegularAt(dirfd, name, flags, st)
}
