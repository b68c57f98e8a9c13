package cli

// Tests of scheduling policies as the commands read and show them: limit
// set's and run's flags, their bad values, limit set against a real store,
// the policy columns and JSON of ls and limit ls (golden files), the
// metrics' policy gauges and the rate in the waiting line's estimate. The
// end-to-end behaviour is the scripts' (testdata/script/sched_*.txtar and
// etcd_sched.txtar).
//
//	go test ./cmd/internal/cli -run 'Sched|Policy' -update   # rewrite testdata/golden/*policy*

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

func TestSchedFlags(t *testing.T) {
	prio, fifo := store.ByPriority, store.FIFO
	fair := store.Fair
	aging := 5 * time.Minute
	rate, none := store.Rate{N: 10, Per: time.Minute}, store.Rate{}
	for _, c := range []struct {
		args string
		want any
	}{
		{"limit set ci 2 --order priority --aging 5m --rate 10/1m", &LimitSetOptions{Name: "ci", Slots: 2,
			Policy: store.PolicyChange{Order: &prio, Aging: &aging, Rate: &rate}}},
		{"limit set --order fair ci 2", &LimitSetOptions{Name: "ci", Slots: 2, Policy: store.PolicyChange{Order: &fair}}},
		{"limit set ci 0 --order fifo --rate 0", &LimitSetOptions{Name: "ci", Slots: 0, Policy: store.PolicyChange{Order: &fifo, Rate: &none}}},
		{"limit set ci 3 --aging=30s", &LimitSetOptions{Name: "ci", Slots: 3, Policy: store.PolicyChange{Aging: ptr(30 * time.Second)}}},
		{"run -l ci --priority -100 --share team-a -- make", &RunOptions{Limits: []string{"ci"}, Weight: 1, Slots: 1, Wait: -1,
			BusyExitCode: exitBusy, TTL: defaultTTL, OnLost: "kill", KillAfter: defaultKillAfter, MaxWaiting: -1,
			Priority: -100, Share: "team-a", Argv: []string{"make"}}},
		{"run -l ci --priority 100 -- make", &RunOptions{Limits: []string{"ci"}, Weight: 1, Slots: 1, Wait: -1,
			BusyExitCode: exitBusy, TTL: defaultTTL, OnLost: "kill", KillAfter: defaultKillAfter, MaxWaiting: -1,
			Priority: 100, Argv: []string{"make"}}},
	} {
		t.Run(c.args, func(t *testing.T) {
			f, out, errOut := flagsFactory(t)
			var got any
			if code := mainWith(context.Background(), strings.Fields(c.args), f, stubRunFs(&got)); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("options:\n got %#v\nwant %#v", got, c.want)
			}
			if out.Len() != 0 || errOut.Len() != 0 {
				t.Errorf("output from flag parsing alone: stdout %q, stderr %q", out, errOut)
			}
		})
	}
	// --help after NAME SLOTS is the help, not a limit set.
	for _, h := range []string{"--help", "-h"} {
		f, out, _ := flagsFactory(t)
		var got any
		if code := mainWith(context.Background(), []string{"limit", "set", "ci", "2", "--order", "fair", h}, f, stubRunFs(&got)); code != 0 || got != nil {
			t.Errorf("limit set ci 2 --order fair %s: exit %d, ran with %#v", h, code, got)
		}
		if !strings.Contains(out.String(), "Usage:") {
			t.Errorf("limit set ci 2 %s: no help:\n%s", h, out)
		}
	}

	// acquire takes run's flags, and hands them to its slotctl run.
	f, _, errOut := flagsFactory(t)
	var got any
	if code := mainWith(context.Background(), []string{"acquire", "-l", "ci", "--priority", "7", "--share", "nightly"}, f, stubRunFs(&got)); code != 0 {
		t.Fatalf("acquire: exit %d: %s", code, errOut)
	}
	o, ok := got.(*AcquireOptions)
	if !ok || o.Run.Priority != 7 || o.Run.Share != "nightly" {
		t.Fatalf("acquire options: %#v", got)
	}
	if args := strings.Join(o.RunArgs, " "); !strings.Contains(args, "--priority=7") || !strings.Contains(args, "--share=nightly") {
		t.Errorf("acquire's run is given %q, want --priority=7 and --share=nightly", args)
	}
}

