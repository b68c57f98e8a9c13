package main

import "syscall"

// childAttr: the child's own process group off a terminal, and SIGKILL when
// slotctl dies, so a SIGKILLed slotctl leaves no unleased job running (C8).
func childAttr(ownGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: ownGroup, Pdeathsig: syscall.SIGKILL}
}
