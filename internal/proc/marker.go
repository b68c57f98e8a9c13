package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The variables by which a job's processes say whose they are. slotctl run
// exports both to its child, and every process the child starts inherits
// them: they are what a reaper identifies a job by (docs/leases.md §4.5), and what a
// nested run proves its ancestor by.
const (
	TicketVar     = "SLOTCTL_TICKET"
	SupervisorVar = "SLOTCTL_SUPERVISOR"
)

// A Marker names a supervisor for good: its pid, its start time (clock
// ticks after boot) and its pid namespace. SLOTCTL_SUPERVISOR holds it as
// PID:START:PIDNS, e.g. 4242:987654:4026531836.
type Marker struct {
	Pid   int
	Start uint64
	PidNS uint64
}

func (m Marker) String() string { return fmt.Sprintf("%d:%d:%d", m.Pid, m.Start, m.PidNS) }

// ParseMarker reads a SLOTCTL_SUPERVISOR value; all three parts are
// required and positive.
func ParseMarker(s string) (Marker, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Marker{}, errors.New("want PID:START:PIDNS")
	}
	pid, err := strconv.Atoi(parts[0])
	if err != nil || pid <= 0 || parts[0] != strconv.Itoa(pid) {
		return Marker{}, errors.New("want PID:START:PIDNS: bad pid")
	}
	start, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || start == 0 || parts[1] != strconv.FormatUint(start, 10) {
		return Marker{}, errors.New("want PID:START:PIDNS: bad start time")
	}
	ns, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || ns == 0 || parts[2] != strconv.FormatUint(ns, 10) {
		return Marker{}, errors.New("want PID:START:PIDNS: bad pid namespace")
	}
	return Marker{Pid: pid, Start: start, PidNS: ns}, nil
}

// SelfMarker is this process's own marker, for the job it supervises; ok is
// false where the start time or pid namespace cannot be known (not Linux).
func SelfMarker() (Marker, bool) {
	m := Marker{Pid: os.Getpid(), PidNS: PidNS()}
	m.Start, _ = StartTime(m.Pid)
	return m, m.Start != 0 && m.PidNS != 0
}
