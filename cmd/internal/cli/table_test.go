package cli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/slotctl/slotctl/store"
)

// countingWriter counts the writes it is given.
type countingWriter struct {
	writes int
	b      strings.Builder
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes++
	return c.b.Write(p)
}

// TestTableWritesBuffered: a plain table of 10,000 rows reaches its writer
// in a few writes, not one a cell (a pipe's reader woken 200,000 times
// doubled the time of ls on 10,000 tickets), and reads as tabwriter lays
// it out.
func TestTableWritesBuffered(t *testing.T) {
	rows := make([][]string, 10000)
	for i := range rows {
		rows[i] = []string{fmt.Sprintf("limit-%03d", i%100), "held", fmt.Sprint(i)}
	}
	var w countingWriter
	if err := (tableOut{w: &w}).draw([]string{"LIMIT", "STATE", "N"}, rows, -1, nil); err != nil {
		t.Fatal(err)
	}
	if w.writes > 100 {
		t.Errorf("a table of %d rows took %d writes, want a few (buffered)", len(rows), w.writes)
	}
	lines := strings.Split(strings.TrimSuffix(w.b.String(), "\n"), "\n")
	if len(lines) != len(rows)+1 || lines[0] != "LIMIT      STATE  N" || lines[1] != "limit-000  held   0" {
		t.Errorf("table: %d lines, starting %q, %q", len(lines), lines[0], lines[1])
	}
}

// TestEventsJSONWritesBuffered: log -o json's lines of one batch reach the
// writer together, each line whole and escaped as before.
func TestEventsJSONWritesBuffered(t *testing.T) {
	events := make([]store.Event, 1000)
	for i := range events {
		events[i] = store.Event{Seq: uint64(i + 1), Kind: "admitted", Limit: "l", Ticket: fmt.Sprintf("%032x", i), Slot: 0, Command: "echo \u202e"}
	}
	var w countingWriter
	if err := writeEventsJSON(&w, events); err != nil {
		t.Fatal(err)
	}
	if w.writes > 20 {
		t.Errorf("%d events took %d writes, want a few (buffered)", len(events), w.writes)
	}
	lines := strings.Split(strings.TrimSuffix(w.b.String(), "\n"), "\n")
	if len(lines) != len(events) || !strings.Contains(lines[0], `"command":"echo \u202e"`) {
		t.Errorf("%d lines; the first %q", len(lines), lines[0])
	}
}
