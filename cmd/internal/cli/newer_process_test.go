package cli

// Process tests of newer runs first (docs/leases.md §2.1 items 10 and 11):
// real slotctl processes on a real store, children that record what they
// saw in files, timings from those files and from the store's own log.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
)

// ptEvents is the store's log of limit, oldest first.
func ptEvents(t *testing.T, e *ptEnv, limit string) []eventJSON {
	t.Helper()
	out, err := e.output("log", "-n", "1000", "-o", "json", limit)
	if err != nil {
		t.Fatalf("slotctl log %s: %v\n%s", limit, err, out)
	}
	var evs []eventJSON
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var ev eventJSON
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestSupersedeOnePendingNewestWins emulates a CI's concurrency group of one
// branch ("one running, one pending, the newest pending wins"): five runs of
// --key main --supersede --max-waiting 1, each started once the one before
// it has its ticket (or is gone, superseded by it). The first
// is admitted and holds the slot until the test lets it go; each of the
// next three is superseded by the one after it as soon as that one is
// written (exit 75, saying which ticket took its place; its command never
// ran); the last runs once the first has ended. Exactly the first and the
// last commands run.
func TestSupersedeOnePendingNewestWins(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const n = 5
	// Each child writes its start time and ticket; the first then waits
	// for the file "release" and writes its end time.
	script := `date +%s%N > "start.$1"; echo "$SLOTCTL_TICKET" > "ticket.$1"; ` +
		`if [ "$1" = 0 ]; then while [ ! -e release ]; do sleep 0.01; done; date +%s%N > end.0; fi`
	procs := make([]*ptProc, n)
	for i := range n {
		procs[i] = e.start(ctx, fmt.Sprintf("run%d", i), "run", "--limit", "ci", "--key", "main", "--supersede", "--max-waiting", "1",
			"--url", fmt.Sprintf("https://ci.example/runs/%d", i), "--", "sh", "-c", script, "sh", strconv.Itoa(i))
		if i == 0 {
			ptWaitFor(t, "the first run's child", 10*time.Second, func() bool { return ptExists(e.path("ticket.0")) })
			continue
		}
		ptWaitTicket(t, e, procs[i], 20*time.Second)
		if i == 1 {
			continue
		}
		// The one it superseded hears it by its bell: well before its
		// poll (the default --ttl's renewal, 10 s) would tell it.
		if code := procs[i-1].wait(t, 5*time.Second); code != exitBusy {
			t.Errorf("run %d exited %d, want %d (superseded); stderr:\n%s", i-1, code, exitBusy, procs[i-1].stderr())
		}
	}
	select {
	case <-procs[n-1].done:
		t.Fatalf("the last run ended while the first still held the slot; stderr:\n%s", procs[n-1].stderr())
	default:
	}
	if err := os.WriteFile(e.path("release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, n - 1} {
		if code := procs[i].wait(t, 20*time.Second); code != 0 {
			t.Fatalf("run %d exited %d, want 0; stderr:\n%s", i, code, procs[i].stderr())
		}
	}
	for i := range n {
		ran := ptExists(e.path(fmt.Sprintf("start.%d", i)))
		if want := i == 0 || i == n-1; ran != want {
			t.Errorf("run %d's command ran: %v, want %v", i, ran, want)
		}
	}
	if end, last := ptReadInt(t, e.path("end.0")), ptReadInt(t, e.path(fmt.Sprintf("start.%d", n-1))); last <= end {
		t.Errorf("the last run started at %d, before the first ended at %d", last, end)
	}

	// Which ticket each run had: from the store's log (a superseded run's
	// command never saw one), by the slotctl pid each event names.
	tickets := map[int]string{}
	for _, ev := range ptEvents(t, e, "ci") {
		if ev.Kind == "superseded" || ev.Kind == "admitted" {
			tickets[ev.Pid] = ev.Ticket
		}
	}
	ticketOf := func(i int) string { return tickets[procs[i].cmd.Process.Pid] }
	if got, want := ticketOf(n-1), strings.TrimSpace(readFile(t, e.path(fmt.Sprintf("ticket.%d", n-1)))); got != want {
		t.Fatalf("the log gives the last run ticket %q, its child saw %q", got, want)
	}
	for i := 1; i < n-1; i++ {
		by := ticketOf(i + 1)
		if by == "" {
			t.Fatalf("no ticket of run %d in the log", i+1)
		}
		want := fmt.Sprintf("slotctl: superseded by ticket %s (host ", by)
		se := procs[i].stderr()
		line := se[strings.LastIndex(strings.TrimSuffix(se, "\n"), "\n")+1:]
		if !strings.HasPrefix(line, want) || !strings.HasSuffix(line, fmt.Sprintf(", https://ci.example/runs/%d): sh did not run\n", i+1)) {
			t.Errorf("run %d's last line is %q, want %q...(its pid and URL): sh did not run", i, line, want)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// replaceOnce runs one --replace round in limit: a held job whose child
// traps SIGTERM (recording when it got it, then exiting 200 ms later), and
// a new run of its key with --replace. The child must get SIGTERM within 5 s
// of the new run's start (its bell; its next renewal would be 10 s away),
// its slotctl must exit 143 naming the new
// run after the child exited, and the new run's child must start after the
// old one exited. It returns the stop latency: from the store's "replaced"
// event (the request committed) to the old child's SIGTERM, and from the
// new slotctl's start.
func replaceOnce(t *testing.T, e *ptEnv, ctx context.Context, limit string) (fromEvent, fromStart time.Duration) {
	t.Helper()
	f := func(name string) string { return e.path(limit + "." + name) }
	old := e.start(ctx, limit+"-old", "run", "--limit", limit, "--key", "prod", "--kill-after", "5s", "--",
		"sh", "-c", `trap 'date +%s%N > "$1.term"; sleep 0.2; date +%s%N > "$1.exit"; exit 0' TERM; date +%s%N > "$1.started"; while :; do sleep 0.01; done`,
		"sh", limit)
	ptWaitInt(t, f("started"), 10*time.Second)
	nu := e.start(ctx, limit+"-new", "run", "--limit", limit, "--key", "prod", "--replace", "--", "sh", "-c", `date +%s%N > "$1.new"`, "sh", limit)
	// The stop request reaches the holder by its bell, well before its next
	// renewal (10 s at the default --ttl) would carry it.
	term := time.Unix(0, ptWaitInt(t, f("term"), 5*time.Second))
	if code := old.wait(t, 10*time.Second); code != 143 {
		t.Fatalf("%s: the replaced run exited %d, want 143; stderr:\n%s", limit, code, old.stderr())
	}
	if code := nu.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("%s: the --replace run exited %d, want 0; stderr:\n%s", limit, code, nu.stderr())
	}
	exited := time.Unix(0, ptReadInt(t, f("exit")))
	if !old.exitedAt.After(exited) {
		t.Errorf("%s: the replaced slotctl exited at %s, before its child at %s", limit, old.exitedAt.Format(time.StampMicro), exited.Format(time.StampMicro))
	}
	if started := time.Unix(0, ptReadInt(t, f("new"))); !started.After(exited) {
		t.Errorf("%s: the new job started at %s, before the replaced one exited at %s", limit, started.Format(time.StampMicro), exited.Format(time.StampMicro))
	}
	var replacedAt time.Time
	var by string
	for _, ev := range ptEvents(t, e, limit) {
		if ev.Kind == "replaced" {
			replacedAt, _ = time.Parse(time.RFC3339Nano, ev.Time)
			by = ev.By
		}
	}
	if replacedAt.IsZero() || by == "" {
		t.Fatalf("%s: no replaced event naming the new ticket in the log", limit)
	}
	// slotctl's own lines (the child's shell may report its killed sleep).
	var own []string
	for _, l := range strings.Split(strings.TrimSpace(old.stderr()), "\n") {
		if strings.HasPrefix(l, "slotctl:") {
			own = append(own, l)
		}
	}
	if len(own) != 1 || !strings.HasPrefix(own[0], "slotctl: replaced by ticket "+by+" (host ") {
		t.Errorf("%s: the replaced run said %q, want one line: slotctl: replaced by ticket %s (host ...)", limit, own, by)
	}
	return term.Sub(replacedAt), term.Sub(nu.started)
}

// replaceRounds runs n rounds of replaceOnce and reports the medians.
func replaceRounds(t *testing.T, e *ptEnv, n int, store string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(n)*15*time.Second)
	defer cancel()
	var fromEvent, fromStart []time.Duration
	for i := range n {
		a, b := replaceOnce(t, e, ctx, fmt.Sprintf("deploy%d", i))
		if t.Failed() {
			return
		}
		fromEvent, fromStart = append(fromEvent, a), append(fromStart, b)
	}
	slices.Sort(fromEvent)
	slices.Sort(fromStart)
	t.Logf("%s: --replace stop latency, median of %d: %s from the replaced event (request committed) to the old child's SIGTERM (min %s, max %s); %s from the new slotctl's start (max %s)",
		store, n, ptMS(fromEvent[n/2]), ptMS(fromEvent[0]), ptMS(fromEvent[n-1]), ptMS(fromStart[n/2]), ptMS(fromStart[n-1]))
}

// TestReplaceStopsHolder: --replace on the same host (bbolt): the held
// job's child gets SIGTERM by its bell, its slotctl exits 143 after the
// child, the new job starts after that; 3 rounds (20 with SLOTCTL_LONG=1),
// the median stop latency logged (a figure, not a bound).
func TestReplaceStopsHolder(t *testing.T) {
	replaceRounds(t, newPTEnv(t), longtest.Pick(3, 20), "bbolt")
}

// TestEtcdReplaceStopsHolder is TestReplaceStopsHolder on etcd (the holder
// hears the stop request through the watch of its own key).
func TestEtcdReplaceStopsHolder(t *testing.T) {
	e, _ := etcdPTEnv(t)
	replaceRounds(t, e, longtest.Pick(3, 20), "etcd")
}