// TestSchedBadInput: a bad policy flag, priority or share is refused
// before the run function, exit 64, with one line naming the input and
// what is accepted.
func TestSchedBadInput(t *testing.T) {
	rate := `want N/DURATION, at most N admissions in any window of that length (10/1m, 1/1h: N 1-1000, DURATION 1s to 168h), or 0 for no rate`
	for _, c := range []struct {
		args []string
		line string
	}{
		{[]string{"limit", "set", "ci", "2", "--order", "lifo"}, `--order "lifo": want fifo, priority or fair`},
		{[]string{"limit", "set", "ci", "2", "--order", ""}, `--order "": want fifo, priority or fair`},
		{[]string{"limit", "set", "ci", "2", "--aging", "soon"}, `--aging "soon": want a duration from 1s to 168h (one point of priority per AGING waited)`},
		{[]string{"limit", "set", "ci", "2", "--aging", "500ms"}, `--aging "500ms": want a duration from 1s to 168h (one point of priority per AGING waited)`},
		{[]string{"limit", "set", "ci", "2", "--aging", "1000h"}, `--aging "1000h": want a duration from 1s to 168h (one point of priority per AGING waited)`},
		{[]string{"limit", "set", "ci", "2", "--order", "fair", "--aging", "1m"}, `--aging 1m with --order fair: aging applies to --order priority only`},
		{[]string{"limit", "set", "ci", "2", "--rate", "5"}, `--rate "5": ` + rate},
		{[]string{"limit", "set", "ci", "2", "--rate", "0/1m"}, `--rate "0/1m": ` + rate},
		{[]string{"limit", "set", "ci", "2", "--rate", "1001/1m"}, `--rate "1001/1m": ` + rate},
		{[]string{"limit", "set", "ci", "2", "--rate", "1/100ms"}, `--rate "1/100ms": ` + rate},
		{[]string{"limit", "set", "ci", "2", "--rate", "1/1y"}, `--rate "1/1y": ` + rate},
		{[]string{"limit", "set", "ci", "2", "--rate", "-1/1m"}, `--rate "-1/1m": ` + rate},
		{[]string{"limit", "set", "ci", "2", "--bogus"}, `unknown flag: --bogus; see 'slotctl limit set --help'`},
		{[]string{"limit", "set", "ci", "2", "3"}, `unexpected argument "3" after NAME SLOTS: want slotctl limit set NAME SLOTS [--order ...] [--aging ...] [--rate ...]; see 'slotctl limit set --help'`},
		{[]string{"limit", "set", "ci", "-1", "--order", "fair"}, `slot count "-1": want a whole number 0..65535 (0 pauses the limit)`},
		{[]string{"run", "-l", "ci", "--priority", "101", "--", "true"}, `--priority 101: want a whole number from -100 to 100 (higher goes first where the limit orders by priority)`},
		{[]string{"run", "-l", "ci", "--priority", "-101", "--", "true"}, `--priority -101: want a whole number from -100 to 100 (higher goes first where the limit orders by priority)`},
		{[]string{"run", "-l", "ci", "--priority", "high", "--", "true"}, `--priority "high": want a whole number; see 'slotctl run --help'`},
		{[]string{"run", "-l", "ci", "--share", "", "--", "true"}, `--share "": want 1-128 printable characters (what the run counts against in a fair limit; default: your user)`},
		{[]string{"run", "-l", "ci", "--share", "a\nb", "--", "true"}, `--share "a\nb": want 1-128 printable characters (what the run counts against in a fair limit; default: your user)`},
		{[]string{"acquire", "-l", "ci", "--priority", "500"}, `--priority 500: want a whole number from -100 to 100 (higher goes first where the limit orders by priority)`},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			f, out, errOut := flagsFactory(t)
			var got any
			if code := mainWith(context.Background(), c.args, f, stubRunFs(&got)); code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if got != nil {
				t.Errorf("the run function ran with %#v", got)
			}
			if want := "slotctl: " + c.line + "\n"; errOut.String() != want {
				t.Errorf("stderr:\n got %q\nwant %q", errOut, want)
			}
			if out.Len() != 0 {
				t.Errorf("stdout: %q", out)
			}
		})
	}
}

