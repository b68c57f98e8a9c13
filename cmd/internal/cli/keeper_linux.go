package cli

import (
	"errors"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
)

// peerUID is the uid of the process at the other end of c, as the kernel
// recorded it when the connection was made (SO_PEERCRED).
func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if serr != nil {
		return -1, serr
	}
	return int(cred.Uid), nil
}

// watchPid returns a channel closed when the process pid, started at
// start (clock ticks after boot), has exited: at once if pid is already
// another process. It follows the process through a pidfd, so a pid
// reused later is never taken for it.
func watchPid(pid int, start uint64) <-chan struct{} {
	gone := make(chan struct{})
	fd, err := unix.PidfdOpen(pid, 0)
	// Opened first, checked second: the pidfd is then this process's.
	if err != nil || proc.Identify(pid, start) != proc.Alive {
		if err == nil {
			unix.Close(fd)
		}
		close(gone)
		return gone
	}
	go func() {
		defer close(gone)
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if err == nil || !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	return gone
}

// bindPidStart is the start time that identifies pid for --bind-pid.
func bindPidStart(pid int) (uint64, error) { return proc.StartTime(pid) }

// closeInheritedOnExec marks every descriptor above the standard three
// close-on-exec: those this process inherited without the mark would
// otherwise pass to every process it starts (Go marks its own).
func closeInheritedOnExec() {
	if unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	names, err := os.ReadDir("/proc/self/fd") // before Linux 5.11
	if err != nil {
		return
	}
	for _, n := range names {
		if fd, err := strconv.Atoi(n.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}
