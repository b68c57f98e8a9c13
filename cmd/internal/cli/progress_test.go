package cli

// A waiting run in CI (progress.go): --progress-every's parsing and
// default, the progress line, the step summary's Markdown, and stored
// text that tries to be markup or terminal control.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// TestProgressInCI: which environments count as CI.
func TestProgressInCI(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"CI": "true"}, true},
		{map[string]string{"CI": "1"}, true},
		{map[string]string{"CI": "false", "GITHUB_ACTIONS": "true"}, false},
		{map[string]string{"CI": "0", "GITLAB_CI": "true"}, false},
		{map[string]string{"GITHUB_ACTIONS": "true"}, true},
		{map[string]string{"GITHUB_ACTIONS": "false"}, false},
		{map[string]string{"GITLAB_CI": "true"}, true},
		{map[string]string{"BUILDKITE": "true"}, true},
		{map[string]string{"JENKINS_URL": "https://jenkins.example/"}, true},
		{map[string]string{"TF_BUILD": "True"}, true},
		{map[string]string{"BUILD_URL": "https://jenkins.example/job/1"}, false}, // a URL alone is not CI
	}
	for _, c := range cases {
		if got := inCI(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("inCI(%v) = %v, want %v", c.env, got, c.want)
		}
	}
}

// TestProgressFlag: --progress-every's default (30s in CI, off elsewhere),
// 0 and a given period; a bad one is one line naming it, exit 64.
func TestProgressFlag(t *testing.T) {
	cases := []struct {
		args string
		env  map[string]string
		want time.Duration
	}{
		{"run -l b -- true", nil, 0},
		{"run -l b -- true", map[string]string{"CI": "true"}, defaultProgressEvery},
		{"run -l b -- true", map[string]string{"GITLAB_CI": "true"}, defaultProgressEvery},
		{"run -l b --progress-every 0 -- true", map[string]string{"CI": "true"}, 0},
		{"run -l b --progress-every 100ms -- true", nil, 100 * time.Millisecond},
		{"run -l b --progress-every 2m -- true", map[string]string{"CI": "true"}, 2 * time.Minute},
	}
	for _, c := range cases {
		f, _, errOut := flagsFactory(t)
		getenv := f.Getenv
		f.Getenv = func(k string) string {
			if v, ok := c.env[k]; ok {
				return v
			}
			return getenv(k)
		}
		var got any
		if code := mainWith(context.Background(), strings.Fields(c.args), f, stubRunFs(&got)); code != 0 {
			t.Fatalf("%s: exit %d: %s", c.args, code, errOut)
		}
		if o := got.(*RunOptions); o.ProgressEvery != c.want {
			t.Errorf("%s with %v: ProgressEvery %s, want %s", c.args, c.env, o.ProgressEvery, c.want)
		}
	}
	want := `want 0 (no progress lines) or a duration of at least 100ms, such as 30s or 5m`
	for _, bad := range []string{"soon", "-1s", "50ms", "1"} {
		f, _, errOut := flagsFactory(t)
		var got any
		code := mainWith(context.Background(), []string{"run", "-l", "b", "--progress-every", bad, "--", "true"}, f, stubRunFs(&got))
		if line := "slotctl: --progress-every \"" + bad + "\": " + want + "\n"; code != exitUsage || errOut.String() != line || got != nil {
			t.Errorf("--progress-every %s: exit %d, stderr %q; want %d and %q", bad, code, errOut, exitUsage, line)
		}
	}
}

