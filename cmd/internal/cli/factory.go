package cli

import (
	"io"
	"os"
	"time"

	"github.com/spf13/viper"
	"golang.org/x/term"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// IOStreams are a command's standard streams and what they are attached to.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
	// InTTY, OutTTY, ErrTTY: stdin, stdout and stderr are terminals.
	InTTY, OutTTY, ErrTTY bool
}

// SystemIO is the process's own streams.
func SystemIO() *IOStreams {
	return &IOStreams{
		In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr,
		InTTY:  term.IsTerminal(int(os.Stdin.Fd())),
		OutTTY: term.IsTerminal(int(os.Stdout.Fd())),
		ErrTTY: term.IsTerminal(int(os.Stderr.Fd())),
	}
}

// Factory carries everything a command takes from its surroundings, so that
// tests can build many command trees in one process. Nothing here is global.
type Factory struct {
	Version, Commit, Date string
	IO                    *IOStreams
	// Getenv and Environ are the environment the commands read (settings,
	// NO_COLOR and the terminal's colour profile, HOME, the job variables);
	// a test gives each command tree its own.
	Getenv  func(string) string
	Environ func() []string
	Now     func() time.Time
	// StoreClock is the bbolt store's clock; nil is the host's boot-time
	// clock. Tests of the built binary shift it to test expiry without sleeping.
	StoreClock boltstore.Clock
	// TermWidth and ErrWidth are the widths of the terminals on stdout and
	// stderr, 0 if unknown (or nil).
	TermWidth, ErrWidth func() int
	// Identity, if not nil, replaces the holder identity that run records
	// (host, boot id, pid namespace, pid, user): tests make one machine
	// look like several hosts sharing a store. Nil is the real one.
	Identity func() store.Holder
	// CPUs, if not nil, replaces the host's CPU count, which bounds a
	// --jobserver build's jobs by default. Nil is runtime.NumCPU.
	CPUs func() int
	// ExitAfterMain: the process exits as soon as Main returns (the two
	// mains), so run leaves its signal handlers in place rather than
	// undoing them: signal.Stop hands each of its seven signals to the
	// runtime's signal-mask thread and back, about 0.5 ms of a run -- true.
	// Tests that call Main many times in one process leave it false.
	ExitAfterMain bool

	viper *viper.Viper // made fresh for each Main
	cfg   *config      // resolved by the root command before any RunE
}

// NewFactory returns the production factory.
func NewFactory(version, commit, date string) *Factory {
	return &Factory{Version: version, Commit: commit, Date: date, IO: SystemIO(), Getenv: os.Getenv, Environ: os.Environ, Now: time.Now,
		TermWidth: func() int { return termWidth(os.Stdout) },
		ErrWidth:  func() int { return termWidth(os.Stderr) }}
}

// termWidth is the width of the terminal on f, 0 if it is none.
func termWidth(f *os.File) int {
	w, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return w
}

// width calls a width function that may be nil.
func width(fn func() int) int {
	if fn == nil {
		return 0
	}
	return fn()
}

// environ is the factory's environment as termenv (lipgloss) reads it:
// colour comes from Getenv (TERM, COLORTERM, NO_COLOR, CLICOLOR_FORCE), not
// from the process's environment.
type environ struct{ f *Factory }

func (e environ) Getenv(k string) string { return e.f.Getenv(k) }

func (e environ) Environ() []string {
	if e.f.Environ == nil {
		return nil
	}
	return e.f.Environ()
}
