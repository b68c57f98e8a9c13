package boltstore

import "golang.org/x/sys/unix"

// networkFS reports whether dir is on NFS or SMB/CIFS, where flock does not
// protect a bbolt file reliably.
func networkFS(dir string) (string, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
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