// TestProgressConfig: the config file's progress-every is the flag's
// default; a bad one names the file.
func TestProgressConfig(t *testing.T) {
	f, _, errOut := flagsFactory(t)
	dir := filepath.Join(f.Getenv("XDG_CONFIG_HOME"), "slotctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("progress-every: 10s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var got any
	if code := mainWith(context.Background(), []string{"run", "-l", "b", "--", "true"}, f, stubRunFs(&got)); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if o := got.(*RunOptions); o.ProgressEvery != 10*time.Second {
		t.Errorf("ProgressEvery %s, want the config's 10s", o.ProgressEvery)
	}
	got = nil
	if code := mainWith(context.Background(), []string{"run", "-l", "b", "--progress-every", "0", "--", "true"}, f, stubRunFs(&got)); code != 0 || got.(*RunOptions).ProgressEvery != 0 {
		t.Errorf("--progress-every 0 over the config's: exit %d, %#v", code, got)
	}
	if err := os.WriteFile(cfg, []byte("progress-every: often\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	got = nil
	code := mainWith(context.Background(), []string{"run", "-l", "b", "--", "true"}, f, stubRunFs(&got))
	want := "slotctl: config file " + cfg + `: progress-every "often": want 0 (no progress lines) or a duration of at least 100ms, such as 30s or 5m` + "\n"
	if code != exitUsage || errOut.String() != want || got != nil {
		t.Errorf("bad config: exit %d, stderr %q; want %d and %q", code, errOut, exitUsage, want)
	}
}

// progressStore is a store with limits build (2 slots) and db (1) where
// a CI run with a URL and a command with hostile text hold build, a run
// holds db, and a run waits for build before the waiter returned, which
// waits for both.
func progressStore(t *testing.T) (store.Store, store.Ticket) {
	t.Helper()
	st, err := boltstore.New(filepath.Join(t.TempDir(), "slots.db"), boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for name, n := range map[string]int{"build": 2, "db": 1} {
		if _, err := st.SetLimit(ctx, name, n); err != nil {
			t.Fatal(err)
		}
	}
	enq := func(id string, limits []string, h store.Holder) store.Ticket {
		t.Helper()
		tk, err := st.Enqueue(ctx, store.EnqueueRequest{ID: id, Limits: limits, TTL: time.Hour, Holder: h})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	enq("a0000000000000000000000000000001", []string{"build"}, store.Holder{Host: "ci-1", Pid: 11, Argv: []string{"make"},
		URL: "https://ci.example/o/r/actions/runs/1](javascript:alert(1))<img src=x onerror=alert(1)>"})
	enq("a0000000000000000000000000000002", []string{"build"}, store.Holder{Host: "h\x1b[2J", Pid: 12,
		Argv: []string{"sh", "-c", "\x1b[2J\n## forged\n](javascript:alert(1)) " + strings.Repeat("x", 4000)}})
	enq("a0000000000000000000000000000003", []string{"db"}, store.Holder{Host: "h3", Pid: 13, Argv: []string{"migrate"}, URL: "https://ci.example/3"})
	enq("a0000000000000000000000000000004", []string{"build"}, store.Holder{Host: "h4", Pid: 14, Argv: []string{"test"}, URL: "https://ci.example/4"})
	w := enq("a0000000000000000000000000000005", []string{"build", "db"}, store.Holder{Host: "h5", Pid: 15, Argv: []string{"it"}})
	if w.State != store.Waiting {
		t.Fatalf("the waiter is %s, want waiting", w.State)
	}
	return st, w
}

// TestProgressLine: a progress line says how long it waited, its place in
// each limit that keeps it out, and the holders briefly (the URL of a CI
// run, else command, pid and host), escaped and cut short, on one line.
func TestProgressLine(t *testing.T) {
	st, w := progressStore(t)
	f, _, errOut := flagsFactory(t)
	s := newStatusLine(f, &logger{w: errOut}, st, []string{"build", "db"})
	got := s.progressLine(context.Background(), w, 90*time.Second)
	if want := `still waiting after 1m30s for limits "build", "db": "build" (2/2 held), 2nd in queue; "db" (1/1 held), 1st in queue; held by `; !strings.HasPrefix(got, want) {
		t.Errorf("line %q\nwant it to begin %q", got, want)
	}
	got = normalDurations(got)
	for _, want := range []string{
		"held by https://ci.example/o/r/actions/runs/1](javascript:alert(1))<img src=x onerror=alert(1)> (Ns), ",
		`"sh -c '\x1b[2J\n## forged\n](javascript:alert(1)) xxx`,
		`x… (pid 12 on "h\x1b[2J", Ns), https://ci.example/3 (Ns)`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("line %q\nwant it to contain %q", got, want)
		}
	}
	assertPrintable(t, "progress line", got, false)
	if n := len([]rune(got)); n > 600 {
		t.Errorf("line of %d characters: a holder's long command is not cut", n)
	}
}

// TestProgressBriefHolders: at most three holders, then how many more.
func TestProgressBriefHolders(t *testing.T) {
	snap := store.Snapshot{Now: time.Unix(1000, 0)}
	for i := range 5 {
		snap.Tickets = append(snap.Tickets, store.Ticket{ID: string(rune('a' + i)), Limit: "b", State: store.Held,
			Admitted: time.Unix(1000-int64(i)*60, 0), Holder: store.Holder{Host: "h", Pid: i, Argv: []string{"make"}}})
	}
	snap.Tickets = append(snap.Tickets, store.Ticket{ID: "w", Limit: "b", State: store.Waiting, Position: 1})
	got := briefHolders(snap, func(string) bool { return true })
	want := "make (pid 0 on h, 0s), make (pid 1 on h, 1m0s), make (pid 2 on h, 2m0s), 2 more"
	if got != want {
		t.Errorf("briefHolders:\n got %q\nwant %q", got, want)
	}
}

// TestProgressMarkdown: stored text is literal in the summary, and only an
// http(s) URL becomes a link, whose target cannot end the link.
func TestProgressMarkdown(t *testing.T) {
	cases := []struct{ in, text, link string }{
		{"https://ci.example/o/r/actions/runs/7", `https\://ci.example/o/r/actions/runs/7`, "https://ci.example/o/r/actions/runs/7"},
		{"https://ci.example/x](javascript:alert(1))", `https\://ci.example/x\]\(javascript\:alert\(1\)\)`, "https://ci.example/x%5D%28javascript:alert%281%29%29"},
		{"https://ci.example/<script>a b", `https\://ci.example/\<script\>a b`, "https://ci.example/%3Cscript%3Ea%20b"},
		{"javascript:alert(1)", `javascript\:alert\(1\)`, ""},
		{"JavaScript://ci.example/%0aalert(1)", `JavaScript\://ci.example/%0aalert\(1\)`, ""},
		{"https://ci.example/\x1b[2J\nx", `"https\://ci.example/\\x1b\[2J\\nx"`, ""},
		{"data:text/html,<b>", `data\:text/html,\<b\>`, ""},
	}
	for _, c := range cases {
		got := mdLink(c.in)
		want := c.text
		if c.link != "" {
			want = "[" + c.text + "](" + c.link + ")"
		}
		if got != want {
			t.Errorf("mdLink(%q):\n got %s\nwant %s", c.in, got, want)
		}
	}
	if got, want := mdText("# a *b* _c_ `d` <e> &amp; [f](g) | @h ~i~"), `\# a \*b\* \_c\_ \`+"`"+`d\`+"`"+` \<e\> \&amp; \[f\]\(g\) \| \@h \~i\~`; got != want {
		t.Errorf("mdText:\n got %s\nwant %s", got, want)
	}
}

// TestProgressSummary: the step summary's section for a wait: outcome,
// holders and runs ahead with their URLs as links, hostile text literal;
// a run not admitted without waiting names the holders; a job that ran
// after waiting adds its time and status.
func TestProgressSummary(t *testing.T) {
	st, w := progressStore(t)
	f, _, errOut := flagsFactory(t)
	path := filepath.Join(t.TempDir(), "summary.md")
	f.Getenv = func(k string) string {
		if k == "GITHUB_STEP_SUMMARY" {
			return path
		}
		return ""
	}
	o := &RunOptions{Wait: time.Minute}
	ctx := context.Background()
	sum := newWaitSummary(ctx, f, &logger{w: errOut}, st, o, []string{"build", "db"})
	var notes []holder.NoteKind
	notify := sum.notify(func(n holder.Note) { notes = append(notes, n.Kind) })
	notify(holder.Note{Kind: holder.WaitStart, Ticket: w})
	notify(holder.Note{Kind: holder.WaitEnd})
	sum.finish(holder.Outcome{Result: holder.Busy}, errors.New("not admitted"))
	got := normalDurations(readFile(t, path))
	want := "### slotctl: limits `build`, `db`\n\n" +
		"Waited 0s. Not admitted within --wait 1m0s; the job did not run.\n\n" +
		"When it began waiting, held by:\n" +
		"- [https\\://ci.example/o/r/actions/runs/1\\]\\(javascript\\:alert\\(1\\)\\)\\<img src=x onerror=alert\\(1\\)\\>](https://ci.example/o/r/actions/runs/1%5D%28javascript:alert%281%29%29%3Cimg%20src=x%20onerror=alert%281%29%3E) (in `build`, held for 0s)\n" +
		"- \"sh \\-c '\\\\x1b\\[2J\\\\n\\#\\# forged\\\\n\\]\\(javascript\\:alert\\(1\\)\\) " + strings.Repeat("x", 28) + "… \\(pid 12 on \"h\\\\x1b\\[2J\"\\) (in `build`, held for 0s)\n" +
		"- [https\\://ci.example/3](https://ci.example/3) (in `db`, held for 0s)\n\n" +
		"Ahead of it in the queue:\n" +
		"- [https\\://ci.example/4](https://ci.example/4) (in `build`)\n\n"
	if want = normalDurations(want); got != want {
		t.Errorf("summary:\n%s\nwant:\n%s", got, want)
	}
	if len(notes) != 2 {
		t.Errorf("notes handed on: %v, want both", notes)
	}
	for _, bad := range []string{"\x1b", "](javascript", "\n## forged"} {
		if strings.Contains(got, bad) {
			t.Errorf("summary holds %q raw", bad)
		}
	}
	if m := regexp.MustCompile("(^|[^\\\\])[<&]").FindString(got); m != "" {
		t.Errorf("summary holds an unescaped %q", m)
	}

	// Admitted after a wait: the section at admission, the job's line at the end.
	os.Remove(path)
	sum = newWaitSummary(ctx, f, &logger{w: errOut}, st, o, []string{"build", "db"})
	notify = sum.notify(func(holder.Note) {})
	notify(holder.Note{Kind: holder.WaitStart, Ticket: w})
	notify(holder.Note{Kind: holder.WaitEnd})
	notify(holder.Note{Kind: holder.Admitted, Ticket: w})
	if got := normalDurations(readFile(t, path)); !strings.HasPrefix(got, "### slotctl: limits `build`, `db`\n\nWaited Ns. Admitted.\n\nWhen it began waiting, held by:\n") {
		t.Errorf("summary at admission:\n%s", got)
	}
	sum.finish(holder.Outcome{Result: holder.Ran}, &ExitError{Code: 3})
	if got := normalDurations(readFile(t, path)); !strings.HasSuffix(got, "\n\n_slotctl: the job held `build`, `db` for Ns and exited with status 3._\n\n") {
		t.Errorf("summary after the job:\n%s", got)
	}

	// Admitted at once: nothing.
	os.Remove(path)
	sum = newWaitSummary(ctx, f, &logger{w: errOut}, st, o, []string{"build"})
	sum.notify(func(holder.Note) {})(holder.Note{Kind: holder.Admitted, Ticket: w})
	sum.finish(holder.Outcome{Result: holder.Ran}, nil)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a run admitted at once wrote a summary: %v", err)
	}

	// Not admitted without waiting (--no-wait): the holders at the time.
	sum = newWaitSummary(ctx, f, &logger{w: errOut}, st, &RunOptions{Wait: 0}, []string{"db"})
	sum.finish(holder.Outcome{Result: holder.Busy}, errors.New("busy"))
	want = "### slotctl: limit `db`\n\nNot admitted: no slot was free and it did not wait; the job did not run.\n\n" +
		"Held by:\n- [https\\://ci.example/3](https://ci.example/3) (held for 0s)\n\n"
	if got := normalDurations(readFile(t, path)); got != normalDurations(want) {
		t.Errorf("--no-wait summary:\n%s\nwant:\n%s", got, want)
	}

	// Superseded and signalled.
	for _, c := range []struct {
		out  holder.Outcome
		want string
	}{
		{holder.Outcome{Result: holder.Superseded, By: store.Successor{Ticket: "b0000000", URL: "https://ci.example/9"}},
			"Superseded by a newer run of its key, [https\\://ci.example/9](https://ci.example/9); the job did not run."},
		{holder.Outcome{Result: holder.Signalled, Signal: syscall.SIGTERM}, "Stopped by a signal (terminated) while waiting; the job did not run."},
	} {
		os.Remove(path)
		sum = newWaitSummary(ctx, f, &logger{w: errOut}, st, o, []string{"db"})
		notify = sum.notify(func(holder.Note) {})
		notify(holder.Note{Kind: holder.WaitStart, Ticket: w})
		notify(holder.Note{Kind: holder.WaitEnd})
		sum.finish(c.out, errors.New("x"))
		if got := normalDurations(readFile(t, path)); !strings.Contains(got, "Waited Ns. "+c.want+"\n") {
			t.Errorf("summary:\n%s\nwant the outcome %q", got, c.want)
		}
	}
	if errOut.Len() != 0 {
		t.Errorf("warnings: %s", errOut)
	}
}

// TestProgressSummaryUnwritable: a summary file that cannot be written is
// one warning line, however often the run tries.
func TestProgressSummaryUnwritable(t *testing.T) {
	st, w := progressStore(t)
	f, _, errOut := flagsFactory(t)
	path := filepath.Join(t.TempDir(), "missing", "summary.md")
	f.Getenv = func(k string) string {
		if k == "GITHUB_STEP_SUMMARY" {
			return path
		}
		return ""
	}
	sum := newWaitSummary(context.Background(), f, &logger{w: errOut, quiet: true}, st, &RunOptions{Wait: -1}, []string{"build"})
	notify := sum.notify(func(holder.Note) {})
	notify(holder.Note{Kind: holder.WaitStart, Ticket: w})
	notify(holder.Note{Kind: holder.WaitEnd})
	notify(holder.Note{Kind: holder.Admitted, Ticket: w})
	sum.finish(holder.Outcome{Result: holder.Ran}, nil)
	if !regexp.MustCompile(`^slotctl: step summary not written \(GITHUB_STEP_SUMMARY\): open /\S+/missing/summary\.md: no such file or directory\n$`).MatchString(errOut.String()) {
		t.Errorf("stderr, want one warning line:\n%s", errOut)
	}
}

// normalDurations replaces the durations in s by N: how long a test's
// holders have held depends on the machine's load.
func normalDurations(s string) string {
	return regexp.MustCompile(`\b[0-9]+(h[0-9]+)?(m[0-9]+)?s\b`).ReplaceAllString(s, "Ns")
}
