package cli

// Tests of slotctl metrics: the encoding parsed back with expfmt (values,
// cumulative buckets, escaped labels), promtool check metrics on real
// output (promtool is required under CI=true: .ci/run installs Debian's
// prometheus package), and the values against the store after real runs.
//
//	go test ./cmd/internal/cli -run 'Metrics'
//	go test ./cmd/internal/cli -run XXX -bench Metrics100x10k -benchtime 10x

import (
	"bytes"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/slotctl/slotctl/store"
)

// parseMetrics reads the text format back with Prometheus's own parser.
func parseMetrics(t testing.TB, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("expfmt cannot parse slotctl metrics: %v\n%s", err, text)
	}
	return fams
}

// series is the value of family name for limit: the gauge's or counter's
// value, or a histogram's sample count; ok is false when there is none.
func series(fams map[string]*dto.MetricFamily, name, limit string) (m *dto.Metric, ok bool) {
	f := fams[name]
	if f == nil {
		return nil, false
	}
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if l.GetName() == "limit" && l.GetValue() == limit {
				return m, true
			}
		}
	}
	return nil, false
}

func metricValue(t testing.TB, fams map[string]*dto.MetricFamily, name, limit string) float64 {
	t.Helper()
	m, ok := series(fams, name, limit)
	if !ok {
		t.Fatalf("no %s{limit=%q}", name, limit)
	}
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("%s{limit=%q} has no value", name, limit)
	return 0
}

// promtoolCheck runs promtool check metrics on text, in a subtest: without
// promtool it skips, except under CI (CI=true), where .ci/run installs it.
func promtoolCheck(t *testing.T, text []byte) {
	t.Helper()
	t.Run("promtool check metrics", func(t *testing.T) {
		path := needPromtool(t)
		cmd := exec.Command(path, "check", "metrics")
		cmd.Stdin = bytes.NewReader(text)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool check metrics: %v\n%s\non:\n%s", err, out, text)
		}
	})
}

// needPromtool is promtool's path; without it the test skips, or fails under CI.
func needPromtool(t *testing.T) string {
	t.Helper()
	return needTool(t, "promtool", "prometheus")
}

func TestMetricsEncoding(t *testing.T) {
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	snap := store.Snapshot{Now: now,
		Limits: []store.Limit{{Name: "build", Slots: 2, Held: 2, Waiting: 1}, {Name: "idle", Slots: 0}},
		Tickets: []store.Ticket{
			{ID: "a", Limit: "build", State: store.Held, Weight: 1, Created: now.Add(-time.Hour), Admitted: now.Add(-50 * time.Minute)},
			{ID: "b", Limit: "build", State: store.Held, Created: now.Add(-10 * time.Minute), Admitted: now.Add(-9 * time.Minute)},
			{ID: "c", Limit: "build", State: store.Waiting, Created: now.Add(-90 * time.Second)},
		}}
	c := store.Counts{Limit: "build", Admitted: 7, Released: 3, Cancelled: 1, Busy: 2, Superseded: 4, Replaced: 5, Reaped: 6, Lost: 8, ForceReleased: 9}
	for _, d := range []time.Duration{50 * time.Millisecond, 2 * time.Second, 2 * time.Second, 2 * time.Hour, 48 * time.Hour} {
		c.Wait.Observe(d)
	}
	c.Hold.Observe(30 * time.Second)
	var b bytes.Buffer
	if err := writeMetrics(&b, snap, []store.Counts{c, {Limit: "idle"}}); err != nil {
		t.Fatal(err)
	}
	fams := parseMetrics(t, b.Bytes())
	for name, want := range map[string]float64{
		metricSlots: 2, metricHeld: 2, metricWaiting: 1, metricPaused: 0, metricWaiterAge: 90, metricHolderAge: 3000,
		"slotctl_limit_admitted_total": 7, "slotctl_limit_released_total": 3, "slotctl_limit_cancelled_total": 1,
		"slotctl_limit_busy_total": 2, "slotctl_limit_superseded_total": 4, "slotctl_limit_replaced_total": 5,
		"slotctl_limit_reaped_total": 6, "slotctl_limit_lost_total": 8, "slotctl_limit_force_released_total": 9,
		metricWaitTime: 5, metricHoldTime: 1,
	} {
		if got := metricValue(t, fams, name, "build"); got != want {
			t.Errorf("%s{limit=\"build\"} = %v, want %v", name, got, want)
		}
	}
	if got := metricValue(t, fams, metricPaused, "idle"); got != 1 {
		t.Errorf("paused of a 0-slot limit = %v", got)
	}
	if got := metricValue(t, fams, metricWaiterAge, "idle"); got != 0 {
		t.Errorf("oldest waiter of a limit without waiters = %v, want 0", got)
	}
	// Cumulative buckets: 0.05 <= 0.1; 2 s twice <= 5; 2 h <= 7200; 48 h only in +Inf.
	m, _ := series(fams, metricWaitTime, "build")
	h := m.Histogram
	if math.Abs(h.GetSampleSum()-(0.05+4+7200+172800)) > 1e-6 {
		t.Errorf("wait sum %v", h.GetSampleSum())
	}
	want := map[float64]uint64{0.1: 1, 1: 1, 5: 3, 3600: 3, 7200: 4, 86400: 4, math.Inf(1): 5}
	seen := 0
	for _, bk := range h.Bucket {
		if w, ok := want[bk.GetUpperBound()]; ok {
			seen++
			if bk.GetCumulativeCount() != w {
				t.Errorf("bucket le=%v: %d, want %d", bk.GetUpperBound(), bk.GetCumulativeCount(), w)
			}
		}
	}
	if seen != len(want) || len(h.Bucket) != len(store.HistogramBounds)+1 {
		t.Errorf("%d buckets (%d checked), want %d and +Inf", len(h.Bucket), seen, len(store.HistogramBounds))
	}
	for _, want := range []string{"# HELP slotctl_limit_held_slots ", "# TYPE slotctl_limit_held_slots gauge", "# TYPE slotctl_limit_admitted_total counter",
		"# TYPE slotctl_limit_wait_seconds histogram", `slotctl_limit_wait_seconds_bucket{limit="build",le="+Inf"} 5`} {
		if !bytes.Contains(b.Bytes(), []byte(want)) {
			t.Errorf("output lacks %q", want)
		}
	}
	promtoolCheck(t, b.Bytes())
}

