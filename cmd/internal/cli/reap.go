package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// ReapOptions are slotctl reap's flags and arguments.
type ReapOptions struct {
	DryRun bool
	Output string // table or json
	Limits []string
}

func newReapCmd(f *Factory, g *globalOptions, runF func(*ReapOptions) error) *cobra.Command {
	o := &ReapOptions{}
	cmd := &cobra.Command{
		Use:   "reap [LIMIT...]",
		Short: "Remove tickets whose lease expired or whose holder is proven dead",
		Long: `Remove the tickets whose lease has expired, and those whose holder is proven
dead on this host, then admit the waiters this frees. Prints one line per
removed ticket with the evidence. Every admission reaps its limit already:
reap is a safety net, safe to run from many places at once and from a timer.`,
		Annotations: manPage(`Remove the tickets whose lease has expired, and those whose holder is proven
dead on this host, then admit the waiters this frees. Prints one line per
removed ticket with the evidence: "expired 41s ago", "supervisor 4242 gone,
process group 4243 empty", "previous boot".

A holder is proven dead only on its own host, boot and pid namespace: its
supervisor's pid is gone or names another process (start times differ), and
its child's process group has no running member. A host name proves nothing;
on etcd another boot id is another host. Anything less waits for the TTL.
Every admission already reaps the limit it admits into, so reap is a
safety net and an answer to "what happened", not something the limits need
to move. It is safe to run from many places at once and from a timer: the
check and the removal are one step, so two reapers never free a ticket twice.

A job still running after its supervisor died is killed first, and only by
reap: only while the marker its run left in its user's own bells directory
(removed after a release) names the supervisor the job's processes name, so
a ticket written back after its job ended kills nobody.

EXIT STATUS
  0    reap ran (whatever it found)
  64   bad flag, or no such limit
  69   the store cannot be opened or reached`),
		Example: `  slotctl reap
  slotctl reap build --dry-run
  slotctl reap -o json | jq -r '.removed[] | "\(.limit) \(.evidence)"'`,
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
			return runReap(cmd.Context(), f, g, o)
		},
	}
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "report what would be removed, remove nothing")
	addOutputFlag(cmd, &o.Output, "output format: table or json")
	return cmd
}

// runReap is slotctl reap: one line per removed ticket with its evidence.
func runReap(ctx context.Context, f *Factory, g *globalOptions, o *ReapOptions) error {
	st, err := f.openReaper(g)
	if err != nil {
		return err
	}
	defer st.Close()
	removed, err := st.Reap(ctx, store.ReapOptions{DryRun: o.DryRun, Limits: o.Limits})
	if err != nil {
		return err
	}
	if o.Output == outJSON {
		return writeReapJSON(f.IO.Out, o.DryRun, removed)
	}
	writeReapText(f.IO.Out, o.DryRun, removed)
	if len(removed) == 0 {
		newLogger(f, g).info("nothing to reap")
	}
	return nil
}

func writeReapText(w io.Writer, dryRun bool, removed []store.Removal) {
	verb := "reaped"
	if dryRun {
		verb = "would reap"
	}
	for _, r := range removed {
		t := r.Ticket
		// One line per ticket, whatever the record holds: the reaper's
		// stdout is a journal, and no label may write a line into it.
		fmt.Fprintf(w, "%s %s (%s, %s, %s, pid %d on %s): %s\n", verb, shortID(t.ID), ticketLimits(t),
			describeState(t), store.Printable(t.Holder.Command()), t.Holder.Pid, store.Printable(t.Holder.Host),
			store.Printable(r.Evidence))
	}
}

// describeState is a ticket's state in a message: "held slot 1", or for a
// ticket of several limits or weights "held slots build=0 db=2,3".
func describeState(t store.Ticket) string {
	if t.State == store.Held {
		if t.Multi() {
			return "held slots " + store.Printable(t.SlotsVar())
		}
		return fmt.Sprintf("held slot %d", t.Slot)
	}
	if t.Weighs() > 1 {
		return fmt.Sprintf("waiting for %d slots", t.Weighs())
	}
	return "waiting"
}

// ticketLimits names a ticket's limits in a message: "limit build", or
// "limits build,db" for a ticket of several (all of them: it is removed
// from all at once).
func ticketLimits(t store.Ticket) string {
	if names := t.Names(); len(names) > 1 {
		return "limits " + printableNames(names)
	}
	return "limit " + store.Printable(t.Limit)
}

// reapJSON is the schema of reap -o json.
type reapJSON struct {
	SchemaVersion int           `json:"schema_version"`
	DryRun        bool          `json:"dry_run"`
	Removed       []removalJSON `json:"removed"`
}

type removalJSON struct {
	Limit  string `json:"limit"`
	Ticket string `json:"ticket"`
	State  string `json:"state"`
	Slot   int    `json:"slot"`
	// All of its limits (it was removed from each), its weight, and the
	// indexes it held in each limit (null while waiting).
	Limits   []string         `json:"limits"`
	Weight   int              `json:"weight"`
	Indexes  map[string][]int `json:"indexes"`
	Fence    uint64           `json:"fence"`
	Host     string           `json:"host"`
	Pid      int              `json:"pid"`
	User     string           `json:"user"`
	Command  string           `json:"command"`
	Created  string           `json:"created"`
	Reason   string           `json:"reason"`
	Evidence string           `json:"evidence"`
}

func writeReapJSON(w io.Writer, dryRun bool, removed []store.Removal) error {
	out := reapJSON{SchemaVersion: 1, DryRun: dryRun, Removed: []removalJSON{}}
	for _, r := range removed {
		t := r.Ticket
		out.Removed = append(out.Removed, removalJSON{Limit: t.Limit, Ticket: t.ID, State: string(t.State), Slot: t.Slot,
			Limits: t.Names(), Weight: t.Weighs(), Indexes: heldIndexes(t), Fence: t.Fence, Host: t.Holder.Host, Pid: t.Holder.Pid, User: t.Holder.User, Command: t.Holder.Command(),
			Created: rfc3339(t.Created), Reason: string(r.Reason), Evidence: r.Evidence})
	}
	return writeJSON(w, out)
}

// heldIndexes is the indexes t holds in each of its limits; nil while waiting.
func heldIndexes(t store.Ticket) map[string][]int {
	if t.State != store.Held {
		return nil
	}
	m := make(map[string][]int, len(t.Names()))
	for _, name := range t.Names() {
		m[name] = t.In(name)
	}
	return m
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
