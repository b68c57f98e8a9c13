package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// LsOptions are slotctl ls's flags and arguments.
type LsOptions struct {
	Output string        // table, wide or json
	Watch  time.Duration // 0: draw once
	Limits []string
}

func newLsCmd(f *Factory, g *globalOptions, runF func(*LsOptions) error) *cobra.Command {
	o := &LsOptions{}
	cmd := &cobra.Command{
		Use:   "ls [LIMIT...]",
		Short: "Show limits, who holds their slots and who waits",
		Long: `Show the limits (slots, held, waiting, paused) and their tickets: held first,
then the waiters in queue order. -o wide shows whole commands and where each
run comes from, -o json a stable schema for scripts; --watch redraws on every
change.`,
		Annotations: manPage(`Show the limits (slots, held, waiting, paused) and their tickets: held first,
then the waiters in queue order. A ticket whose lease has expired but that no
admission or reap has removed yet shows as expired.

The queue order is the limit's policy (slotctl limit set --order): where a
limit listed orders by priority, a PRIO column shows each waiter's effective
priority; where one is fair, a SHARE column what each ticket counts against;
where one has a policy other than FIFO, a POLICY column ends the limits
table, with when a spent rate's window opens (docs/scheduling.md).

On a terminal the tables are coloured and fit its width (long commands are
cut with an ellipsis; -o wide shows them whole); piped, or with NO_COLOR, they
are plain aligned text. -o json is a stable schema for scripts (docs/ls.md).

--watch redraws whenever the store changes, and at least every INTERVAL
(default 1s), until interrupted. Off a terminal it prints a new snapshot each
time a ticket or limit changes.

EXIT STATUS
  0    shown
  64   bad flag, or no such limit
  69   the store cannot be opened or reached`),
		Example: `  slotctl ls
  slotctl ls build -o wide
  slotctl ls --watch
  slotctl ls -o json | jq -r '.tickets[] | select(.state == "waiting" and .age_seconds > 600) | .limit' | sort -u`,
		ValidArgsFunction: f.completeLimits,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Limits = args
			if err := o.resolve(cmd); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return runLs(cmd.Context(), f, g, o)
		},
	}
	addOutputFlag(cmd, &o.Output, "output format: table, wide (whole commands) or json")
	cmd.Flags().DurationVarP(&o.Watch, "watch", "w", time.Second, "redraw on every change, and at least every `INTERVAL`")
	cmd.Flags().Lookup("watch").NoOptDefVal = "1s"
	return cmd
}

// resolve validates the flags and arguments.
func (o *LsOptions) resolve(cmd *cobra.Command) error {
	watch := cmd.Flags().Changed("watch")
	if watch && len(o.Limits) > 0 {
		if _, err := time.ParseDuration(o.Limits[0]); err == nil {
			return usageError("ls %s: write the interval with =: --watch=%s", o.Limits[0], o.Limits[0])
		}
	}
	if err := checkOutput(o.Output, outTable, outWide, outJSON); err != nil {
		return err
	}
	if err := checkLimitNames("limit", o.Limits); err != nil {
		return err
	}
	if !watch {
		o.Watch = 0
		return nil
	}
	return checkDuration("watch", o.Watch, 100*time.Millisecond, time.Hour)
}

// runLs is slotctl ls: one snapshot, or a redraw on every change with --watch.
func runLs(ctx context.Context, f *Factory, g *globalOptions, o *LsOptions) error {
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	if o.Watch > 0 {
		return watchLs(ctx, f, st, o)
	}
	if f.ExitAfterMain && f.Getenv("GOGC") == "" {
		// One snapshot, drawn, and the process ends: the heap grows from a
		// few MB to tens on a large store, and at Go's default the
		// collector runs at every doubling on the way (ls -o json of
		// 10,000 tickets: 58 ms at the default, 45 ms so). Only in
		// slotctl's own process: the setting is the whole process's.
		debug.SetGCPercent(lsGCPercent)
	}
	snap, err := st.Snapshot(ctx, o.Limits...)
	if err != nil {
		return err
	}
	return writeLs(f.tableOut(), st.String(), snap, o.Output)
}

