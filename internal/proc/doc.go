// Package proc reads what the host says about its clocks and processes: the
// boot-time clock and boot id that bbolt deadlines are judged by, and the
// identity of a process (pid namespace, start time) that proves a holder dead.
package proc
