package cli

// Tests of slotctl stats: golden files of the table, the timeline (at a
// fixed width) and the JSON over a fixed event log, and the arithmetic
// (percentiles, utilization with weights and resizes, the block levels).
//
//	go test ./cmd/internal/cli -run 'Stats' -update   # rewrite testdata/golden/stats*

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mattn/go-runewidth"

	"github.com/slotctl/slotctl/store"
)

// statsNow is the fixed log's "now".
var statsNow = time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)

// statsFixture is a fixed event log and snapshot, over the 24 hours before statsNow:
//
//	build, 2 slots: A held 10:00-12:00; B held 11:00-14:00, weight 1 then
//	2 from 12:30 (resized); F reaped at 09:30 after an hour (admitted
//	before the window); H held since 06:00 (still held); a busy run, a
//	superseded one, a replaced one (that released later), a lost one.
//	deploy, 1 slot, created at 21:00: X held 22:00-23:00, Y 01:00-02:30.
//	paused, 0 slots: nothing.
func statsFixture() ([]store.Event, store.Snapshot) {
	day := func(h, m int) time.Time { return time.Date(2026, 3, 13, h, m, 0, 0, time.UTC) }
	next := func(h, m int) time.Time { return time.Date(2026, 3, 14, h, m, 0, 0, time.UTC) }
	ev := func(at time.Time, kind, limit, ticket string) store.Event {
		return store.Event{Time: at, Kind: kind, Limit: limit, Ticket: ticket, Slot: 0}
	}
	adm := func(at time.Time, limit, ticket string, waited time.Duration) store.Event {
		e := ev(at, "admitted", limit, ticket)
		e.Waited = waited
		return e
	}
	rem := func(at time.Time, kind, limit, ticket string, held time.Duration, weight int) store.Event {
		e := ev(at, kind, limit, ticket)
		e.Held, e.Weight = held, weight
		return e
	}
	resized := ev(day(12, 30), store.Resized, "build", "B")
	resized.Weight = 2
	events := []store.Event{
		adm(day(8, 30), "build", "F", 0),
		rem(day(9, 30), "reaped", "build", "F", time.Hour, 0),
		adm(day(10, 0), "build", "A", 2*time.Second),
		adm(day(11, 0), "build", "B", 30*time.Second),
		ev(day(11, 5), "busy", "build", "C"),
		rem(day(12, 0), "released", "build", "A", 2*time.Hour, 0),
		resized,
		ev(day(12, 40), "superseded", "build", "D"),
		rem(day(14, 0), "released", "build", "B", 3*time.Hour, 2),
		adm(day(15, 0), "build", "E", 4*time.Minute),
		ev(day(15, 30), "replaced", "build", "E"),
		rem(day(15, 31), "released", "build", "E", 31*time.Minute, 0),
		adm(day(16, 0), "build", "G", 700*time.Millisecond),
		rem(day(16, 20), "lost", "build", "G", 20*time.Minute, 0),
		adm(day(22, 0), "deploy", "X", 5*time.Minute),
		rem(day(23, 0), "released", "deploy", "X", time.Hour, 0),
		adm(next(1, 0), "deploy", "Y", 0),
		rem(next(2, 30), "released", "deploy", "Y", 90*time.Minute, 0),
		adm(next(6, 0), "build", "H", 12*time.Second),
	}
	snap := store.Snapshot{Now: statsNow,
		Limits: []store.Limit{
			{Name: "build", Slots: 2, Held: 1, Created: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
			{Name: "deploy", Slots: 1, Created: day(21, 0)},
			{Name: "paused", Slots: 0, Created: day(0, 0)},
		},
		Tickets: []store.Ticket{{ID: "H", Limit: "build", State: store.Held, Created: next(6, 0).Add(-12 * time.Second), Admitted: next(6, 0)}},
	}
	return events, snap
}

func TestStatsGolden(t *testing.T) {
	events, snap := statsFixture()
	from := statsNow.Add(-24 * time.Hour)
	stats := computeStats(events, snap, from, false)

	var table bytes.Buffer
	if err := drawStats(tableOut{w: &table}, stats); err != nil {
		t.Fatal(err)
	}
	lsGolden(t, "stats.txt", table.Bytes())

	var tl bytes.Buffer
	if err := drawTimeline(&tl, stats, from, statsNow, 80, time.UTC); err != nil {
		t.Fatal(err)
	}
	lsGolden(t, "stats_timeline.txt", tl.Bytes())
	for _, line := range strings.Split(strings.TrimSuffix(tl.String(), "\n"), "\n") {
		if w := len([]rune(line)); w > 80 {
			t.Errorf("timeline line of %d columns, want <= 80: %q", w, line)
		}
	}

	var js bytes.Buffer
	if err := writeJSON(&js, statsJSONOf("/golden/slots.db", statsNow, 24*time.Hour, stats)); err != nil {
		t.Fatal(err)
	}
	lsGolden(t, "stats.json", js.Bytes())
	var back statsJSON
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.SchemaVersion != 1 || len(back.Limits) != 3 {
		t.Fatalf("stats -o json does not read back: %v %+v", err, back)
	}
}

// TestStatsFigures checks the fixture's figures by hand, so that a golden
// file rewritten with a bug in it is caught too.
func TestStatsFigures(t *testing.T) {
	events, snap := statsFixture()
	stats := computeStats(events, snap, statsNow.Add(-24*time.Hour), false)
	build, deploy, paused := &stats[0], &stats[1], &stats[2]

	if build.Runs != 5 || deploy.Runs != 2 || paused.Runs != 0 {
		t.Errorf("runs %d %d %d, want 5 2 0 (F's admission is before the window)", build.Runs, deploy.Runs, paused.Runs)
	}
	// build's holds in the window: F 1h (removed at 09:30), A 2h, B 3h, E 31m, G 20m.
	if got, want := build.Holds, []time.Duration{20 * time.Minute, 31 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour}; !durationsEqual(got, want) {
		t.Errorf("build holds %v, want %v", got, want)
	}
	if p50, p95 := percentile(build.Holds, 50), percentile(build.Holds, 95); p50 != time.Hour || p95 != 3*time.Hour {
		t.Errorf("build hold p50 %v p95 %v, want 1h 3h", p50, p95)
	}
	// Held slot-seconds of build in [03-13 09:00, 03-14 09:00]: F 30m (its
	// first half hour is before the window), A 2h, B 1h30m at weight 1 then
	// 1h30m at weight 2, E 31m, G 20m, H 3h: 10h51m = 39060 s of 2×24h.
	if got, want := build.HeldSlotSeconds(), 39060.0; got != want {
		t.Errorf("build held slot-seconds %v, want %v", got, want)
	}
	if u, ok := build.Utilization(); !ok || math.Abs(u-39060.0/172800) > 1e-12 {
		t.Errorf("build utilization %v %v, want %v", u, ok, 39060.0/172800)
	}
	// deploy was created at 21:00: its window is 12h, held 2h30m.
	if u, ok := deploy.Utilization(); !ok || math.Abs(u-2.5/12) > 1e-12 || !deploy.From.Equal(snap.Limits[1].Created) {
		t.Errorf("deploy utilization %v %v from %v, want %v from its creation", u, ok, deploy.From, 2.5/12)
	}
	if _, ok := paused.Utilization(); ok {
		t.Errorf("a paused limit has a utilization")
	}
	for k, want := range map[string]int{"busy": 1, "superseded": 1, "replaced": 1, "reaped": 1, "lost": 1, "released": 3} {
		if build.Kinds[k] != want {
			t.Errorf("build %s = %d, want %d", k, build.Kinds[k], want)
		}
	}
	// The resize shows in the timeline: 12:30-14:00 holds both of build's
	// slots (B at weight 2; A was gone at 12:00).
	tl := build.Timeline(time.Date(2026, 3, 13, 12, 30, 0, 0, time.UTC), time.Date(2026, 3, 13, 14, 0, 0, 0, time.UTC), 3)
	for i, u := range tl {
		if u != 1 {
			t.Errorf("cell %d of 12:30-14:00 = %v, want 1 (weight 2 of 2 slots)", i, u)
		}
	}
	// Before deploy existed: no data.
	if tl := deploy.Timeline(statsNow.Add(-24*time.Hour), statsNow, 24); !math.IsNaN(tl[0]) || math.IsNaN(tl[13]) {
		t.Errorf("deploy timeline %v: want no data before 21:00 and data after", tl)
	}
}

// TestStatsPrunedLog: a full log (store.MaxEvents) knows nothing before
// its oldest event, so the window starts there.
func TestStatsPrunedLog(t *testing.T) {
	events, snap := statsFixture()
	events = events[2:] // the oldest kept is A's admission at 10:00
	stats := computeStats(events, snap, statsNow.Add(-24*time.Hour), true)
	if want := events[0].Time; !stats[0].From.Equal(want) {
		t.Errorf("window of a pruned log starts %v, want %v", stats[0].From, want)
	}
}

func TestPercentile(t *testing.T) {
	d := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, x := range n {
			out = append(out, time.Duration(x)*time.Second)
		}
		return out
	}
	for _, c := range []struct {
		values []time.Duration
		p      float64
		want   time.Duration
	}{
		{d(), 50, 0},
		{d(7), 50, 7 * time.Second},
		{d(7), 95, 7 * time.Second},
		{d(1, 2, 3, 4), 50, 2 * time.Second},
		{d(1, 2, 3, 4), 95, 4 * time.Second},
		{d(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20), 95, 19 * time.Second},
		{d(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20), 50, 10 * time.Second},
	} {
		if got := percentile(c.values, c.p); got != c.want {
			t.Errorf("p%v of %v = %v, want %v", c.p, c.values, got, c.want)
		}
	}
}

