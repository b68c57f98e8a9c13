package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/lipgloss/table"
	"github.com/charmbracelet/x/ansi"
	"github.com/mattn/go-runewidth"
	"github.com/muesli/termenv"
)

// tableOut says how a data command draws its tables: lipgloss with colour
// on a terminal, plain aligned text elsewhere or with NO_COLOR (docs/leases.md §2).
type tableOut struct {
	w     io.Writer
	color bool
	width int                // terminal width; 0: do not fit
	r     *lipgloss.Renderer // made for the terminal, also when drawing into a buffer first
}

func (f *Factory) tableOut() tableOut {
	t := tableOut{w: f.IO.Out}
	if f.IO.OutTTY && f.Getenv("NO_COLOR") == "" {
		t.color = true
		// The factory says what stdout is and holds the environment the
		// colour profile comes from (under CI, as termenv has it, no TTY).
		t.r = lipgloss.NewRenderer(f.IO.Out, termenv.WithEnvironment(environ{f}), termenv.WithTTY(f.Getenv("CI") == ""))
	}
	if f.IO.OutTTY {
		t.width = width(f.TermWidth)
	}
	return t
}

// cellStyle colours one cell; "" is plain.
type cellStyle func(row, col int) string

// Colours by name: what a state or a lease close to expiry looks like.
const (
	colorGreen  = "2"
	colorYellow = "3"
	colorRed    = "1"
	colorGray   = "8"
)

// draw writes one table. fit, if >= 0, is the column shrunk (with an
// ellipsis) so that the table fits the terminal's width.
func (t tableOut) draw(headers []string, rows [][]string, fit int, style cellStyle) error {
	for _, r := range rows { // the callers escaped stored text already; this is the net
		for i, c := range r {
			r[i] = escapeControls(c)
		}
	}
	if fit >= 0 && t.width > 0 {
		fitColumn(headers, rows, fit, t.width-2*len(headers))
		// The other columns alone may be wider than the terminal: cut the lines.
		var b bytes.Buffer
		t2 := t
		t2.w = &b
		if err := t2.drawAll(headers, rows, style); err != nil {
			return err
		}
		for line := range strings.SplitSeq(strings.TrimSuffix(b.String(), "\n"), "\n") {
			if _, err := fmt.Fprintln(t.w, ansi.Truncate(line, t.width, "…")); err != nil {
				return err
			}
		}
		return nil
	}
	return t.drawAll(headers, rows, style)
}

func (t tableOut) drawAll(headers []string, rows [][]string, style cellStyle) error {
	if !t.color {
		// tabwriter writes each cell and its padding apart: buffered, a
		// table of 10,000 rows is a few writes, not 200,000 (each one a
		// wake-up of whatever reads the pipe).
		bw := bufio.NewWriterSize(t.w, 64<<10)
		tw := tabwriter.NewWriter(bw, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(headers, "\t"))
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		return bw.Flush()
	}
	r := t.r
	if r == nil {
		r = lipgloss.NewRenderer(t.w)
	}
	header := r.NewStyle().Bold(true).PaddingRight(2)
	cell := r.NewStyle().PaddingRight(2)
	tb := table.New().Headers(headers...).Rows(rows...).
		Border(lipgloss.HiddenBorder()).BorderTop(false).BorderBottom(false).BorderLeft(false).BorderRight(false).
		BorderColumn(false).BorderHeader(false).
		StyleFunc(func(row, col int) lipgloss.Style {
			if row == table.HeaderRow {
				return header
			}
			if style != nil {
				if c := style(row, col); c != "" {
					return cell.Foreground(lipgloss.Color(c))
				}
			}
			return cell
		})
	_, err := fmt.Fprintln(t.w, tb.Render())
	return err
}

// fitColumn shortens column col so that the widest row is at most width.
func fitColumn(headers []string, rows [][]string, col, width int) {
	widths := make([]int, len(headers))
	for i, h := range headers {
		widths[i] = runewidth.StringWidth(h)
	}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], runewidth.StringWidth(c))
		}
	}
	others := 0
	for i, w := range widths {
		if i != col {
			others += w
		}
	}
	room := max(width-others, runewidth.StringWidth(headers[col]), 8)
	for _, r := range rows {
		if runewidth.StringWidth(r[col]) > room {
			r[col] = runewidth.Truncate(r[col], room, "…")
		}
	}
}

// narrowColumns picks the columns to show on a terminal width columns wide:
// all, unless the others would leave the last column (fitted with an
// ellipsis) less than 8 columns; then it drops columns in the given order
// until they do not. It returns the indices kept, in order.
func narrowColumns(headers []string, rows [][]string, width int, order []int) []int {
	widths := make([]int, len(headers))
	for i, h := range headers {
		widths[i] = runewidth.StringWidth(h)
	}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], runewidth.StringWidth(c))
		}
	}
	last := len(headers) - 1
	dropped := map[int]bool{}
	need := func() int {
		n := max(runewidth.StringWidth(headers[last]), 8) + 2
		for i, w := range widths[:last] {
			if !dropped[i] {
				n += w + 2
			}
		}
		return n
	}
	for _, c := range order {
		if need() <= width {
			break
		}
		dropped[c] = true
	}
	var keep []int
	for i := range headers {
		if !dropped[i] {
			keep = append(keep, i)
		}
	}
	return keep
}

// project keeps the columns cols of headers and rows.
func project(headers []string, rows [][]string, cols []int) ([]string, [][]string) {
	h := make([]string, len(cols))
	for i, c := range cols {
		h[i] = headers[c]
	}
	out := make([][]string, len(rows))
	for r, row := range rows {
		out[r] = make([]string, len(cols))
		for i, c := range cols {
			out[r][i] = row[c]
		}
	}
	return h, out
}
