package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// LogOptions are slotctl log's flags and argument.
type LogOptions struct {
	N      int    // how many of the newest events
	Output string // table or json
	Limit  string // "": every limit
}

func newLogCmd(f *Factory, g *globalOptions, runF func(*LogOptions) error) *cobra.Command {
	o := &LogOptions{}
	cmd := &cobra.Command{
		Use:   "log [LIMIT]",
		Short: "Show the store's event log: admitted, released, reaped, lost",
		Long: `Show the newest events of the store's log, oldest first: admitted, released,
cancelled, busy, reaped (with the evidence), force-released, lost and kept.
The store keeps the newest 10,000 events.`,
		Annotations: manPage(`Show the newest events of the store's log, oldest first: admitted, released,
cancelled (gave up waiting), busy (not admitted before --wait ran out), reaped
(with the evidence), force-released (by an operator), lost (a holder that
presumed its lease lost) and, on etcd, kept (a ticket kept under a hold after
an election, when etcd ended its lease early). The store keeps the newest 10,000 events; -o json
also gives how long each admitted ticket waited and each removed holder held
("waited", "held": nanoseconds).

EXIT STATUS
  0    shown
  64   bad flag or limit name
  69   the store cannot be opened or reached`),
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
			if err := checkOutput(o.Output, outTable, outJSON); err != nil {
				return err
			}
			if o.N < 1 || o.N > store.MaxEvents {
				return usageError("-n %d: want 1..%d", o.N, store.MaxEvents)
			}
			if len(args) == 1 {
				o.Limit = args[0]
				if err := checkLimitName("limit", o.Limit); err != nil {
					return err
				}
			}
			if runF != nil {
				return runF(o)
			}
			return runLog(cmd.Context(), f, g, o)
		},
	}
	cmd.Flags().IntVarP(&o.N, "n", "n", 20, "how many of the newest events")
	addOutputFlag(cmd, &o.Output, "output format: table or json (one object per line)")
	return cmd
}

// runLog is slotctl log: the newest events, oldest first.
func runLog(ctx context.Context, f *Factory, g *globalOptions, o *LogOptions) error {
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	events, err := st.Events(ctx, o.Limit, o.N)
	if err != nil {
		return err
	}
	if o.Output == outJSON {
		return writeEventsJSON(f.IO.Out, events)
	}
	return drawEvents(f.tableOut(), events)
}

var eventHeaders = []string{"TIME", "EVENT", "LIMIT", "TICKET", "FENCE", "SLOT", "HOST", "PID", "USER", "COMMAND", "EVIDENCE"}

// drawEvents is log's table, on the renderer ls and limit ls use: plain
// aligned text off a terminal, coloured by kind of event on one. A ticket
// of several limits logs one event in each; SLOT is its indexes in that
// limit ("2,3"), and a W column (the weight) appears when some event
// weighs more than one slot.
func drawEvents(out tableOut, events []store.Event) error {
	weighted, by := false, false
	for _, e := range events {
		weighted = weighted || e.Weight > 1
		by = by || e.By != ""
	}
	headers := eventHeaders
	if weighted {
		headers = append(append(slices.Clip(eventHeaders[:6]), "W"), eventHeaders[6:]...)
	}
	if by {
		// "superseded" and "replaced" name the newer run's ticket
		// (docs/leases.md §2.1 item 10): a BY column after TICKET.
		i := slices.Index(headers, "TICKET") + 1
		headers = append(append(slices.Clip(headers[:i]), "BY"), headers[i:]...)
	}
	rows := make([][]string, 0, len(events))
	for _, e := range events {
		slot := "-"
		if len(e.Indexes) > 0 {
			slot = joinInts(e.Indexes)
		} else if e.Slot >= 0 {
			slot = fmt.Sprint(e.Slot)
		}
		p := store.Printable
		row := []string{e.Time.Local().Format(time.DateTime), p(e.Kind), p(e.Limit), shortID(e.Ticket)}
		if by {
			row = append(row, orDash(shortID(e.By)))
		}
		row = append(row, fmt.Sprint(e.Fence), slot)
		if weighted {
			row = append(row, fmt.Sprint(max(e.Weight, 1)))
		}
		rows = append(rows, append(row, p(e.Host), fmt.Sprint(e.Pid), p(e.User), p(e.Command), p(e.Evidence)))
	}
	return out.draw(headers, rows, -1, func(row, col int) string {
		if col != 1 {
			return ""
		}
		switch k := events[row].Kind; store.Reason(k) {
		case store.Released:
			return colorGreen
		case store.Cancelled, store.Busy, store.Superseded:
			return colorYellow
		case store.Reaped, store.ForceReleased, store.Lost:
			return colorRed
		default:
			if k == "admitted" {
				return colorGreen
			}
			if k == "replaced" {
				return colorYellow
			}
		}
		return ""
	})
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
	// A ticket of several limits logs one event in each limit: all its
	// limits, its weight, its indexes in limit (null when it held none).
	Limits   []string `json:"limits"`
	Weight   int      `json:"weight"`
	Indexes  []int    `json:"indexes"`
	Host     string   `json:"host"`
	Pid      int      `json:"pid"`
	User     string   `json:"user"`
	Command  string   `json:"command"`
	Evidence string   `json:"evidence"`
	// By: the newer run's ticket of a "superseded" or "replaced" event
	// (docs/leases.md §2.1 item 10), added to version 1; else "".
	By string `json:"by"`
}

// writeEventsJSON writes one JSON object per line, so that a log streams into jq;
// the lines of one call go out together (a write each would wake the reader
// of a pipe once an event).
func writeEventsJSON(out io.Writer, events []store.Event) error {
	w := bufio.NewWriterSize(out, 64<<10)
	for _, e := range events {
		limits, indexes := e.Limits, e.Indexes
		if len(limits) == 0 {
			limits = []string{e.Limit}
		}
		if indexes == nil && e.Slot >= 0 {
			indexes = []int{e.Slot}
		}
		if err := writeJSONLine(w, eventJSON{SchemaVersion: 1, Seq: e.Seq, Time: e.Time.UTC().Format(time.RFC3339Nano), Kind: e.Kind,
			Limit: e.Limit, Ticket: e.Ticket, Fence: e.Fence, Slot: e.Slot, Limits: limits, Weight: max(e.Weight, 1), Indexes: indexes, Host: e.Host, Pid: e.Pid, User: e.User,
			Command: e.Command, Evidence: e.Evidence, By: e.By}); err != nil {
			return err
		}
	}
	return w.Flush()
}