// TestMetricsLabelEscaping: a limit name is validated on the way in, but
// the encoder must not depend on that: a stored name with a quote, a
// backslash or a newline (a hostile record) comes back as the same string.
func TestMetricsLabelEscaping(t *testing.T) {
	name := "a\"b\\c\nd"
	snap := store.Snapshot{Now: time.Now(), Limits: []store.Limit{{Name: name, Slots: 1}}}
	var b bytes.Buffer
	if err := writeMetrics(&b, snap, []store.Counts{{Limit: name}}); err != nil {
		t.Fatal(err)
	}
	if strings.Count(b.String(), "\n") != strings.Count(b.String(), "\nslotctl_")+strings.Count(b.String(), "\n#")+1 {
		t.Errorf("a raw newline in a label value:\n%s", b.String())
	}
	fams := parseMetrics(t, b.Bytes())
	if got := metricValue(t, fams, metricSlots, name); got != 1 {
		t.Errorf("slots of %q = %v", name, got)
	}
}

func TestMetricsEmptyStore(t *testing.T) {
	var b bytes.Buffer
	if err := writeMetrics(&b, store.Snapshot{Now: time.Now()}, nil); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 0 {
		t.Errorf("metrics of a store without limits: %q, want nothing", b.String())
	}
}

// TestAlertRules: the README's example alerts (packaging/prometheus) are
// valid rules, fire when they should (promtool test rules over series
// that cross and do not cross their thresholds) and name only metrics
// that slotctl metrics writes.
func TestAlertRules(t *testing.T) {
	rules, err := os.ReadFile("../../../packaging/prometheus/slotctl.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	fams := parseMetrics(t, func() []byte {
		var b bytes.Buffer
		snap := store.Snapshot{Now: time.Now(), Limits: []store.Limit{{Name: "x", Slots: 1}}}
		if err := writeMetrics(&b, snap, []store.Counts{{Limit: "x"}}); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}())
	names := regexp.MustCompile(`slotctl_[a-z_]+`).FindAllString(string(rules), -1)
	if len(names) == 0 {
		t.Fatal("the rules name no slotctl metric")
	}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
		if fams[base] == nil {
			t.Errorf("the alert rules use %s, which slotctl metrics does not write", n)
		}
	}
	t.Run("promtool test rules", func(t *testing.T) {
		path := needPromtool(t)
		for _, args := range [][]string{{"check", "rules", "slotctl.rules.yml"}, {"test", "rules", "slotctl.rules.test.yml"}} {
			cmd := exec.Command(path, args...)
			cmd.Dir = "../../../packaging/prometheus"
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	})
}
