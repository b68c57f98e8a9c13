package cli

import (
	"fmt"
	"io"
)

// logger prints slotctl's own messages on stderr as "slotctl: ...", minding
// -q and -v, one line each with no control character (escapeControls).
type logger struct {
	w     io.Writer
	quiet bool
	loud  bool
}

func newLogger(f *Factory, g *globalOptions) *logger {
	return &logger{w: f.IO.ErrOut, quiet: g.Quiet, loud: g.Verbose}
}

func (l *logger) warn(format string, args ...any) {
	fmt.Fprintf(l.w, "slotctl: %s\n", escapeControls(fmt.Sprintf(format, args...)))
}

func (l *logger) info(format string, args ...any) {
	if !l.quiet {
		fmt.Fprintf(l.w, "slotctl: %s\n", escapeControls(fmt.Sprintf(format, args...)))
	}
}

func (l *logger) verbose(format string, args ...any) {
	if l.loud {
		fmt.Fprintf(l.w, "slotctl: %s\n", escapeControls(fmt.Sprintf(format, args...)))
	}
}
