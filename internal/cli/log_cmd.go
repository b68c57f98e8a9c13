package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

func newLogCmd(f *Factory, g *globalOptions) *cobra.Command {
	var n int
	var output string
	cmd := &cobra.Command{
		Use:   "log [LIMIT]",
		Short: "Show the store's event log: admitted, released, reaped, lost",
		Long: `Show the newest events of the store's log, oldest first: admitted, released,
cancelled (gave up waiting), reaped (with the evidence), force-released (by an
operator) and lost (a holder that presumed its lease lost). The store keeps the
newest 10,000 events.

EXIT STATUS
  0    shown
  64   bad flag or limit name
  69   the store cannot be opened or reached`,
		Example: `  # which job held backup all night, and when did it go away?
  slotctl log backup -n 50
  slotctl log -o json | jq -r 'select(.kind == "reaped") | .evidence'`,
		ValidArgsFunction: f.completeLimits,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return errArgs(cmd, "want at most one LIMIT")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if n < 1 || n > store.MaxEvents {
				return usageError("-n %d: want 1..%d", n, store.MaxEvents)
			}
			limit := ""
			if len(args) == 1 {
				limit = args[0]
				if err := store.CheckLimitName(limit); err != nil {
					return usageError("limit %q: want 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit", limit)
				}
			}
			st, err := f.openStore(g)
			if err != nil {
				return err
			}
			events, err := st.Events(cmd.Context(), limit, n)
			if err != nil {
				return err
			}
			if output == "json" {
				return writeEventsJSON(f.IO.Out, events)
			}
			return writeEventsTable(f.IO.Out, events)
		},
	}
	cmd.Flags().IntVarP(&n, "n", "n", 20, "how many of the newest events")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json (one object per line)")
	return cmd
}

func writeEventsTable(w io.Writer, events []store.Event) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tEVENT\tLIMIT\tTICKET\tFENCE\tSLOT\tHOST\tPID\tUSER\tCOMMAND\tEVIDENCE")
	for _, e := range events {
		slot := "-"
		if e.Slot >= 0 {
			slot = fmt.Sprint(e.Slot)
		}
		p := store.Printable
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Time.Local().Format(time.DateTime), p(e.Kind), p(e.Limit),
			shortID(e.Ticket), e.Fence, slot, p(e.Host), e.Pid, p(e.User), p(e.Command), p(e.Evidence))
	}
	return tw.Flush()
}

// eventJSON is one line of log -o json.
type eventJSON struct {
	SchemaVersion int    `json:"schema_version"`
	Seq           uint64 `json:"seq"`
	Time          string `json:"time"`
	Kind          string `json:"kind"`
	Limit         string `json:"limit"`
	Ticket        string `json:"ticket"`
	Fence         uint64 `json:"fence"`
	Slot          int    `json:"slot"`
	Host          string `json:"host"`
	Pid           int    `json:"pid"`
	User          string `json:"user"`
	Command       string `json:"command"`
	Evidence      string `json:"evidence"`
}

// writeEventsJSON writes one JSON object per line, so that a log streams into jq.
func writeEventsJSON(w io.Writer, events []store.Event) error {
	for _, e := range events {
		if err := writeJSONLine(w, eventJSON{SchemaVersion: 1, Seq: e.Seq, Time: e.Time.UTC().Format(time.RFC3339Nano), Kind: e.Kind,
			Limit: e.Limit, Ticket: e.Ticket, Fence: e.Fence, Slot: e.Slot, Host: e.Host, Pid: e.Pid, User: e.User,
			Command: e.Command, Evidence: e.Evidence}); err != nil {
			return err
		}
	}
	return nil
}