func TestTimelineCell(t *testing.T) {
	for _, c := range []struct {
		u    float64
		want rune
	}{{math.NaN(), ' '}, {0, ' '}, {0.01, '▁'}, {0.125, '▁'}, {0.126, '▂'}, {0.5, '▄'}, {0.99, '█'}, {1, '█'}, {1.5, '█'}} {
		if got := timelineCell(c.u); got != c.want {
			t.Errorf("timelineCell(%v) = %q, want %q", c.u, got, c.want)
		}
	}
}

func TestSinceFlag(t *testing.T) {
	var d time.Duration
	v := newDaysValue(24*time.Hour, &d)
	if v.String() != "1d" {
		t.Errorf("default shows as %q", v.String())
	}
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "90m": 90 * time.Minute, "36h": 36 * time.Hour} {
		if err := v.Set(in); err != nil || d != want {
			t.Errorf("--since %s: %v %v, want %v", in, d, err, want)
		}
	}
	for _, in := range []string{"d", "-1d", "7x", "1.5d", ""} {
		if err := v.Set(in); err == nil {
			t.Errorf("--since %q accepted", in)
		}
	}
}

func durationsEqual(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStatsTerminal: on a terminal the timeline follows the table and fits
// the width; piped, the table alone, without escape sequences.
func TestStatsTerminal(t *testing.T) {
	e := newLsEnv(t)
	lsGoldenStore(t, e) // a few limits and tickets, with their events
	for _, c := range []struct {
		tty   bool
		width int
	}{{true, 50}, {true, 60}, {true, 200}, {false, 0}} {
		f, out, errOut := lsFactory(e.env, nil, c.tty, c.width)
		f.Getenv = func(k string) string {
			if k == "NO_COLOR" {
				return "1"
			}
			return e.env[k]
		}
		if code := lsRun(t, f, "stats"); code != 0 {
			t.Fatalf("stats: exit %d: %s", code, errOut)
		}
		s := out.String()
		if got := strings.Contains(s, "UTILIZATION"); got != c.tty {
			t.Errorf("tty %v: timeline shown %v:\n%s", c.tty, got, s)
		}
		if !strings.HasPrefix(s, "LIMIT ") || strings.Contains(s, "\x1b") {
			t.Errorf("tty %v: not a plain table:\n%q", c.tty, s)
		}
		if c.tty {
			for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
				if w := runewidth.StringWidth(line); w > c.width {
					t.Errorf("width %d: a line of %d columns: %q", c.width, w, line)
				}
			}
			i := strings.Index(s, "UTILIZATION")
			for _, line := range strings.Split(strings.TrimSuffix(s[i:], "\n"), "\n")[1:] {
				if w := len([]rune(line)); w > c.width || w < c.width-8 {
					t.Errorf("width %d: a timeline line of %d columns: %q", c.width, w, line)
				}
			}
		}
	}
}

