//go:build !linux

package cli

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// peerUID is not read here: the keeper's directory, 0700, is the only
// guard (docs/acquire.md).
func peerUID(c *net.UnixConn) (int, error) { return syscall.Getuid(), nil }

// watchPid returns a channel closed once pid no longer exists, checked
// every second (start is not known here).
func watchPid(pid int, start uint64) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				return
			}
			time.Sleep(time.Second)
		}
	}()
	return gone
}

// bindPidStart checks that pid exists; its start time is not known here.
func bindPidStart(pid int) (uint64, error) {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return 0, err
	}
	return 0, nil
}

// closeInheritedOnExec is left undone here: descriptors inherited without
// close-on-exec pass to the keeper.
func closeInheritedOnExec() {}