// lsGCPercent is a one-shot ls's GOGC.
const lsGCPercent = 400

// writeLs draws a snapshot in the chosen format.
func writeLs(out tableOut, storeURL string, snap store.Snapshot, format string) error {
	if format == outJSON {
		return writeLsJSON(out.w, storeURL, snap)
	}
	if err := drawLimits(out, snap.Limits, snap.Now); err != nil {
		return err
	}
	if len(snap.Tickets) == 0 {
		return nil
	}
	fmt.Fprintln(out.w)
	return drawTickets(out, snap, format == outWide)
}

var limitHeaders = []string{"LIMIT", "SLOTS", "HELD", "WAITING", "PAUSED"}

// drawLimits is the limits table, shared by ls and limit ls, at now. A
// POLICY column (store.Policy.String, and when a spent rate opens) follows
// when some limit has a policy other than FIFO.
func drawLimits(out tableOut, limits []store.Limit, now time.Time) error {
	headers := limitHeaders
	policy := anyPolicy(limits)
	if policy {
		headers = append(slices.Clip(headers), "POLICY")
	}
	rows := make([][]string, 0, len(limits))
	for _, l := range limits {
		paused := "no"
		if l.Slots == 0 {
			paused = "yes"
		}
		row := []string{store.Printable(l.Name), strconv.Itoa(l.Slots), strconv.Itoa(l.Held), strconv.Itoa(l.Waiting), paused}
		if policy {
			row = append(row, policyCell(l, now))
		}
		rows = append(rows, row)
	}
	return out.draw(headers, rows, -1, func(row, col int) string {
		switch {
		case col == 4 && rows[row][4] == "yes":
			return colorYellow
		case col == 3 && rows[row][3] != "0":
			return colorYellow
		case col == 5 && limits[row].Opens.After(now):
			return colorYellow
		}
		return ""
	})
}

var ticketHeaders = []string{"LIMIT", "STATE", "SLOT", "TICKET", "FENCE", "HOST", "PID", "USER", "AGE", "LEASE", "COMMAND"}

// ticketState is held, waiting or expired (not reaped yet).
func ticketState(t store.Ticket) string {
	if t.Expired() {
		return "expired"
	}
	return string(t.State)
}

// drawTickets is the tickets table: held first, then waiters by position.
// A ticket of several limits has a row under each, its SLOT there the
// indexes it holds in that limit ("2,3" for a weight of 2).
func drawTickets(out tableOut, snap store.Snapshot, wide bool) error {
	tc := ticketColumnsOf(snap, wide)
	headers := tc.headers()
	col := func(name string) int { return slices.Index(headers, name) }
	rows := make([][]string, 0, len(snap.Tickets))
	for _, t := range snap.Tickets {
		rows = append(rows, tc.row(t, snap.Now))
	}
	all, fit := headers, len(headers)-1
	cols := make([]int, len(headers)) // the columns shown: all but on a narrow terminal
	for i := range cols {
		cols[i] = i
	}
	if wide {
		fit = -1
	} else if out.width > 0 {
		// Least needed first: FENCE, PID, HOST, USER, SLOT (a column not
		// shown is -1, which drops nothing).
		cols = narrowColumns(all, rows, out.width, []int{col("FENCE"), col("PID"), col("HOST"), col("USER"), col("SLOT")})
		headers, rows = project(all, rows, cols)
		fit = len(cols) - 1
	}
	return out.draw(headers, rows, fit, ticketStyle(snap.Tickets, all, cols))
}

// ticketStyle colours the tickets table's cells: the state, a lease close to
// its end, a labelled command. cols maps each column shown to its place in
// all, the table's columns before a narrow terminal dropped some.
func ticketStyle(tickets []store.Ticket, all []string, cols []int) cellStyle {
	state, lease, command := slices.Index(all, "STATE"), slices.Index(all, "LEASE"), slices.Index(all, "COMMAND")
	return func(row, c int) string {
		t := tickets[row]
		switch cols[c] {
		case state:
			return ticketStateColor(t)
		case lease:
			if !t.Quiet && t.Remaining <= t.TTL/3 { // a lease this close to expiry has missed a renewal
				return colorRed
			}
		case command:
			if t.Holder.Label != "" {
				return colorGray
			}
		}
		return ""
	}
}