// TestLimitSetPolicy runs limit set on a real store: the flags given set
// their parts of the policy, a limit set without them keeps it, --order
// fifo and --rate 0 clear it, and a new limit is made with its policy.
func TestLimitSetPolicy(t *testing.T) {
	e := newLsEnv(t)
	set := func(args ...string) string {
		t.Helper()
		f, _, errOut := lsFactory(e.env, nil, false, 0)
		if code := lsRun(t, f, append([]string{"limit", "set"}, args...)...); code != 0 {
			t.Fatalf("limit set %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		return errOut.String()
	}
	policy := func() store.Policy {
		t.Helper()
		st, err := boltstore.New(e.store, boltstore.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		snap, err := st.Snapshot(context.Background(), "ci")
		if err != nil || len(snap.Limits) != 1 {
			t.Fatalf("snapshot: %v %v", snap.Limits, err)
		}
		return snap.Limits[0].Policy
	}
	if got := set("ci", "2", "--order", "priority", "--aging", "5m"); got != "slotctl: limit \"ci\": 2 slots, priority aging 5m0s (0 held, 0 waiting)\n" {
		t.Errorf("a new limit with a policy says %q", got)
	}
	want := store.Policy{Order: store.ByPriority, Aging: 5 * time.Minute}
	if got := policy(); got != want {
		t.Errorf("policy %+v, want %+v", got, want)
	}
	if got := set("ci", "3"); got != "slotctl: limit \"ci\": 3 slots (0 held, 0 waiting)\n" {
		t.Errorf("a resize alone says %q", got)
	}
	if got := policy(); got != want {
		t.Errorf("after a resize without policy flags: %+v, want %+v kept", got, want)
	}
	set("ci", "3", "--rate", "10/1m")
	want.Rate = store.Rate{N: 10, Per: time.Minute}
	if got := policy(); got != want {
		t.Errorf("after --rate alone: %+v, want %+v", got, want)
	}
	if got := set("ci", "3", "--order", "fifo"); got != "slotctl: limit \"ci\": 3 slots, fifo rate 10/1m0s (0 held, 0 waiting)\n" {
		t.Errorf("--order fifo says %q", got)
	}
	if got := policy(); got != (store.Policy{Rate: want.Rate}) {
		t.Errorf("after --order fifo: %+v, want the rate alone", got)
	}
	set("ci", "3", "--rate", "0")
	if got := policy(); !got.IsFIFO() || got != (store.Policy{}) {
		t.Errorf("after --rate 0: %+v, want the default", got)
	}
}

// schedGoldenStore builds a store of each kind of policy at e.store with a
// fake clock:
//
//	ci     1 slot, priority aging 1m: a holder; waiters of priority 0
//	       (3m ago), 5 (1m ago) and -1 (now): 3+0, 5+1, -1+0
//	shared 1 slot, fair: alice holds; alice waits, then bob (--share)
//	mail   2 slots, rate 1/1h: one run admitted and gone 10m ago, one waits
//
// and returns the clock.
func schedGoldenStore(t testing.TB, e *lsEnv) *boltstore.FakeClock {
	t.Helper()
	clock := boltstore.NewFakeClock(boltstore.Instant{Boot: "golden-boot", Mono: 1000 * time.Hour, Wall: lsGoldenWall})
	st, err := boltstore.New(e.store, boltstore.Options{Clock: clock, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	prio, fair := store.ByPriority, store.Fair
	for name, p := range map[string]store.PolicyChange{
		"ci": {Order: &prio}, "shared": {Order: &fair}, "mail": {Rate: &store.Rate{N: 1, Per: time.Hour}},
	} {
		size := 1
		if name == "mail" {
			size = 2
		}
		if _, err := st.SetLimit(ctx, name, size); err != nil {
			t.Fatal(err)
		}
		if _, err := st.SetPolicy(ctx, name, p); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = time.Hour
	enq := func(id, limit string, prio int, share string, h store.Holder) store.Ticket {
		t.Helper()
		tk, err := st.Enqueue(ctx, store.EnqueueRequest{ID: id, Limit: limit, TTL: ttl, Holder: h, Priority: prio, Share: share})
		if err != nil {
			t.Fatalf("Enqueue %s: %v", id, err)
		}
		return tk
	}
	m := enq("0d4f6a8c1e3b5d7f9a2c4e6b8d0f1a30", "mail", 0, "", lsHolder(300, "send-digest"))
	if _, err := st.Release(ctx, m, store.Released); err != nil {
		t.Fatal(err)
	}
	clock.Advance(7 * time.Minute)
	enq("1a3c5e7f9b2d4f6a8c0e2b4d6f8a0c10", "ci", 0, "", lsHolder(100, "make", "release"))
	enq("2b4d6f8a0c1e3a5c7e9b1d3f5a7c9e20", "ci", 0, "", lsHolder(101, "make", "nightly"))
	enq("6f8a0c2e4b1d3f5a7c9e1b3d5f7a9c60", "shared", 0, "", lsHolder(102, "make", "alice-1"))
	enq("7a9c1e3f5b2d4a6c8e0b2d4f6a8c0e70", "shared", 0, "", lsHolder(103, "make", "alice-2"))
	bob := lsHolder(104, "make", "bob-1")
	enq("8b0d2f4a6c1e3b5d7f9a1c3e5b7d9f80", "shared", 0, "bob", bob)
	clock.Advance(2 * time.Minute)
	enq("3c5e7a9b1d2f4a6c8e0b2d4f6a8c0e30", "ci", 5, "", lsHolder(105, "make", "hotfix"))
	clock.Advance(time.Minute)
	enq("4d6f8b0c2e1a3c5e7b9d1f3a5c7e9b40", "ci", -1, "", lsHolder(106, "make", "docs"))
	enq("5e7a9c1d3f2b4d6f8a0c2e4b6d8f0a50", "mail", 0, "", lsHolder(107, "send-digest"))
	return clock
}

// TestLsGoldenPolicy renders a store of every order and a spent rate: the
// POLICY column of the limits, PRIO and SHARE of the tickets, the waiters
// in each policy's order; the JSON with the policy, priority and share.
func TestLsGoldenPolicy(t *testing.T) {
	e := newLsEnv(t)
	clock := schedGoldenStore(t, e)
	for _, c := range []struct {
		golden string
		args   []string
	}{
		{"ls_policy.txt", []string{"ls"}},
		{"ls_policy.json", []string{"ls", "-o", "json"}},
		{"limit_ls_policy.txt", []string{"limit", "ls"}},
		{"limit_ls_policy.json", []string{"limit", "ls", "-o", "json"}},
	} {
		t.Run(c.golden, func(t *testing.T) {
			f, out, errOut := lsFactory(e.env, clock, false, 0)
			if code := lsRun(t, f, c.args...); code != 0 {
				t.Fatalf("slotctl %s: exit %d\n%s", strings.Join(c.args, " "), code, errOut)
			}
			lsGolden(t, c.golden, []byte(strings.ReplaceAll(out.String(), e.store, lsStorePlaceholder)))
		})
	}
	// What the golden files must say, whatever -update wrote.
	f, out, _ := lsFactory(e.env, clock, false, 0)
	lsRun(t, f, "ls")
	for _, want := range []string{
		"ci      1      1     3        no      priority aging 1m0s",
		"mail    2      0     1        no      fifo rate 1/1h0m0s (spent, opens in 50m00s)",
		"shared  1      1     2        no      fair",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("ls lacks %q:\n%s", want, out)
		}
	}
	var order []string
	for line := range strings.SplitSeq(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[1] == "waiting" {
			order = append(order, f[0]+":"+f[2]+":"+f[3]+":"+f[4]+":"+f[len(f)-1])
		}
	}
	want := []string{
		"ci:#1:6:-:hotfix",  // 5 + 1 minute waited
		"ci:#2:3:-:nightly", // 0 + 3
		"ci:#3:-1:-:docs",   // -1 + 0
		"mail:#1:-:-:send-digest",
		"shared:#1:-:bob:bob-1", // bob holds none; alice holds one
		"shared:#2:-:alice:alice-2",
	}
	if !reflect.DeepEqual(order, want) {
		t.Errorf("waiters (limit:place:PRIO:SHARE:command):\n got %q\nwant %q", order, want)
	}
}

func TestMetricsPolicy(t *testing.T) {
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	snap := store.Snapshot{Now: now, Limits: []store.Limit{
		{Name: "plain", Slots: 1},
		{Name: "ci", Slots: 2, Policy: store.Policy{Order: store.ByPriority, Aging: 5 * time.Minute}},
		{Name: "mail", Slots: 1, Policy: store.Policy{Order: store.Fair, Rate: store.Rate{N: 2, Per: time.Hour}},
			Starts: []time.Time{now.Add(-50 * time.Minute), now.Add(-10 * time.Minute)}, Opens: now.Add(10 * time.Minute)},
		{Name: "spare", Slots: 1, Policy: store.Policy{Rate: store.Rate{N: 3, Per: time.Minute}}, Starts: []time.Time{now.Add(-time.Second)}},
	}}
	var b bytes.Buffer
	if err := writeMetrics(&b, snap, nil); err != nil {
		t.Fatal(err)
	}
	fams := parseMetrics(t, b.Bytes())
	for _, c := range []struct {
		name, limit string
		want        float64
	}{
		{metricAging, "ci", 300},
		{metricRateN, "mail", 2}, {metricRatePer, "mail", 3600}, {metricRateLeft, "mail", 0}, {metricRateOpens, "mail", 600},
		{metricRateN, "spare", 3}, {metricRatePer, "spare", 60}, {metricRateLeft, "spare", 2}, {metricRateOpens, "spare", 0},
	} {
		if got := metricValue(t, fams, c.name, c.limit); got != c.want {
			t.Errorf("%s{limit=%q} = %v, want %v", c.name, c.limit, got, c.want)
		}
	}
	for _, c := range []struct{ name, limit string }{{metricAging, "plain"}, {metricAging, "mail"}, {metricRateN, "ci"}, {metricRateOpens, "plain"}} {
		if _, ok := series(fams, c.name, c.limit); ok {
			t.Errorf("%s{limit=%q}: a series where the limit has no such policy", c.name, c.limit)
		}
	}
	orders := map[string]string{}
	for _, m := range fams[metricPolicyInfo].GetMetric() {
		var limit, order string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "limit":
				limit = l.GetValue()
			case "order":
				order = l.GetValue()
			}
		}
		if m.GetGauge().GetValue() != 1 {
			t.Errorf("%s{limit=%q} = %v, want 1", metricPolicyInfo, limit, m.GetGauge().GetValue())
		}
		orders[limit] = order
	}
	if want := map[string]string{"plain": "fifo", "ci": "priority", "mail": "fair", "spare": "fifo"}; !reflect.DeepEqual(orders, want) {
		t.Errorf("orders %v, want %v", orders, want)
	}
	promtoolCheck(t, b.Bytes())

	// Without a policy anywhere, the rate and aging families are left out.
	b.Reset()
	if err := writeMetrics(&b, store.Snapshot{Now: now, Limits: []store.Limit{{Name: "plain", Slots: 1}}}, nil); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); strings.Contains(s, metricAging) || strings.Contains(s, "slotctl_limit_rate_") || !strings.Contains(s, metricPolicyInfo) {
		t.Errorf("metrics of a FIFO limit:\n%s", s)
	}
}

// TestEstimateRated: the estimate is no earlier than the rate lets the
// waiter's place in; a first waiter with room that only the rate keeps
// out gets the rate's time without hold times to go by.
func TestEstimateRated(t *testing.T) {
	m := time.Minute
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	holds := []time.Duration{m, m, m, m, m}
	rate := store.Policy{Rate: store.Rate{N: 1, Per: 10 * m}}
	l := store.Limit{Name: "r", Slots: 2, Held: 1, Policy: rate, Starts: []time.Time{now.Add(-4 * m)}, Opens: now.Add(6 * m)}
	snap := store.Snapshot{Now: now, Limits: []store.Limit{l}, Tickets: []store.Ticket{
		{ID: "h", Limit: "r", State: store.Held, Admitted: now.Add(-30 * time.Second)}, // frees in 30s
		{ID: "w1", Limit: "r", State: store.Waiting, Position: 1},
		{ID: "w2", Limit: "r", State: store.Waiting, Position: 2},
	}}
	for _, c := range []struct {
		name  string
		holds []time.Duration
		id    string
		want  time.Duration
		ok    bool
	}{
		{"first: the window opens in 6m, a free slot now", holds, "w1", 6 * m, true},
		{"second: a window later", holds, "w2", 16 * m, true},
		{"first, too few runs: the rate alone", nil, "w1", 6 * m, true},
		{"second, too few runs: no estimate", nil, "w2", 0, false},
	} {
		got, ok := estimateRated(c.holds, snap, l, snap.Tickets[map[string]int{"w1": 1, "w2": 2}[c.id]])
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %v %v, want %v %v", c.name, got, ok, c.want, c.ok)
		}
	}
	// Without a rate, the holds alone.
	plain := l
	plain.Policy, plain.Starts, plain.Opens = store.Policy{}, nil, time.Time{}
	if got, ok := estimateRated(holds, snap, plain, snap.Tickets[1]); !ok || got != 0 {
		t.Errorf("no rate, a free slot: %v %v, want 0 true", got, ok)
	}
}

// TestCompleteLimitSet: limit set completes NAME from the store, and after
// NAME SLOTS the policy flags not given yet; before NAME, their values.
func TestCompleteLimitSet(t *testing.T) {
	e := compStore(t)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"limit", "set", "ba"}, []string{"backup", "batch"}},
		{[]string{"limit", "set", "build", "2", "--"}, []string{"--aging", "--order", "--rate"}},
		{[]string{"limit", "set", "build", "2", "--rate", "1/1h", "--"}, []string{"--aging", "--order"}},
		{[]string{"limit", "set", "--order", ""}, []string{"fair", "fifo", "priority"}},
	} {
		got, dir, stderr := compRun(t, e.env, c.args...)
		slices.Sort(got)
		if !slices.Equal(got, c.want) || dir != ":4" {
			t.Errorf("%q: %q %s, want %q :4", c.args, got, dir, c.want)
		}
		compNoExtraStderr(t, stderr)
	}
}

