//go:build darwin || freebsd || netbsd || openbsd

package jobserver

// fionread is FIONREAD, _IOR('f', 127, int), which x/sys/unix does not
// name on these systems.
const fionread = 0x4004667f
