//go:build !linux

package cli

import "syscall"

// childAttr: the child's own process group off a terminal. There is no
// parent-death signal here; the README says so.
func childAttr(ownGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: ownGroup}
}

func becomeSubreaper() {}

func reapOrphans() {}