// TestStatsJSONSchemaMatchesDocs: every field of stats -o json (to the
// second level) is in the table of docs/metrics.md, and every field there
// is emitted.
func TestStatsJSONSchemaMatchesDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "`slotctl stats -o json` (schema version 1")
	if start < 0 {
		t.Fatal("docs/metrics.md: no schema of slotctl stats -o json")
	}
	text = text[start:]
	if end := strings.Index(text, "\n\n#"); end >= 0 { // the table ends at the next heading
		text = text[:end]
	}
	tick := regexp.MustCompile("`([^`]+)`")
	documented := map[string]bool{}
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		names := tick.FindAllStringSubmatch(strings.Split(line, "|")[1], -1)
		prefix := ""
		if i := strings.LastIndex(names[0][1], "."); i >= 0 {
			prefix = names[0][1][:i+1]
		}
		for i, n := range names {
			if i > 0 {
				documented[prefix+n[1]] = true
			} else {
				documented[n[1]] = true
			}
		}
	}
	events, snap := statsFixture()
	var js bytes.Buffer
	if err := writeJSON(&js, statsJSONOf("/s.db", statsNow, 24*time.Hour, computeStats(events, snap, statsNow.Add(-24*time.Hour), false))); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	emitted := map[string]bool{}
	for k, v := range doc {
		if arr, ok := v.([]any); ok {
			for _, el := range arr {
				for sub := range el.(map[string]any) {
					emitted[k+"[]."+sub] = true
				}
			}
			continue
		}
		emitted[k] = true
	}
	for k := range emitted {
		if !documented[k] {
			t.Errorf("stats -o json emits %q, which the table of docs/metrics.md does not describe", k)
		}
	}
	for k := range documented {
		if !emitted[k] {
			t.Errorf("docs/metrics.md documents %q, which stats -o json does not emit", k)
		}
	}
}

