package cli

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// foregroundTTY reports whether slotctl runs on a terminal in its foreground
// process group (an interactive shell's foreground job).
func foregroundTTY() bool {
	fg, err := unix.IoctlGetInt(int(os.Stdin.Fd()), unix.TIOCGPGRP)
	return err == nil && fg == syscall.Getpgrp()
}