// ticketColumns are the tickets table's optional columns: W (the weight)
// when some ticket weighs more than one slot, PRIO and SHARE for the
// policies of the limits listed, KEY and URL with -o wide.
type ticketColumns struct {
	weighted bool
	// PRIO (a waiter's effective priority) and SHARE (what a ticket counts
	// against) appear only when a limit listed orders by priority or is
	// fair: the default table stays as narrow as FIFO needs.
	prio, share bool
	fair        map[string]bool // by limit: its tickets have a SHARE
	wide        bool
}

// ticketColumnsOf is the columns of snap's table.
func ticketColumnsOf(snap store.Snapshot, wide bool) ticketColumns {
	tc := ticketColumns{fair: map[string]bool{}, wide: wide}
	for _, t := range snap.Tickets {
		tc.weighted = tc.weighted || t.Weighs() > 1
	}
	orders := ordersOf(snap.Limits)
	tc.prio, tc.share = orders[store.ByPriority], orders[store.Fair]
	for _, l := range snap.Limits {
		tc.fair[l.Name] = l.Policy.Ordered() == store.Fair
	}
	return tc
}

// headers are the table's headers: W after SLOT, PRIO and SHARE before
// TICKET, KEY and URL before COMMAND.
func (tc ticketColumns) headers() []string {
	headers := ticketHeaders
	if tc.weighted {
		headers = append(append(slices.Clip(ticketHeaders[:3]), "W"), ticketHeaders[3:]...)
	}
	if tc.prio || tc.share {
		n := slices.Index(headers, "TICKET")
		extra := []string{}
		if tc.prio {
			extra = append(extra, "PRIO")
		}
		if tc.share {
			extra = append(extra, "SHARE")
		}
		headers = append(append(slices.Clip(headers[:n]), extra...), headers[n:]...)
	}
	if tc.wide {
		// -o wide shows where each run comes from (docs/leases.md §2.1
		// items 10 and 11): its key and CI URL, before the whole command.
		n := len(headers) - 1
		headers = append(append(slices.Clip(headers[:n]), "KEY", "URL"), headers[n:]...)
	}
	return headers
}

// row is ticket t's row at now, under headers.
func (tc ticketColumns) row(t store.Ticket, now time.Time) []string {
	row := ticketRow(t, now, tc.weighted, tc.wide)
	if !tc.prio && !tc.share {
		return row
	}
	n := 3
	if tc.weighted {
		n = 4
	}
	var extra []string
	if tc.prio {
		extra = append(extra, priorityCell(t))
	}
	if tc.share {
		extra = append(extra, "-")
		if tc.fair[t.Limit] {
			extra[len(extra)-1] = store.Printable(t.ShareKey())
		}
	}
	return append(append(slices.Clip(row[:n]), extra...), row[n:]...)
}

// ticketRow is ticket t's row of the tickets table at now, with the W
// column when weighted and the KEY and URL columns when wide.
func ticketRow(t store.Ticket, now time.Time, weighted, wide bool) []string {
	slot := strconv.Itoa(t.Slot)
	if t.State == store.Waiting {
		slot = "#" + strconv.Itoa(t.Position) // its place in the queue
	} else if ix := t.In(t.Limit); len(ix) > 1 {
		slot = joinInts(ix)
	}
	row := []string{store.Printable(t.Limit), ticketState(t), slot}
	if weighted {
		row = append(row, strconv.Itoa(t.Weighs()))
	}
	row = append(row, shortID(t.ID), strconv.FormatUint(t.Fence, 10),
		store.Printable(t.Holder.Host), strconv.Itoa(t.Holder.Pid), store.Printable(t.Holder.User),
		human(now.Sub(t.Created)), leaseLeft(t))
	if wide {
		row = append(row, orDash(store.Printable(t.Key)), orDash(store.Printable(t.Holder.URL)))
	}
	return append(row, store.Printable(t.Holder.Command()))
}