// TestStatsArbitraryLog: whatever the log holds (a hostile or corrupt
// store's events: kinds out of order, negative or huge times, weights,
// removals without admissions), stats neither panics nor prints a figure
// that is not a number, and its timeline has the cells asked for.
func TestStatsArbitraryLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []string{"admitted", "released", "cancelled", "busy", "superseded", "replaced", "reaped", "lost", "force-released", store.Resized, "other"}
	for i := range 500 {
		now := statsNow
		var events []store.Event
		for range rng.IntN(60) {
			e := store.Event{Time: now.Add(time.Duration(rng.Int64N(int64(72*time.Hour))) - 48*time.Hour), Kind: kinds[rng.IntN(len(kinds))],
				Limit: []string{"a", "b", "c"}[rng.IntN(3)], Ticket: fmt.Sprint(rng.IntN(8)), Weight: rng.IntN(4) - 1,
				Waited: time.Duration(rng.Int64N(int64(4*time.Hour))) - time.Hour, Held: time.Duration(rng.Int64N(int64(80*time.Hour))) - time.Hour}
			events = append(events, e)
		}
		slices.SortFunc(events, func(a, b store.Event) int { return a.Time.Compare(b.Time) })
		snap := store.Snapshot{Now: now, Limits: []store.Limit{{Name: "a", Slots: rng.IntN(3)}, {Name: "b", Slots: 2, Created: now.Add(-time.Hour)}}}
		for range rng.IntN(4) {
			snap.Tickets = append(snap.Tickets, store.Ticket{ID: fmt.Sprint(rng.IntN(8)), Limit: "a", State: store.Held, Weight: rng.IntN(3),
				Admitted: now.Add(time.Duration(rng.Int64N(int64(50*time.Hour))) - 48*time.Hour)})
		}
		since := time.Duration(1+rng.IntN(48)) * time.Hour
		stats := computeStats(events, snap, now.Add(-since), rng.IntN(2) == 0)
		var out bytes.Buffer
		if err := drawStats(tableOut{w: &out}, stats); err != nil {
			t.Fatal(err)
		}
		if err := drawTimeline(&out, stats, now.Add(-since), now, 40+rng.IntN(100), time.UTC); err != nil {
			t.Fatal(err)
		}
		if err := writeJSON(&out, statsJSONOf("/s", now, since, stats)); err != nil {
			t.Fatalf("log %d: %v", i, err) // a NaN or an infinity cannot be written as JSON
		}
		for j := range stats {
			if u, ok := stats[j].Utilization(); ok && (math.IsNaN(u) || math.IsInf(u, 0) || u < 0) {
				t.Fatalf("log %d: utilization %v", i, u)
			}
			if tl := stats[j].Timeline(now.Add(-since), now, 17); len(tl) != 17 {
				t.Fatalf("log %d: %d cells", i, len(tl))
			}
		}
	}
}

// TestStatsRemovedOnce: a ticket reaped and then reported lost by its
// holder logs two events that carry Held; it held its slot once.
func TestStatsRemovedOnce(t *testing.T) {
	at := statsNow.Add(-time.Hour)
	events := []store.Event{
		{Time: at, Kind: "admitted", Limit: "a", Ticket: "T"},
		{Time: at.Add(10 * time.Minute), Kind: "reaped", Limit: "a", Ticket: "T", Held: 10 * time.Minute},
		{Time: at.Add(11 * time.Minute), Kind: "lost", Limit: "a", Ticket: "T", Held: 11 * time.Minute},
	}
	snap := store.Snapshot{Now: statsNow, Limits: []store.Limit{{Name: "a", Slots: 1}}}
	s := computeStats(events, snap, statsNow.Add(-24*time.Hour), false)[0]
	if len(s.Holds) != 1 || s.HeldSlotSeconds() != 600 || s.Kinds["reaped"] != 1 || s.Kinds["lost"] != 1 {
		t.Errorf("holds %v, %v slot-seconds, kinds %v: want one hold of 10m, 600, one reaped and one lost", s.Holds, s.HeldSlotSeconds(), s.Kinds)
	}
}
