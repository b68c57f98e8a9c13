package proc

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/store"
)

// maxWatched bounds the pidfds one waiter holds: a limit's holders, in
// practice a handful.
const maxWatched = 64

// WatchHolders watches the supervisors of tickets held on this host (same
// boot, same pid namespace) through pidfds, and closes the channel when one
// of them exits, so that a waiter learns of a holder's death at once
// instead of at its next renewal. A pid from the store is only a hint here:
// a forged one costs a needless sweep, which judges for itself. stop ends
// the watch; the channel then stays open.
func WatchHolders(holders []store.Ticket) (died <-chan struct{}, stop func()) {
	c := make(chan struct{})
	fds, gone := openHolders(holders)
	if gone {
		closeAll(fds)
		close(c) // one is gone already: sweep now
		return c, func() {}
	}
	if len(fds) == 0 {
		return c, func() {}
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		closeAll(fds)
		return c, func() {}
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			var one = [8]byte{1}
			_, _ = unix.Write(efd, one[:])
		})
	}
	go pollHolders(c, efd, fds)
	return c, stop
}

// openHolders opens a pidfd on the supervisor of each ticket held on this
// host (at most maxWatched). gone: one of them is gone already (its pid
// is free, or names another process now); fds are the pidfds opened.
func openHolders(holders []store.Ticket) (fds []int, gone bool) {
	boot, ns := BootID(), PidNS()
	for _, t := range holders {
		h := t.Holder
		if len(fds) == maxWatched || h.Pid <= 0 || h.BootID != boot || h.PidNS == 0 || h.PidNS != ns {
			continue
		}
		fd, err := pidfdOpen(h.Pid, 0)
		if errors.Is(err, unix.ESRCH) {
			gone = true
			continue
		}
		if err != nil {
			continue
		}
		// Checked after the open: the pidfd names the process that had the
		// pid then, so it is the supervisor only if the start time agrees.
		st, err := readStat(h.Pid)
		if err != nil || (h.PidStart != 0 && st.Start != h.PidStart) || exited(h.Pid, st) {
			unix.Close(fd)
			gone = true
			continue
		}
		fds = append(fds, fd)
	}
	return fds, gone
}

// pollHolders is the watch's goroutine: it closes c when one of the
// pidfds fds says its process exited, and returns without closing it when
// the eventfd efd is written (stop). It closes them all.
func pollHolders(c chan struct{}, efd int, fds []int) {
	defer unix.Close(efd)
	defer closeAll(fds)
	pfds := make([]unix.PollFd, 0, len(fds)+1)
	pfds = append(pfds, unix.PollFd{Fd: int32(efd), Events: unix.POLLIN})
	for _, fd := range fds {
		pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	for {
		_, err := unix.Poll(pfds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pfds[0].Revents != 0 {
			return
		}
		for _, p := range pfds[1:] {
			if p.Revents != 0 {
				close(c)
				return
			}
		}
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
