//go:build darwin

package boltstore

import (
	"strings"

	"golang.org/x/sys/unix"
)

// networkFS reports whether dir is on NFS or SMB, where flock does not
// protect a bbolt file reliably.
func networkFS(dir string) (string, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
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
