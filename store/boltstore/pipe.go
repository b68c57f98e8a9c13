package boltstore

import "golang.org/x/sys/unix"

// openPipeAt is openPipe where there is no O_PATH (or no /proc): name is
// checked with fstatat, opened without following a symlink, and checked
// again on the descriptor before anything is written to it. Only the owner
// of the directory can swap the entry in between, for a file of its own.
func openPipeAt(dirfd int, name string, uid int) (int, error) {
	var before, after unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &before, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, err
	}
	if uint32(before.Mode)&unix.S_IFMT != unix.S_IFIFO || int(before.Uid) != uid {
		return -1, unix.EPERM
	}
	fd, err := openat(dirfd, name, unix.O_WRONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Fstat(fd, &after); err != nil || after.Dev != before.Dev || after.Ino != before.Ino ||
		uint32(after.Mode)&unix.S_IFMT != unix.S_IFIFO || int(after.Uid) != uid {
		unix.Close(fd)
		return -1, unix.EPERM
	}
	return fd, nil
}