// ticketStateColor is the color of a ticket's STATE cell: held green,
// waiting yellow, expired red.
func ticketStateColor(t store.Ticket) string {
	switch ticketState(t) {
	case "held":
		return colorGreen
	case "waiting":
		return colorYellow
	default:
		return colorRed
	}
}

// orDash is s, or "-" for an empty cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// joinInts is slot indexes as a table shows them: "2,3".
func joinInts(ix []int) string {
	b := make([]byte, 0, 4*len(ix))
	for i, x := range ix {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return string(b)
}

// human is a duration as people read it in a table: 45s, 3m12s, 2h5m, 3d4h.
// It appends digits rather than formatting: ls draws two a ticket.
func human(d time.Duration) string {
	var buf [32]byte
	b := buf[:0]
	if d < 0 {
		b, d = append(b, '-'), -d
	}
	two := func(b []byte, n int) []byte { // %02d of 0..59
		if n < 10 {
			b = append(b, '0')
		}
		return strconv.AppendInt(b, int64(n), 10)
	}
	switch {
	case d < time.Minute:
		b = append(strconv.AppendInt(b, int64(int(d.Seconds())), 10), 's')
	case d < time.Hour:
		b = append(strconv.AppendInt(b, int64(int(d.Minutes())), 10), 'm')
		b = append(two(b, int(d.Seconds())%60), 's')
	case d < 48*time.Hour:
		b = append(strconv.AppendInt(b, int64(int(d.Hours())), 10), 'h')
		b = append(two(b, int(d.Minutes())%60), 'm')
	default:
		b = append(strconv.AppendInt(b, int64(int(d.Hours())/24), 10), 'd')
		b = append(two(b, int(d.Hours())%24), 'h')
	}
	return string(b)
}

// lsJSON is the schema of ls -o json, version 1 (documented in docs/ls.md).
type lsJSON struct {
	SchemaVersion int          `json:"schema_version"`
	Store         string       `json:"store"`
	Now           string       `json:"now"`
	Limits        []limitEntry `json:"limits"`
	Tickets       []ticketJSON `json:"tickets"`
}

type ticketJSON struct {
	ID                    string   `json:"id"`
	Limit                 string   `json:"limit"`
	State                 string   `json:"state"`    // held, waiting or expired
	Held                  bool     `json:"held"`     // holds a slot (also when expired but not reaped)
	Slot                  *int     `json:"slot"`     // null while waiting; the lowest of indexes
	Position              *int     `json:"position"` // 1-based queue position; null when held
	Limits                []string `json:"limits"`   // all of its limits, in the order requested
	Weight                int      `json:"weight"`   // slots it takes in each limit
	Indexes               []int    `json:"indexes"`  // slot indexes held in limit, ascending; null while waiting
	Fence                 uint64   `json:"fence"`
	Host                  string   `json:"host"`
	Pid                   int      `json:"pid"`
	User                  string   `json:"user"`
	Command               string   `json:"command"` // the label if one was given, else the command line
	Labelled              bool     `json:"labelled"`
	Created               string   `json:"created"`
	Admitted              *string  `json:"admitted"`
	Renewed               *string  `json:"renewed"`
	AgeSeconds            float64  `json:"age_seconds"`
	TTLSeconds            float64  `json:"ttl_seconds"`
	LeaseRemainingSeconds float64  `json:"lease_remaining_seconds"` // <= 0: expired; a quiet waiter's: its TTL
	// Quiet: a waiter of the bbolt store not yet in line, which renews
	// nothing (its process is its proof of life), added to version 1.
	Quiet bool `json:"quiet"`
	// Newer runs first (docs/leases.md §2.1 item 10) and the CI URL, added
	// to version 1: "" for a run without --key or a URL.
	Key      string         `json:"key"`
	URL      string         `json:"url"`
	Stop     *successorJSON `json:"stop"`     // a held ticket a newer run asked to stop; else null
	Replaces []string       `json:"replaces"` // the held tickets this one waits to replace; else null
	// Scheduling (docs/scheduling.md), added to version 1: the run's
	// --priority, its effective priority while it waits in a limit that
	// orders by priority (else null), and the share it counts against in
	// a fair limit (--share, else its user).
	Priority          int    `json:"priority"`
	EffectivePriority *int   `json:"effective_priority"`
	Share             string `json:"share"`
}

// successorJSON is the newer run that asked a ticket to stop.
type successorJSON struct {
	Ticket string `json:"ticket"`
	Host   string `json:"host"`
	Pid    int    `json:"pid"`
	URL    string `json:"url"`
}

// writeLsJSON writes what writeJSON(w, lsJSONOf(storeURL, snap)) writes,
// byte for byte, a ticket at a time: ten thousand tickets are several
// megabytes of JSON, which writeJSON would marshal into one buffer and
// indent into another, its reflection most of the cost. Each ticket is made
// into its ticketJSON only when written, and its fields appended by hand
// (appendTicketJSON); TestLsJSONStreamed holds both to the same bytes.
func writeLsJSON(w io.Writer, storeURL string, snap store.Snapshot) error {
	head, err := json.MarshalIndent(lsJSONOf(storeURL, store.Snapshot{Now: snap.Now, Limits: snap.Limits}), "", "  ")
	if err != nil {
		return err
	}
	// The tickets are the last field: the head ends with an empty list.
	const emptyTail = "[]\n}"
	if !bytes.HasSuffix(head, []byte(emptyTail)) {
		return fmt.Errorf("ls -o json: the tickets are not the document's last field")
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	if len(snap.Tickets) == 0 {
		_, _ = bw.Write(escapeJSON(head))
		_ = bw.WriteByte('\n')
		return bw.Flush()
	}
	_, _ = bw.Write(escapeJSON(head[:len(head)-len(emptyTail)]))
	_, _ = bw.WriteString("[\n")
	for i := range snap.Tickets {
		j := ticketJSONOf(&snap.Tickets[i], snap.Now)
		b := append(bw.AvailableBuffer(), "    "...) // no copy while the ticket fits the buffer's free space
		b, err := appendTicketJSON(b, &j)
		if err != nil {
			return err
		}
		if i < len(snap.Tickets)-1 {
			b = append(b, ',')
		}
		_, _ = bw.Write(append(b, '\n'))
	}
	_, _ = bw.WriteString("  ]\n}\n")
	return bw.Flush()
}

// appendTicketJSON appends what json.MarshalIndent(t, "    ", "  ") and
// escapeJSON make of t, field by field in ticketJSON's order.
func appendTicketJSON(b []byte, t *ticketJSON) ([]byte, error) {
	const field = ",\n      \"" // every field but the first starts a line at depth 1
	var err error
	b = append(b, "{\n      \"id\": "...)
	b = appendJSONString(b, t.ID)
	b = appendJSONString(append(b, field+`limit": `...), t.Limit)
	b = appendJSONString(append(b, field+`state": `...), t.State)
	b = strconv.AppendBool(append(b, field+`held": `...), t.Held)
	b = appendJSONIntPtr(append(b, field+`slot": `...), t.Slot)
	b = appendJSONIntPtr(append(b, field+`position": `...), t.Position)
	b = appendJSONStrings(append(b, field+`limits": `...), t.Limits)
	b = strconv.AppendInt(append(b, field+`weight": `...), int64(t.Weight), 10)
	b = appendJSONInts(append(b, field+`indexes": `...), t.Indexes)
	b = strconv.AppendUint(append(b, field+`fence": `...), t.Fence, 10)
	b = appendJSONString(append(b, field+`host": `...), t.Host)
	b = strconv.AppendInt(append(b, field+`pid": `...), int64(t.Pid), 10)
	b = appendJSONString(append(b, field+`user": `...), t.User)
	b = appendJSONString(append(b, field+`command": `...), t.Command)
	b = strconv.AppendBool(append(b, field+`labelled": `...), t.Labelled)
	b = appendJSONString(append(b, field+`created": `...), t.Created)
	b = appendJSONStringPtr(append(b, field+`admitted": `...), t.Admitted)
	b = appendJSONStringPtr(append(b, field+`renewed": `...), t.Renewed)
	if b, err = appendJSONFloat(append(b, field+`age_seconds": `...), t.AgeSeconds); err != nil {
		return nil, err
	}
	if b, err = appendJSONFloat(append(b, field+`ttl_seconds": `...), t.TTLSeconds); err != nil {
		return nil, err
	}
	if b, err = appendJSONFloat(append(b, field+`lease_remaining_seconds": `...), t.LeaseRemainingSeconds); err != nil {
		return nil, err
	}
	b = strconv.AppendBool(append(b, field+`quiet": `...), t.Quiet)
	b = appendJSONString(append(b, field+`key": `...), t.Key)
	b = appendJSONString(append(b, field+`url": `...), t.URL)
	b = append(b, field+`stop": `...)
	if s := t.Stop; s == nil {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(append(b, "{\n        \"ticket\": "...), s.Ticket)
		b = appendJSONString(append(b, ",\n        \"host\": "...), s.Host)
		b = strconv.AppendInt(append(b, ",\n        \"pid\": "...), int64(s.Pid), 10)
		b = appendJSONString(append(b, ",\n        \"url\": "...), s.URL)
		b = append(b, "\n      }"...)
	}
	b = appendJSONStrings(append(b, field+`replaces": `...), t.Replaces)
	b = strconv.AppendInt(append(b, field+`priority": `...), int64(t.Priority), 10)
	b = appendJSONIntPtr(append(b, field+`effective_priority": `...), t.EffectivePriority)
	b = appendJSONString(append(b, field+`share": `...), t.Share)
	return append(b, "\n    }"...), nil
}

// appendJSONString appends s as encoding/json quotes it (escaping <, > and
// &, as Marshal does) and escapeJSON then escapes it. Printable ASCII that
// needs no escape, nearly every string ls shows, is copied as it is.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, escapeJSON(q)...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func appendJSONStringPtr(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *s)
}

func appendJSONIntPtr(b []byte, n *int) []byte {
	if n == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, int64(*n), 10)
}

