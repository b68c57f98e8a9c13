package cli

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-runewidth"
	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// StatsOptions are slotctl stats's flags and arguments.
type StatsOptions struct {
	Limits []string
	Since  time.Duration
	Output string // table or json
}

// statsJSONCells is the number of cells of the timeline in stats -o json.
const statsJSONCells = 48

func newStatsCmd(f *Factory, g *globalOptions, runF func(*StatsOptions) error) *cobra.Command {
	o := &StatsOptions{}
	cmd := &cobra.Command{
		Use:   "stats [LIMIT...]",
		Short: "Show how each limit has been used: runs, waits, holds, utilization",
		Long: `Show what the event log says about each limit over the last --since (24h by
default): runs admitted; wait and hold times (p50, p95, max); utilization;
and the runs that did not end as usual. On a terminal a utilization timeline
per limit follows the table.`,
		Annotations: manPage(`Show what the event log says about each limit over the last --since (24h by
default): runs admitted; wait and hold times (p50, p95, max); utilization,
the slot-seconds held over the slot-seconds available (slots × the window;
a ticket of weight N holds N slots); and the runs that did not end as
usual: busy (not admitted within --wait), superseded, replaced, reaped, lost.

On a terminal a utilization timeline per limit follows the table, one cell
per interval of the window, scaled to the terminal's width, from ▁ (a few
slots held) to █ (every slot held): a glance shows when a limit is the
bottleneck. Piped, the table alone, as plain aligned text. -o json is a
stable schema for scripts (docs/metrics.md).

The store keeps the newest 10,000 events: when the log is full, a window
starts at its oldest event; a limit's window starts no earlier than its
creation. The utilization uses the limit's size now.

EXIT STATUS
  0    shown
  64   bad flag or limit name, or no such limit
  69   the store cannot be opened or reached`),
		Example: `  slotctl stats
  slotctl stats build --since 7d
  slotctl stats -o json | jq '.limits[] | select(.utilization > 0.9) | .limit'`,
		ValidArgsFunction: f.completeLimits,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Limits = args
			if err := checkOutput(o.Output, outTable, outJSON); err != nil {
				return err
			}
			if err := checkLimitNames("limit", o.Limits); err != nil {
				return err
			}
			if err := checkDuration("since", o.Since, time.Minute, 10*366*24*time.Hour); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return runStats(cmd.Context(), f, g, o)
		},
	}
	cmd.Flags().VarP(newDaysValue(24*time.Hour, &o.Since), "since", "s", "the window: the last `DURATION` (e.g. 90m, 24h, 7d)")
	addOutputFlag(cmd, &o.Output, "output format: table or json")
	return cmd
}

// runStats is slotctl stats: one snapshot (the limits and who holds them
// now) and the whole event log.
func runStats(ctx context.Context, f *Factory, g *globalOptions, o *StatsOptions) error {
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	snap, err := st.Snapshot(ctx, o.Limits...)
	if err != nil {
		return err
	}
	events, err := st.Events(ctx, "", store.MaxEvents)
	if err != nil {
		return err
	}
	from := snap.Now.Add(-o.Since)
	stats := computeStats(events, snap, from, len(events) >= store.MaxEvents)
	if o.Output == outJSON {
		return writeJSON(f.IO.Out, statsJSONOf(st.String(), snap.Now, o.Since, stats))
	}
	out := f.tableOut()
	if err := drawStats(out, stats); err != nil {
		return err
	}
	if !f.IO.OutTTY || len(stats) == 0 {
		return nil
	}
	fmt.Fprintln(out.w)
	return drawTimeline(out.w, stats, from, snap.Now, max(width(f.TermWidth), 40), time.Local)
}

var statsHeaders = []string{"LIMIT", "SLOTS", "RUNS", "WAIT P50", "P95", "MAX", "HOLD P50", "P95", "MAX", "UTIL", "BUSY", "SUPERSEDED", "REPLACED", "REAPED", "LOST"}

// statsDropOrder are the columns of statsHeaders a narrow terminal loses
// first: REPLACED, SUPERSEDED, the p95s, the maxima, SLOTS.
var statsDropOrder = []int{12, 11, 4, 7, 5, 8, 1}

