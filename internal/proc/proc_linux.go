package proc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown-boot"
	}
	return strings.TrimSpace(string(b))
})

// BootID is the kernel's id of the current boot; it changes at every reboot.
func BootID() string { return bootID() }

// Boottime is the time since boot on CLOCK_BOOTTIME: monotonic, counting
// through suspend, unmoved by setting the date.
func Boottime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_BOOTTIME): %v", err)) // cannot happen on Linux >= 2.6.39
	}
	return time.Duration(ts.Nano())
}

// PidNS is the inode of this process's pid namespace, 0 if unknown.
func PidNS() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}

// StartTime is the start time of process pid in clock ticks after boot
// (/proc/PID/stat field 22); with the boot id and pid it names one process
// for good, even after its pid is reused.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStatStart(b)
}

// parseStatStart takes field 22 of a /proc/PID/stat line; the command name
// (field 2) may hold spaces and parentheses, so fields count from the last ')'.
func parseStatStart(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat line")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0, fmt.Errorf("malformed stat line: %d fields", len(f)+2)
	}
	return strconv.ParseUint(f[19], 10, 64)
}
