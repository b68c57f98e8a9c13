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
	// InTTY and ErrTTY: stdin and stderr are terminals.
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
	Getenv                func(string) string
	Now                   func() time.Time
	// StoreClock is the bbolt store's clock; nil is the host's boot-time
	// clock. Tests of the built binary shift it to test expiry without sleeping.
	StoreClock boltstore.Clock
	// TermWidth is the width of the terminal on stdout, 0 if unknown.
	TermWidth func() int
	// Identity, if not nil, replaces the holder identity that run records
	// (host, boot id, pid namespace, pid, user): tests make one machine
	// look like several hosts sharing a store. Nil is the real one.
	Identity func() store.Holder

	viper *viper.Viper // made fresh for each Main
	cfg   *config      // resolved by the root command before any RunE
}

// NewFactory returns the production factory.
func NewFactory(version, commit, date string) *Factory {
	return &Factory{Version: version, Commit: commit, Date: date, IO: SystemIO(), Getenv: os.Getenv, Now: time.Now,
		TermWidth: func() int {
			w, _, err := term.GetSize(int(os.Stdout.Fd()))
			if err != nil {
				return 0
			}
			return w
		}}
}
