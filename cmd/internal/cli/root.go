package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// globalOptions are the flags every command takes (docs/leases.md §2).
type globalOptions struct {
	Store        string
	Config       string
	StoreTimeout time.Duration
	Quiet        bool
	Verbose      bool
}

// Main runs slotctl with args and returns its exit status. It prints errors
// itself, once, as "slotctl: ...".
func Main(ctx context.Context, args []string, f *Factory) int {
	return mainWith(ctx, args, f, runFs{})
}

// mainWith is Main with the given run functions (tests of flag parsing).
func mainWith(ctx context.Context, args []string, f *Factory, rf runFs) (code int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(f.IO.ErrOut, "slotctl: internal error (a bug, please report it): %s\n", escapeControls(fmt.Sprint(r)))
			code = exitInternal
		}
	}()
	root := newRootCmdWith(f, rf)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var ee *ExitError
	if err != nil && !errors.As(err, &ee) && strings.HasPrefix(err.Error(), "unknown command ") {
		// cobra's own argument errors: a typo in a cron line must not pass as success or as a bug.
		err = &ExitError{Code: exitUsage, Err: unknownCommand(err), Hint: "see 'slotctl --help'"}
	}
	if err != nil {
		printError(f.IO.ErrOut, err)
	}
	return exitCode(err)
}

// unknownCommand rewrites cobra's "unknown command" error as one line.
// cobra lists its suggestions on lines of their own, each after a tab
// ("...\n\nDid you mean this?\n\tls\n\tlog\n"), which the one-line error
// would show as a literal \t: they become "...: did you mean ls or log?".
func unknownCommand(err error) error {
	first, rest, _ := strings.Cut(err.Error(), "\n")
	var suggestions []string
	for _, line := range strings.Split(rest, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasSuffix(line, "?") { // not "Did you mean this?"
			suggestions = append(suggestions, line)
		}
	}
	if len(suggestions) == 0 {
		return errors.New(first)
	}
	return fmt.Errorf("%s: did you mean %s?", first, orList(suggestions))
}

// runFs are the commands' run functions, replaced in tests that check
// flag parsing alone (cli/cli's NewCmdX(f, runF)); nil fields run the command.
type runFs struct {
	run        func(*RunOptions) error
	acquire    func(*AcquireOptions) error
	ls         func(*LsOptions) error
	limit      limitRunFs
	reap       func(*ReapOptions) error
	release    func(*ReleaseOptions) error
	log        func(*LogOptions) error
	version    func(*VersionOptions) error
	completion func(*CompletionOptions) error
	metrics    func(*MetricsOptions) error
	stats      func(*StatsOptions) error
}

// newRootCmdWith is the command tree with the given run functions.
func newRootCmdWith(f *Factory, rf runFs) *cobra.Command {
	g := &globalOptions{}
	root := &cobra.Command{
		Use:   "slotctl",
		Short: "Gate shell jobs, cron jobs and CI steps behind named concurrency limits",
		Long: `slotctl gates shell jobs, cron jobs and CI steps behind named concurrency limits.

A job asks for a slot, waits its turn, runs, and gives the slot back. When the
job, its wrapper or its whole machine dies, the slot still comes back.`,
		Annotations: manPage(`EXIT STATUS
  0    success
  64   usage error: bad flag, bad limit name, --slots disagrees with the limit
  69   the store cannot be opened or reached
  70   internal error (a bug)
  75   run, acquire: not admitted within --wait (--busy-exit-code changes it)
  76   run: the lease was lost while COMMAND ran, and COMMAND was stopped
  124  run: --max-hold ran out and COMMAND was stopped
  126  run: COMMAND is not executable
  127  run: COMMAND was not found
  Otherwise run exits with COMMAND's exit status, or 128+N if it was killed by signal N.`),
		Example: `  slotctl run --limit build --slots 2 -- make -j8
  slotctl limit set backup 1
  slotctl limit ls`,
		Version:           f.versionString(),
		SilenceErrors:     true,
		SilenceUsage:      true,
		DisableAutoGenTag: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := f.loadConfig(cmd); err != nil {
				return err
			}
			if g.Quiet && g.Verbose {
				return usageError("-q/--quiet and -v/--verbose: pick one")
			}
			return checkDuration("store-timeout", g.StoreTimeout, 10*time.Millisecond, 10*time.Minute)
		},
	}
	root.SetIn(f.IO.In)
	root.SetOut(f.IO.Out)
	root.SetErr(f.IO.ErrOut)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		var inv *pflag.InvalidValueError
		if errors.As(err, &inv) {
			// pflag names the input; say what would be accepted instead of its parser's words.
			err = fmt.Errorf("--%s %q: %s", inv.GetFlag().Name, inv.GetValue(), acceptedFor(inv.GetFlag()))
		}
		return &ExitError{Code: exitUsage, Err: err, Hint: fmt.Sprintf("see '%s --help'", cmd.CommandPath())}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.Store, "store", "", "store URL: PATH, bolt://PATH, etcd://HOST:PORT[/PREFIX] or postgres://USER@HOST/DB (env SLOTCTL_STORE; more: slotctl help store)")
	pf.StringVar(&g.Config, "config", "", "config file (env SLOTCTL_CONFIG; default $XDG_CONFIG_HOME/slotctl/config.yaml, then /etc/slotctl/config.yaml)")
	pf.DurationVar(&g.StoreTimeout, "store-timeout", 5*time.Second, "how long to wait for a locked or unreachable store (env SLOTCTL_STORE_TIMEOUT)")
	pf.BoolVarP(&g.Quiet, "quiet", "q", false, "print only errors")
	pf.BoolVarP(&g.Verbose, "verbose", "v", false, "say more about what happens")
	addEtcdFlags(pf)

	root.AddCommand(newRunCmd(f, g, rf.run), newAcquireCmd(f, g, rf.acquire), newKeeperCmd(f), newLsCmd(f, g, rf.ls), newLimitCmd(f, g, rf.limit), newReapCmd(f, g, rf.reap),
		newReleaseCmd(f, g, rf.release), newLogCmd(f, g, rf.log), newVersionCmd(f, rf.version), newCompletionCmd(f, rf.completion),
		newMetricsCmd(f, g, rf.metrics), newStatsCmd(f, g, rf.stats), newStoreTopic())
	root.AddCommand(extraCommands()...)
	setHelp(root)
	return root
}

// errArgs is the usage error for wrong positional arguments.
func errArgs(cmd *cobra.Command, format string, args ...any) error {
	return &ExitError{Code: exitUsage, Err: fmt.Errorf(format, args...), Hint: fmt.Sprintf("see '%s --help'", cmd.CommandPath())}
}