// TestStatsPolicy: stats shows a POLICY column when a limit has a policy,
// and -o json each limit's policy and its rate's state.
func TestStatsPolicy(t *testing.T) {
	events, snap := statsFixture()
	for i := range snap.Limits {
		if snap.Limits[i].Name == "deploy" {
			snap.Limits[i].Policy = store.Policy{Order: store.ByPriority, Rate: store.Rate{N: 1, Per: time.Hour}}
			snap.Limits[i].Starts = []time.Time{statsNow.Add(-20 * time.Minute)}
			snap.Limits[i].Opens = statsNow.Add(40 * time.Minute)
		}
	}
	stats := computeStats(events, snap, statsNow.Add(-24*time.Hour), false)
	var b bytes.Buffer
	if err := drawStats(tableOut{w: &b}, stats); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.HasSuffix(lines[0], "  POLICY") {
		t.Errorf("header %q, want a POLICY column last", lines[0])
	}
	for _, want := range []string{"  priority aging 1m0s rate 1/1h0m0s (spent, opens in 40m00s)", "  fifo"} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("stats lacks %q:\n%s", want, b.String())
		}
	}
	j := statsJSONOf("/s.db", statsNow, 24*time.Hour, stats)
	for _, l := range j.Limits {
		switch l.Limit {
		case "deploy":
			p := l.Policy
			if p.Order != "priority" || p.AgingSeconds == nil || *p.AgingSeconds != 60 || p.Rate == nil ||
				*p.Rate != (rateJSON{N: 1, PerSeconds: 3600, Left: 0, OpensInSeconds: 2400}) {
				t.Errorf("deploy's policy: %+v (rate %+v)", p, p.Rate)
			}
		default:
			if l.Policy.Order != "fifo" || l.Policy.Rate != nil || l.Policy.AgingSeconds != nil {
				t.Errorf("%s's policy: %+v", l.Limit, l.Policy)
			}
		}
	}
}
