package cli

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/slotctl/slotctl/store"
)

// LimitSetOptions are slotctl limit set's flags and arguments.
type LimitSetOptions struct {
	Name  string
	Slots int
	// Policy is the scheduling policy's parts given (--order, --aging,
	// --rate); the others stay as the limit has them.
	Policy store.PolicyChange
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
config file's limits.NAME, else 1 slot). limit set also sets how a limit
admits its waiters: --order, --aging and --rate (docs/scheduling.md).`,
		Annotations: manPage(`EXIT STATUS
  0    done
  64   unknown subcommand, bad name or slot count, or no such limit
  69   the store cannot be opened or reached`),
		Example: `  slotctl limit set build 2
  slotctl limit set deploy 1 --order priority --rate 10/1h
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
	pf := &policyFlags{}
	cmd := &cobra.Command{
		Use:   "set NAME SLOTS [--order fifo|priority|fair] [--aging D] [--rate N/D]",
		Short: "Create a limit or change its number of slots and its policy",
		Long: `Create a limit or change its number of slots (0 pauses it) and how it admits
its waiters: --order fifo, priority (run --priority) or fair (by user or run
--share), --aging for priority, --rate N/D. Without these flags the limit
keeps its policy; --order fifo and --rate 0 remove it (docs/scheduling.md).`,
		Annotations: manPage(limitSetManPage),
		Example: `  slotctl limit set build 4
  slotctl limit set deploy 0   # pause deploys
  slotctl limit set ci 8 --order priority --aging 5m
  slotctl limit set ci 8 --order fair --rate 10/1m
  slotctl limit set ci 8 --order fifo --rate 0   # back to the default`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
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
			// The flags after NAME SLOTS: the count was read first, so
			// that "limit set build -1" is a bad count, not a flag.
			if err := cmd.Flags().Parse(args[2:]); errors.Is(err, pflag.ErrHelp) {
				return cmd.Help()
			} else if err != nil {
				return cmd.FlagErrorFunc()(cmd, err)
			}
			if help, _ := cmd.Flags().GetBool("help"); help {
				return cmd.Help()
			}
			if rest := cmd.Flags().Args(); len(rest) > 0 {
				return errArgs(cmd, "unexpected argument %s after NAME SLOTS: want slotctl limit set NAME SLOTS [--order ...] [--aging ...] [--rate ...]", quoteInput(rest[0]))
			}
			if o.Policy, err = pf.change(cmd); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return runLimitSet(cmd.Context(), f, g, o)
		},
	}
	cmd.Flags().SetInterspersed(false) // "limit set build -1" is a bad count, not a flag
	addPolicyFlags(cmd, pf)
	cmd.ValidArgsFunction = f.completeLimitSet
	return cmd
}

// limitSetManPage is slotctl limit set's man page, after the help.
const limitSetManPage = `Create a limit or change its number of slots and how it admits its waiters.

0 slots pauses the limit: nobody new is admitted. Shrinking never evicts a
holder: new admissions wait until fewer than SLOTS are held. Growing admits
waiters at once.

--order fifo admits waiters in arrival order (the default). --order
priority admits the waiter of the highest effective priority first: its
slotctl run --priority P (-100..100, default 0) plus one point for each
--aging DURATION it has waited (default 1m), ties in arrival order; a low
priority waits, but every waiter is passed only by the tickets that came
less than (100 - P + 1) x aging after it, so it never starves. --order fair
admits first the waiter whose user (or slotctl run --share KEY) holds the
fewest slots of the limit, counting its own waiters ahead of it, ties in
arrival order: one user's hundred queued runs take turns with another's one.

--rate N/D admits at most N runs in any window of length D (10/1m, 1/1h),
each admission counting once whatever its weight; waiters beyond it wait,
and the waiting line's estimate says when the window opens. --rate 0
removes the rate.

Without --order, --aging or --rate the limit keeps its policy; --order fifo
clears the order and its aging. A run of several limits is admitted only
when it is first in all of them; where limits of different orders
disagree, arrival order breaks the tie, so no set of waiters deadlocks.
slotctl limit ls and slotctl ls show the policy, each waiter's effective
priority and when a rate's window opens.

EXIT STATUS
  0    the limit has SLOTS slots and the policy asked for
  64   bad name, slot count, order, aging or rate
  69   the store cannot be opened or reached`

// runLimitSet is slotctl limit set: create or resize, and set the policy
// flags given. An existing limit gets its policy first, so that the slots a
// resize frees go to the waiters the new policy picks.
func runLimitSet(ctx context.Context, f *Factory, g *globalOptions, o *LimitSetOptions) error {
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	var pol store.Limit
	setPolicy := changesPolicy(o.Policy)
	if setPolicy {
		pol, err = st.SetPolicy(ctx, o.Name, o.Policy)
		if err != nil && !errors.Is(err, store.ErrLimitNotFound) {
			return err
		}
	}
	l, err := st.SetLimit(ctx, o.Name, o.Slots)
	if err != nil {
		return err
	}
	if setPolicy && pol.Name == "" { // a new limit: made by SetLimit, its policy now
		if pol, err = st.SetPolicy(ctx, o.Name, o.Policy); err != nil {
			return err
		}
		l.Held, l.Waiting = pol.Held, pol.Waiting
	}
	if setPolicy {
		newLogger(f, g).info("limit %q: %d slots, %s (%d held, %d waiting)", l.Name, l.Slots, pol.Policy, l.Held, l.Waiting)
		return nil
	}
	newLogger(f, g).info("limit %q: %d slots (%d held, %d waiting)", l.Name, l.Slots, l.Held, l.Waiting)
	return nil
}

func newLimitLsCmd(f *Factory, g *globalOptions, runF func(*LimitLsOptions) error) *cobra.Command {
	o := &LimitLsOptions{}
	cmd := &cobra.Command{
		Use:   "ls [NAME...]",
		Short: "List limits: slots, held, waiting, policy",
		Long: `List limits with their slots and how many tickets hold and wait; where a
limit has a scheduling policy other than FIFO, a POLICY column shows it and
when a spent rate's window opens (-o json: each limit's policy).`,
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
	return drawLimits(f.tableOut(), snap.Limits, snap.Now)
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
	Name    string     `json:"name"`
	Slots   int        `json:"slots"`
	Held    int        `json:"held"`
	Waiting int        `json:"waiting"`
	Paused  bool       `json:"paused"`
	Created string     `json:"created"`
	Policy  policyJSON `json:"policy"` // added to version 1
}

// limitEntryOf is l in a snapshot read at now.
func limitEntryOf(l store.Limit, now time.Time) limitEntry {
	return limitEntry{Name: l.Name, Slots: l.Slots, Held: l.Held, Waiting: l.Waiting, Paused: l.Slots == 0, Created: rfc3339(l.Created),
		Policy: policyJSONOf(l, now)}
}

func writeLimitsJSON(w io.Writer, snap store.Snapshot) error {
	out := limitsJSON{SchemaVersion: 1, Limits: []limitEntry{}}
	for _, l := range snap.Limits {
		out.Limits = append(out.Limits, limitEntryOf(l, snap.Now))
	}
	return writeJSON(w, out)
}
