package boltstore

import (
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