// appendJSONStrings appends a list as a field of depth 1 is indented.
func appendJSONStrings(b []byte, l []string) []byte {
	switch {
	case l == nil:
		return append(b, "null"...)
	case len(l) == 0:
		return append(b, "[]"...)
	}
	for i, s := range l {
		if i == 0 {
			b = append(b, "[\n        "...)
		} else {
			b = append(b, ",\n        "...)
		}
		b = appendJSONString(b, s)
	}
	return append(b, "\n      ]"...)
}

func appendJSONInts(b []byte, l []int) []byte {
	switch {
	case l == nil:
		return append(b, "null"...)
	case len(l) == 0:
		return append(b, "[]"...)
	}
	for i, n := range l {
		if i == 0 {
			b = append(b, "[\n        "...)
		} else {
			b = append(b, ",\n        "...)
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return append(b, "\n      ]"...)
}

// appendJSONFloat appends f as encoding/json does: 'f' format between 1e-6
// and 1e21, where every figure ls shows is; encoding/json itself elsewhere.
func appendJSONFloat(b []byte, f float64) ([]byte, error) {
	if a := math.Abs(f); a == 0 || a >= 1e-6 && a < 1e21 {
		return strconv.AppendFloat(b, f, 'f', -1, 64), nil
	}
	q, err := json.Marshal(f)
	return append(b, q...), err
}

func lsJSONOf(storeURL string, snap store.Snapshot) lsJSON {
	out := lsJSON{SchemaVersion: 1, Store: storeURL, Now: rfc3339(snap.Now), Limits: []limitEntry{}, Tickets: make([]ticketJSON, 0, len(snap.Tickets))}
	for _, l := range snap.Limits {
		out.Limits = append(out.Limits, limitEntryOf(l, snap.Now))
	}
	for i := range snap.Tickets {
		out.Tickets = append(out.Tickets, ticketJSONOf(&snap.Tickets[i], snap.Now))
	}
	return out
}

// ticketJSONOf is t in a snapshot read at now. Its Slot and Position
// point into t.
func ticketJSONOf(t *store.Ticket, now time.Time) ticketJSON {
	j := ticketJSON{ID: t.ID, Limit: t.Limit, State: ticketState(*t), Held: t.State == store.Held, Fence: t.Fence,
		Host: t.Holder.Host, Pid: t.Holder.Pid, User: t.Holder.User, Command: t.Holder.Command(),
		Labelled: t.Holder.Label != "", Created: rfc3339(t.Created),
		AgeSeconds: seconds(now.Sub(t.Created)), TTLSeconds: seconds(t.TTL), LeaseRemainingSeconds: seconds(t.Remaining), Quiet: t.Quiet}
	if t.Quiet {
		j.LeaseRemainingSeconds = j.TTLSeconds
	}
	j.Limits, j.Weight = t.Names(), t.Weighs()
	j.Key, j.URL, j.Replaces = t.Key, t.Holder.URL, t.Replaces
	j.Priority, j.EffectivePriority, j.Share = t.Priority, t.Effective, t.ShareKey()
	if s := t.Stop; s != nil {
		j.Stop = &successorJSON{Ticket: s.Ticket, Host: s.Host, Pid: s.Pid, URL: s.URL}
	}
	if t.State == store.Held {
		j.Slot = &t.Slot
		j.Indexes = t.In(t.Limit)
		if j.Indexes == nil {
			j.Indexes = []int{t.Slot}
		}
	} else {
		j.Position = &t.Position
	}
	if !t.Admitted.IsZero() {
		a := rfc3339(t.Admitted)
		j.Admitted = &a
	}
	if !t.Renewed.IsZero() {
		r := rfc3339(t.Renewed)
		j.Renewed = &r
	}
	return j
}

// seconds rounds to milliseconds: enough for a lease, stable in golden files.
func seconds(d time.Duration) float64 {
	return float64(d.Round(time.Millisecond)) / float64(time.Second)
}

// watchLs redraws on every change of the store and at least every interval.
// On a terminal it redraws in place; elsewhere it prints a snapshot each
// time the tickets or limits change (renewals and ageing alone do not count).
func watchLs(ctx context.Context, f *Factory, st store.Store, o *LsOptions) error {
	ctx, stop := signalContext(ctx)
	defer stop()
	var changes <-chan struct{} // nil: redraw on the interval only
	if n, ok := st.(changeNotifier); ok {
		if c, err := n.Changes(ctx); err == nil {
			changes = c
		}
	}
	out := f.tableOut()
	tick := time.NewTicker(o.Watch)
	defer tick.Stop()
	var last string
	for {
		snap, err := st.Snapshot(ctx, o.Limits...)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if err == nil {
			if f.IO.OutTTY {
				var b bytes.Buffer
				o2 := out
				o2.w = &b
				if err := writeLs(o2, st.String(), snap, o.Output); err != nil {
					return err
				}
				fmt.Fprint(f.IO.Out, "\033[H\033[2J", b.String()) // home, clear: redraw in place
			} else if key := snapshotKey(snap); key != last {
				last = key
				if err := writeLs(out, st.String(), snap, o.Output); err != nil {
					return err
				}
				if o.Output != outJSON {
					fmt.Fprintln(f.IO.Out)
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
		case <-tick.C:
		}
	}
}

// changeNotifier is a store that can say when it changed (bbolt: a watch on
// its file). A store that cannot is redrawn on the interval alone.
type changeNotifier interface {
	Changes(context.Context) (<-chan struct{}, error)
}

// snapshotKey is what a change means off a terminal: who holds, who waits
// (in which order), sizes and policies.
func snapshotKey(s store.Snapshot) string {
	var b strings.Builder
	for _, l := range s.Limits {
		fmt.Fprintf(&b, "%s=%d:%s;", l.Name, l.Slots, l.Policy)
	}
	for _, t := range s.Tickets {
		fmt.Fprintf(&b, "%s:%s:%s:%v:%d:%s;", t.ID, t.Limit, t.State, t.In(t.Limit), t.Position, ticketState(t))
	}
	return b.String()
}

// leaseLeft is the LEASE column: what is left of the lease, or "quiet" for
// a waiter not yet in line, which renews nothing until it is.
func leaseLeft(t store.Ticket) string {
	if t.Quiet {
		return "quiet"
	}
	return human(t.Remaining)
}
