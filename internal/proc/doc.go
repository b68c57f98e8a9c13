// Package proc reads what the host says about its clocks and processes: the
// boot-time clock and boot id that bbolt deadlines are judged by, the
// identity of a process (pid namespace, start time) that proves a holder
// dead, and the job of a ticket, known by what its own processes carry
// (SLOTCTL_TICKET, SLOTCTL_SUPERVISOR) rather than by the store's pids.
package proc