// drawStats is the table of stats: one row per limit, fitted to a
// terminal's width by dropping columns (statsDropOrder; POLICY, last, is
// what a narrow terminal cuts).
func drawStats(out tableOut, stats []limitStats) error {
	// A POLICY column when some limit has a policy other than FIFO.
	policy := false
	for i := range stats {
		policy = policy || !stats[i].Policy.IsFIFO()
	}
	rows := make([][]string, 0, len(stats))
	for i := range stats {
		s := &stats[i]
		util := "-"
		if u, ok := s.Utilization(); ok {
			util = fmt.Sprintf("%.0f%%", 100*u)
		}
		row := []string{store.Printable(s.Limit), strconv.Itoa(s.Slots), strconv.Itoa(s.Runs)}
		for _, d := range [][]time.Duration{s.Waits, s.Holds} {
			if len(d) == 0 {
				row = append(row, "-", "-", "-")
				continue
			}
			row = append(row, statDuration(percentile(d, 50)), statDuration(percentile(d, 95)), statDuration(d[len(d)-1]))
		}
		row = append(row, util)
		for _, k := range statsKinds[:5] {
			row = append(row, strconv.Itoa(s.Kinds[k]))
		}
		if policy {
			row = append(row, policyCell(s.limit(), s.To))
		}
		rows = append(rows, row)
	}
	headers := statsHeaders
	if policy {
		headers = append(slices.Clip(headers), "POLICY")
	}
	if out.width > 0 {
		// On a narrow terminal the rarer figures go first, then the p95s.
		keep := narrowColumns(headers, rows, out.width, statsDropOrder)
		headers, rows = project(headers, rows, keep)
	}
	utilCol := slices.Index(headers, "UTIL")
	// Narrower still: long limit names shrink, and the lines are cut.
	return out.draw(headers, rows, 0, func(row, col int) string {
		if col != utilCol {
			return ""
		}
		switch u, ok := stats[row].Utilization(); {
		case !ok:
			return ""
		case u >= 0.9:
			return colorRed
		case u >= 0.6:
			return colorYellow
		}
		return ""
	})
}

// statDuration is a wait or hold time in a table: 350ms, 4.2s, 3m12s, 2h05m.
func statDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return human(d)
}

// blocks are the timeline's levels: a cell's utilization u > 0 is drawn
// with blocks[ceil(8u)-1], so █ is a cell where (nearly) every slot was
// held all the time; an idle cell, or one without data, is a space.
var blocks = []rune("▁▂▃▄▅▆▇█")

// timelineCell is the character of one cell of the timeline.
func timelineCell(u float64) rune {
	if math.IsNaN(u) || u <= 0 {
		return ' '
	}
	return blocks[min(max(int(math.Ceil(u*8))-1, 0), len(blocks)-1)]
}

// drawTimeline draws one line per limit, the cells of [from, to] between
// bars and the window's utilization after them, in width columns, the
// times in loc:
//
//	UTILIZATION  2026-03-13 09:00 to 2026-03-14 09:00 (now), one cell = 30m
//	build  │▁▁▃▅████▇▅▃▁      │  62%
func drawTimeline(w io.Writer, stats []limitStats, from, to time.Time, width int, loc *time.Location) error {
	name := 0
	for i := range stats {
		name = max(name, runewidth.StringWidth(store.Printable(stats[i].Limit)))
	}
	cells := max(width-name-2-2-5, 10)
	step := to.Sub(from) / time.Duration(cells)
	head := fmt.Sprintf("UTILIZATION  %s to %s (now), one cell = %s", from.In(loc).Format("2006-01-02 15:04"),
		to.In(loc).Format("2006-01-02 15:04"), statDuration(step.Round(time.Second)))
	if runewidth.StringWidth(head) > width {
		head = fmt.Sprintf("UTILIZATION  since %s, cell = %s", from.In(loc).Format("01-02 15:04"), statDuration(step.Round(time.Second)))
	}
	if _, err := fmt.Fprintln(w, head); err != nil {
		return err
	}
	for i := range stats {
		s := &stats[i]
		var b strings.Builder
		for _, u := range s.Timeline(from, to, cells) {
			b.WriteRune(timelineCell(u))
		}
		util := "   -"
		if u, ok := s.Utilization(); ok {
			util = fmt.Sprintf("%3.0f%%", 100*u)
		}
		label := store.Printable(s.Limit)
		label += strings.Repeat(" ", name-runewidth.StringWidth(label))
		if _, err := fmt.Fprintf(w, "%s  │%s│ %s\n", escapeControls(label), b.String(), util); err != nil {
			return err
		}
	}
	return nil
}

// statsJSON is the schema of stats -o json, version 1 (documented in docs/metrics.md).
type statsJSON struct {
	SchemaVersion int              `json:"schema_version"`
	Store         string           `json:"store"`
	Now           string           `json:"now"`
	SinceSeconds  float64          `json:"since_seconds"`
	Limits        []limitStatsJSON `json:"limits"`
}

