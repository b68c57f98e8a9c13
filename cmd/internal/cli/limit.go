package cli

import (
	"context"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// LimitSetOptions are slotctl limit set's arguments.
type LimitSetOptions struct {
	Name  string
	Slots int
}

// LimitLsOptions are slotctl limit ls's flags and arguments.
type LimitLsOptions struct {
	Output string // table or json
	Limits []string
}

// LimitRmOptions are slotctl limit rm's flags and argument.
type LimitRmOptions struct {
	Name  string
	Force bool // remove the limit's tickets too
}

// limitRunFs are the test seams of limit's subcommands; nil runs them.
type limitRunFs struct {
	set func(*LimitSetOptions) error
	ls  func(*LimitLsOptions) error
	rm  func(*LimitRmOptions) error
}

func newLimitCmd(f *Factory, g *globalOptions, runFs limitRunFs) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limit",
		Short: "Create, resize, list and remove limits",
		Long: `Create, resize, list and remove limits. A limit is a named pool of slots;
slotctl run also creates the limits it is asked for (with --slots, else the
config file's limits.NAME, else 1 slot).`,
		Annotations: manPage(`EXIT STATUS
  0    done
  64   unknown subcommand, bad name or slot count, or no such limit
  69   the store cannot be opened or reached`),
		Example: `  slotctl limit set build 2
  slotctl limit ls
  slotctl limit rm old-build`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return errArgs(cmd, "unknown command %q for %q: want set, ls or rm", args[0], cmd.CommandPath())
		},
	}
	cmd.AddCommand(newLimitSetCmd(f, g, runFs.set), newLimitLsCmd(f, g, runFs.ls), newLimitRmCmd(f, g, runFs.rm))
	return cmd
}

func newLimitSetCmd(f *Factory, g *globalOptions, runF func(*LimitSetOptions) error) *cobra.Command {
	o := &LimitSetOptions{}
	cmd := &cobra.Command{
		Use:   "set NAME SLOTS",
		Short: "Create a limit or change its number of slots",
		Long: `Create a limit or change its number of slots.

0 slots pauses the limit: nobody new is admitted. Shrinking never evicts a
holder: new admissions wait until fewer than SLOTS are held. Growing admits
waiters at once.`,
		Annotations: manPage(`EXIT STATUS
  0    the limit has SLOTS slots
  64   bad name or slot count
  69   the store cannot be opened or reached`),
		Example: `  slotctl limit set build 4
  slotctl limit set deploy 0   # pause deploys`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return errArgs(cmd, "want NAME SLOTS, e.g. slotctl limit set build 2")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := checkLimitName("limit name", o.Name); err != nil {
				return err
			}
			n, err := strconv.Atoi(args[1])
			if err != nil || store.CheckSlots(n) != nil {
				return usageError("slot count %q: want a whole number 0..%d (0 pauses the limit)", args[1], store.MaxSlots)
			}
			o.Slots = n
			if runF != nil {
				return runF(o)
			}
			return runLimitSet(cmd.Context(), f, g, o)
		},
	}
	cmd.Flags().SetInterspersed(false) // "limit set build -1" is a bad count, not a flag
	return cmd
}

// runLimitSet is slotctl limit set: create or resize.
func runLimitSet(ctx context.Context, f *Factory, g *globalOptions, o *LimitSetOptions) error {
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	l, err := st.SetLimit(ctx, o.Name, o.Slots)
	if err != nil {
		return err
	}
	newLogger(f, g).info("limit %q: %d slots (%d held, %d waiting)", l.Name, l.Slots, l.Held, l.Waiting)
	return nil
}

func newLimitLsCmd(f *Factory, g *globalOptions, runF func(*LimitLsOptions) error) *cobra.Command {
	o := &LimitLsOptions{}
	cmd := &cobra.Command{
		Use:   "ls [NAME...]",
		Short: "List limits: slots, held, waiting",
		Long:  `List limits with their slots and how many tickets hold and wait.`,
		Annotations: manPage(`EXIT STATUS
  0    listed
  64   bad flag, or no such limit
  69   the store cannot be opened or reached`),
		Example: `  slotctl limit ls
  slotctl limit ls -o json | jq '.limits[] | select(.waiting > 0) | .name'`,
		ValidArgsFunction: f.completeLimits,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Limits = args
			if err := checkOutput(o.Output, outTable, outJSON); err != nil {
				return err
			}
			if err := checkLimitNames("limit", o.Limits); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return runLimitLs(cmd.Context(), f, g, o)
		},
	}
	addOutputFlag(cmd, &o.Output, "output format: table or json")
	return cmd
}

// runLimitLs is slotctl limit ls.
func runLimitLs(ctx context.Context, f *Factory, g *globalOptions, o *LimitLsOptions) error {
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	snap, err := st.Snapshot(ctx, o.Limits...)
	if err != nil {
		return err
	}
	if o.Output == outJSON {
		return writeLimitsJSON(f.IO.Out, snap)
	}
	return drawLimits(f.tableOut(), snap.Limits)
}

func newLimitRmCmd(f *Factory, g *globalOptions, runF func(*LimitRmOptions) error) *cobra.Command {
	o := &LimitRmOptions{}
	cmd := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a limit",
		Long: `Remove a limit. A limit that still has tickets is refused unless --force,
which removes its tickets too (their holders find out at their next renewal).
Its counters (slotctl metrics) go with it: a limit made again under the same
name counts from zero.`,
		Annotations: manPage(`EXIT STATUS
  0    removed
  64   no such limit, or it has tickets and --force was not given
  69   the store cannot be opened or reached`),
		Example: `  slotctl limit rm old-build`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errArgs(cmd, "want one limit NAME")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := checkLimitName("limit", o.Name); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return runLimitRm(cmd.Context(), f, g, o)
		},
	}
	cmd.Flags().BoolVar(&o.Force, "force", false, "remove the limit's tickets too")
	return cmd
}

// runLimitRm is slotctl limit rm.
func runLimitRm(ctx context.Context, f *Factory, g *globalOptions, o *LimitRmOptions) error {
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.RemoveLimit(ctx, o.Name, o.Force); err != nil {
		return err
	}
	newLogger(f, g).info("limit %q removed", o.Name)
	return nil
}

// limitsJSON is the schema of limit ls -o json.
type limitsJSON struct {
	SchemaVersion int          `json:"schema_version"`
	Limits        []limitEntry `json:"limits"`
}

type limitEntry struct {
	Name    string `json:"name"`
	Slots   int    `json:"slots"`
	Held    int    `json:"held"`
	Waiting int    `json:"waiting"`
	Paused  bool   `json:"paused"`
	Created string `json:"created"`
}

func limitEntryOf(l store.Limit) limitEntry {
	return limitEntry{Name: l.Name, Slots: l.Slots, Held: l.Held, Waiting: l.Waiting, Paused: l.Slots == 0, Created: rfc3339(l.Created)}
}

func writeLimitsJSON(w io.Writer, snap store.Snapshot) error {
	out := limitsJSON{SchemaVersion: 1, Limits: []limitEntry{}}
	for _, l := range snap.Limits {
		out.Limits = append(out.Limits, limitEntryOf(l))
	}
	return writeJSON(w, out)
}
