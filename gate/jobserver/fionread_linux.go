package jobserver

import "golang.org/x/sys/unix"

// fionread is the ioctl that counts a pipe's unread bytes (FIONREAD).
const fionread = unix.TIOCINQ