type limitStatsJSON struct {
	Limit                string        `json:"limit"`
	Slots                int           `json:"slots"`
	From                 string        `json:"from"` // the window of this limit: from here to now
	Runs                 int           `json:"runs"`
	WaitSeconds          durationsJSON `json:"wait_seconds"`
	HoldSeconds          durationsJSON `json:"hold_seconds"`
	HeldSlotSeconds      float64       `json:"held_slot_seconds"`
	AvailableSlotSeconds float64       `json:"available_slot_seconds"`
	Utilization          *float64      `json:"utilization"` // null when paused
	Busy                 int           `json:"busy"`
	Superseded           int           `json:"superseded"`
	Replaced             int           `json:"replaced"`
	Reaped               int           `json:"reaped"`
	Lost                 int           `json:"lost"`
	Released             int           `json:"released"`
	Cancelled            int           `json:"cancelled"`
	ForceReleased        int           `json:"force_released"`
	Timeline             timelineJSON  `json:"timeline"`
	Policy               policyJSON    `json:"policy"` // now, as in limit ls -o json
}

// durationsJSON summarizes waits or holds; the figures are null when count is 0.
type durationsJSON struct {
	Count int      `json:"count"`
	P50   *float64 `json:"p50"`
	P95   *float64 `json:"p95"`
	Max   *float64 `json:"max"`
}

// timelineJSON is the utilization of each of Cells equal intervals of the
// window (now - since to now), oldest first; null where there is no data.
type timelineJSON struct {
	Cells       int        `json:"cells"`
	CellSeconds float64    `json:"cell_seconds"`
	Utilization []*float64 `json:"utilization"`
}

func statsJSONOf(storeURL string, now time.Time, since time.Duration, stats []limitStats) statsJSON {
	out := statsJSON{SchemaVersion: 1, Store: storeURL, Now: rfc3339(now), SinceSeconds: seconds(since), Limits: []limitStatsJSON{}}
	from := now.Add(-since)
	for i := range stats {
		s := &stats[i]
		j := limitStatsJSON{Limit: s.Limit, Slots: s.Slots, From: rfc3339(s.From), Runs: s.Runs,
			WaitSeconds: durationsOf(s.Waits), HoldSeconds: durationsOf(s.Holds),
			HeldSlotSeconds: round3(s.HeldSlotSeconds()), AvailableSlotSeconds: round3(s.AvailableSlotSeconds()),
			Busy: s.Kinds[string(store.Busy)], Superseded: s.Kinds[string(store.Superseded)], Replaced: s.Kinds["replaced"],
			Reaped: s.Kinds[string(store.Reaped)], Lost: s.Kinds[string(store.Lost)], Released: s.Kinds[string(store.Released)],
			Cancelled: s.Kinds[string(store.Cancelled)], ForceReleased: s.Kinds[string(store.ForceReleased)],
			Timeline: timelineJSON{Cells: statsJSONCells, CellSeconds: seconds(since / statsJSONCells), Utilization: []*float64{}},
			Policy:   policyJSONOf(s.limit(), now)}
		if u, ok := s.Utilization(); ok {
			j.Utilization = ptr(round4(u))
		}
		for _, u := range s.Timeline(from, now, statsJSONCells) {
			var v *float64
			if !math.IsNaN(u) {
				v = ptr(round4(u))
			}
			j.Timeline.Utilization = append(j.Timeline.Utilization, v)
		}
		out.Limits = append(out.Limits, j)
	}
	return out
}

func durationsOf(sorted []time.Duration) durationsJSON {
	d := durationsJSON{Count: len(sorted)}
	if len(sorted) > 0 {
		d.P50 = ptr(seconds(percentile(sorted, 50)))
		d.P95 = ptr(seconds(percentile(sorted, 95)))
		d.Max = ptr(seconds(sorted[len(sorted)-1]))
	}
	return d
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
func round4(v float64) float64 { return math.Round(v*10000) / 10000 }

// daysValue is a duration flag that also takes whole days ("7d"), which a
// window of stats is often counted in.
type daysValue struct{ d *time.Duration }

func newDaysValue(def time.Duration, p *time.Duration) *daysValue {
	*p = def
	return &daysValue{p}
}

func (v *daysValue) Set(s string) error {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 || days > 10*366 {
			return fmt.Errorf("bad number of days %q", s)
		}
		*v.d = time.Duration(days) * 24 * time.Hour
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (v *daysValue) String() string {
	if *v.d > 0 && *v.d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", *v.d/(24*time.Hour))
	}
	return v.d.String()
}

// Type is "duration": the flag errors say what a duration looks like.
func (v *daysValue) Type() string { return "duration" }

func ptr[T any](v T) *T { return &v }
