package cli

import (
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

func newLimitCmd(f *Factory, g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limit",
		Short: "Create, resize, list and remove limits",
		Long: `Create, resize, list and remove limits. A limit is a named pool of slots;
slotctl run also creates the limits it is asked for (with --slots, else the
config file's limits.NAME, else 1 slot).

EXIT STATUS
  0    done
  64   unknown subcommand, bad name or slot count, or no such limit
  69   the store cannot be opened or reached`,
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
	cmd.AddCommand(newLimitSetCmd(f, g), newLimitLsCmd(f, g), newLimitRmCmd(f, g))
	return cmd
}

func newLimitSetCmd(f *Factory, g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set NAME SLOTS",
		Short: "Create a limit or change its number of slots",
		Long: `Create a limit or change its number of slots.

0 slots pauses the limit: nobody new is admitted. Shrinking never evicts a
holder: new admissions wait until fewer than SLOTS are held. Growing admits
waiters at once.

EXIT STATUS
  0    the limit has SLOTS slots
  64   bad name or slot count
  69   the store cannot be opened or reached`,
		Example: `  slotctl limit set build 4
  slotctl limit set deploy 0   # pause deploys`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return errArgs(cmd, "want NAME SLOTS, e.g. slotctl limit set build 2")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := store.CheckLimitName(name); err != nil {
				return usageError("limit name %q: want 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit", name)
			}
			n, err := strconv.Atoi(args[1])
			if err != nil || store.CheckSlots(n) != nil {
				return usageError("slot count %q: want a whole number 0..%d (0 pauses the limit)", args[1], store.MaxSlots)
			}
			st, err := f.openStore(g)
			if err != nil {
				return err
			}
			l, err := st.SetLimit(cmd.Context(), name, n)
			if err != nil {
				return err
			}
			newLogger(f, g).info("limit %q: %d slots (%d held, %d waiting)", l.Name, l.Slots, l.Held, l.Waiting)
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false) // "limit set build -1" is a bad count, not a flag
	return cmd
}

func newLimitLsCmd(f *Factory, g *globalOptions) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "ls [NAME...]",
		Short: "List limits: slots, held, waiting",
		Long: `List limits with their slots and how many tickets hold and wait.

EXIT STATUS
  0    listed
  64   bad flag, or no such limit
  69   the store cannot be opened or reached`,
		Example: `  slotctl limit ls
  slotctl limit ls -o json | jq '.limits[] | select(.waiting > 0) | .name'`,
		ValidArgsFunction: f.completeLimits,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return usageError("-o %q: want table or json", output)
			}
			st, err := f.openStore(g)
			if err != nil {
				return err
			}
			snap, err := st.Snapshot(cmd.Context(), args...)
			if err != nil {
				return err
			}
			if output == "json" {
				return writeLimitsJSON(f.IO.Out, snap)
			}
			return drawLimits(f.tableOut(), snap.Limits)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newLimitRmCmd(f *Factory, g *globalOptions) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a limit",
		Long: `Remove a limit. A limit that still has tickets is refused unless --force,
which removes its tickets too (their holders find out at their next renewal).

EXIT STATUS
  0    removed
  64   no such limit, or it has tickets and --force was not given
  69   the store cannot be opened or reached`,
		Example: `  slotctl limit rm old-build`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errArgs(cmd, "want one limit NAME")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := f.openStore(g)
			if err != nil {
				return err
			}
			if err := st.RemoveLimit(cmd.Context(), args[0], force); err != nil {
				return err
			}
			newLogger(f, g).info("limit %q removed", args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove the limit's tickets too")
	return cmd
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
