//go:build !linux

package pgtest

import (
	"errors"
	"syscall"
)

// startable: a server is started only where it dies with the test binary.
func startable() error {
	return errors.New("a server is started on Linux only, where it dies with the test binary (Pdeathsig): set " + EnvURL + " to a server's URL")
}

func procAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}

func writeOwner(string) error   { return nil }
func sweep(string)              {}
func removeSegment(string) bool { return false }
