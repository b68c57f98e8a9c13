//go:build !linux

package proc

import (
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/slotctl/slotctl/store"
)

// BootID is "unknown-boot" where the kernel does not name its boots; the
// README says what that costs (no proof of death across reboots).
func BootID() string { return "unknown-boot" }

// Boottime falls back to the wall clock elsewhere than Linux.
func Boottime() time.Duration { return time.Duration(time.Now().UnixNano()) }

// PidNS is 0 (unknown) elsewhere than Linux.
func PidNS() uint64 { return 0 }

// StartTime is not known elsewhere than Linux.
func StartTime(pid int) (uint64, error) { return 0, errors.ErrUnsupported }

// Liveness is what a probe can say of one process identity.
type Liveness int

// The answers of Identify.
const (
	Alive Liveness = iota
	Gone
	Reused
)

// Identify cannot prove anything here: every holder is alive until its TTL.
func Identify(pid int, start uint64) Liveness { return Alive }

// GroupEmpty cannot prove anything here.
func GroupEmpty(pgid int) bool { return false }

// realHost knows nothing here but the boot id.
type realHost struct{}

func (realHost) BootID() string                                  { return BootID() }
func (realHost) PidNS() uint64                                   { return 0 }
func (realHost) Hostname() string                                { h, _ := os.Hostname(); return h }
func (realHost) TimeOffset() time.Duration                       { return 0 }
func (realHost) Self() int                                       { return os.Getpid() }
func (realHost) Pids() ([]int, error)                            { return nil, errors.ErrUnsupported }
func (realHost) Stat(int) (Stat, error)                          { return Stat{}, errors.ErrUnsupported }
func (realHost) Exited(int, Stat) bool                           { return false }
func (realHost) Dying(int, Stat) bool                            { return false }
func (realHost) Environ(int) ([]byte, error)                     { return nil, errors.ErrUnsupported }
func (realHost) UID(int) int                                     { return -1 }
func (realHost) Kill(int, syscall.Signal) error                  { return errors.ErrUnsupported }
func (realHost) SignalIf(int, syscall.Signal, func() bool) error { return errors.ErrUnsupported }

// A Host other than this one is read as on Linux; this one proves nothing.
func (r reader) identify(pid int, start uint64) Liveness { return Alive }
func (r reader) groupEmpty(pgid int) bool                { return false }
func (r reader) sameGroup(pgid int, start uint64) bool   { return false }
func (r reader) running(pid int, start uint64) bool      { return false }

// KillGroup is not attempted here.
func KillGroup(pgid int, wait time.Duration) bool { return false }

type job struct {
	procs  []struct{ pgrp, uid int }
	marker Marker
	unread int
}

func findJob(id string, pgid int) (job, error) { return local.findJob(id, pgid) }

func (r reader) findJob(id string, pgid int) (job, error) { return job{}, errors.ErrUnsupported }

func (r reader) killJob(id string, pgid int, j job, wait time.Duration) bool { return false }

// IsAncestor cannot be told here.
func IsAncestor(pid int, start uint64) bool { return false }

// AncestryKnown: IsAncestor is not implemented here.
func AncestryKnown() bool { return false }

// WatchHolders watches nothing where there are no pidfds: waiters learn of
// a holder's death by their sweeps.
func WatchHolders([]store.Ticket) (<-chan struct{}, func()) {
	return make(chan struct{}), func() {}
}
