//go:build !linux

package proc

import (
	"errors"
	"time"
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
