package cli

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// childAttr: the child's own process group off a terminal, and SIGKILL when
// slotctl dies, so a SIGKILLed slotctl leaves no unleased job running (C8).
func childAttr(ownGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: ownGroup, Pdeathsig: syscall.SIGKILL}
}

// becomeSubreaper makes the job's orphans (a grandchild whose parent exited)
// slotctl's children instead of init's, so slotctl can reap them while it
// drains the job's process group: an unreaped zombie still counts as a
// member, and init is not always quick (or present) in containers.
func becomeSubreaper() {
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// reapOrphans collects every exited orphan. Only called after the child
// itself has been waited for, so it cannot steal the child's status.
func reapOrphans() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
