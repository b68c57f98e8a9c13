package cli

// A waiting run in CI end to end (progress.go, docs/ci.md): the real
// slotctl and a real store, the CI's variables set by the test.

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// holdUntilReleased is a job that notes its pid in NAME.pid, says it holds
// by creating NAME, and runs until the file release exists.
func holdUntilReleased(name string) []string {
	return []string{"sh", "-c", `echo $$ > ` + name + `.pid; touch ` + name + `; while [ ! -e release ]; do sleep 0.05; done`}
}

// startHolder starts a slotctl run holding limit with holdUntilReleased,
// waits until it holds and notes its job for cleanup.
func startHolder(ctx context.Context, t *testing.T, e *ptEnv, name string, env []string, args ...string) *ptProc {
	t.Helper()
	p := e.startWith(ctx, name, env, append(append([]string{"run"}, args...), append([]string{"--"}, holdUntilReleased(name)...)...)...)
	ptWaitFor(t, name+" holding", 60*time.Second, func() bool { return ptExists(e.path(name)) })
	e.notePid(int(ptWaitInt(t, e.path(name+".pid"), 30*time.Second)))
	return p
}

// seedHolds records n runs of limit (one slot) that each held it for
// held, an hour ago: the estimate's history.
func seedHolds(t *testing.T, path, limit string, n int, held time.Duration) {
	t.Helper()
	at := boltstore.Instant{Boot: proc.BootID(), Mono: proc.Boottime(), Wall: time.Now().Add(-time.Hour)}
	clock := boltstore.NewFakeClock(at)
	st, err := boltstore.New(path, boltstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for i := range n {
		tk, err := st.Enqueue(ctx, store.EnqueueRequest{ID: "seed" + strings.Repeat("0", 27) + string(rune('a'+i)), Limit: limit, Slots: 1,
			TTL: time.Hour, Holder: store.Holder{Host: "seed", Pid: 1, Argv: []string{"true"}}})
		if err != nil || tk.State != store.Held {
			t.Fatalf("seed %d: %v, %s", i, err, tk.State)
		}
		// The wall clock alone moves: the hold time is the wall clock's.
		at.Wall = at.Wall.Add(held)
		at.Mono += time.Millisecond
		clock.Set(at)
		if _, err := st.Release(ctx, tk, store.Released); err != nil {
			t.Fatalf("release seed %d: %v", i, err)
		}
	}
}

// progressLines are the progress lines in stderr.
func progressLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "slotctl: still waiting after ") {
			out = append(out, l)
		}
	}
	return out
}

// TestProgressLinesInCI: in CI, a waiting run prints a progress line
// every --progress-every naming its place, the estimate and the holder's
// CI URL, and runs once the holder is done.
func TestProgressLinesInCI(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	seedHolds(t, e.path("slots.db"), "p", 5, 10*time.Minute)
	holder := startHolder(ctx, t, e, "held", nil, "--limit", "p", "--url", "https://ci.example/o/r/actions/runs/1")
	waiter := e.startWith(ctx, "waiter", []string{"CI=true"}, "run", "--limit", "p", "--progress-every", "200ms", "--", "touch", "ran")
	ptWaitFor(t, "two progress lines", 90*time.Second, func() bool { return len(progressLines(waiter.stderr())) >= 2 })
	if err := os.WriteFile(e.path("release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := waiter.wait(t, 90*time.Second); code != 0 {
		t.Fatalf("waiter exited %d, want 0; stderr:\n%s", code, waiter.stderr())
	}
	if code := holder.wait(t, 60*time.Second); code != 0 {
		t.Errorf("holder exited %d; stderr:\n%s", code, holder.stderr())
	}
	if !ptExists(e.path("ran")) {
		t.Error("the waiter's command did not run")
	}
	stderr := waiter.stderr()
	if !strings.HasPrefix(stderr, `slotctl: waiting for limit "p" (1/1 held), 1st in queue, ~`) {
		t.Errorf("stderr does not begin with the waiting line:\n%s", stderr)
	}
	re := regexp.MustCompile(`^slotctl: still waiting after [0-9]+s for limit "p" \(1/1 held\), 1st in queue, ~[0-9]+m; held by https://ci\.example/o/r/actions/runs/1 \([0-9]+s\)$`)
	for _, l := range progressLines(stderr) {
		if !re.MatchString(l) {
			t.Errorf("progress line %q\nwant it to match %s", l, re)
		}
	}
	if strings.ContainsAny(stderr, "\x1b\r") {
		t.Errorf("stderr holds terminal control outside GitLab:\n%q", stderr)
	}
}

// TestProgressStepSummary: with GITHUB_STEP_SUMMARY, a wait that ends in
// an admission and one that ends at --wait each leave a Markdown section
// naming the holder by its URL, as a link; a summary that cannot be
// written is one warning, and the run still runs.
func TestProgressStepSummary(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	link := `[https\://ci.example/holder/1](https://ci.example/holder/1) (held for `

	// Admitted: the holder is told to end once the waiter waits.
	holder := startHolder(ctx, t, e, "held", nil, "--limit", "s", "--url", "https://ci.example/holder/1")
	sum := e.path("admitted.md")
	waiter := e.startWith(ctx, "waiter", []string{"GITHUB_ACTIONS=true", "GITHUB_STEP_SUMMARY=" + sum}, "run", "--limit", "s", "--", "touch", "ran")
	ptWaitFor(t, "the waiter waiting", 60*time.Second, func() bool { return strings.Contains(waiter.stderr(), "waiting for limit") })
	if err := os.WriteFile(e.path("release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := waiter.wait(t, 90*time.Second); code != 0 {
		t.Fatalf("waiter exited %d, want 0; stderr:\n%s", code, waiter.stderr())
	}
	holder.wait(t, 60*time.Second)
	got := readFile(t, sum)
	re := regexp.MustCompile("^### slotctl: limit `s`\n\nWaited [0-9]+s\\. Admitted\\.\n\nWhen it began waiting, held by:\n- " + regexp.QuoteMeta(link) +
		"[0-9]+s\\)\n\n_slotctl: the job held `s` for [0-9]+s and exited with status 0\\._\n\n$")
	if !re.MatchString(got) {
		t.Errorf("summary of an admitted wait:\n%s\nwant it to match %s", got, re)
	}
	if !ptExists(e.path("ran")) {
		t.Error("the waiter's command did not run")
	}
	if err := os.Remove(e.path("release")); err != nil {
		t.Fatal(err)
	}

	// Not admitted within --wait.
	holder = startHolder(ctx, t, e, "held2", nil, "--limit", "s", "--url", "https://ci.example/holder/1")
	sum = e.path("busy.md")
	busy := e.startWith(ctx, "busy", []string{"GITHUB_STEP_SUMMARY=" + sum}, "run", "--limit", "s", "--wait", "1s", "--", "touch", "ran-busy")
	if code := busy.wait(t, 90*time.Second); code != 75 {
		t.Errorf("busy run exited %d, want 75; stderr:\n%s", code, busy.stderr())
	}
	got = readFile(t, sum)
	re = regexp.MustCompile("^### slotctl: limit `s`\n\nWaited [0-9]+s\\. Not admitted within --wait 1s; the job did not run\\.\n\nWhen it began waiting, held by:\n- " +
		regexp.QuoteMeta(link) + "[0-9]+s\\)\n\n$")
	if !re.MatchString(got) {
		t.Errorf("summary of a wait that ran out:\n%s\nwant it to match %s", got, re)
	}
	if ptExists(e.path("ran-busy")) {
		t.Error("the busy run's command ran")
	}

	// A summary that cannot be written: one warning, and the job runs.
	sum = e.path("missing/summary.md")
	unwritable := e.startWith(ctx, "unwritable", []string{"GITHUB_STEP_SUMMARY=" + sum}, "run", "--limit", "s", "--", "touch", "ran-anyway")
	ptWaitFor(t, "the waiter waiting", 60*time.Second, func() bool { return strings.Contains(unwritable.stderr(), "waiting for limit") })
	if err := os.WriteFile(e.path("release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := unwritable.wait(t, 90*time.Second); code != 0 {
		t.Errorf("run with an unwritable summary exited %d, want 0; stderr:\n%s", code, unwritable.stderr())
	}
	holder.wait(t, 60*time.Second)
	stderr := unwritable.stderr()
	if n := strings.Count(stderr, "step summary not written"); n != 1 ||
		!regexp.MustCompile(`(?m)^slotctl: step summary not written \(GITHUB_STEP_SUMMARY\): open \S+/missing/summary\.md: no such file or directory$`).MatchString(stderr) {
		t.Errorf("want one warning about the summary, got %d; stderr:\n%s", n, stderr)
	}
	if !ptExists(e.path("ran-anyway")) {
		t.Error("the command of the run with an unwritable summary did not run")
	}
}

// gitlabMarker matches GitLab's section markers, as slotctl writes them.
var gitlabMarker = regexp.MustCompile("\x1b\\[0Ksection_(start|end):[0-9]+:slotctl_wait(\\[collapsed=true\\])?\r\x1b\\[0K")

// TestProgressGitLabSection: with GITLAB_CI=true the waiting lines (here
// every 200ms, from the config file) are one collapsed section: its start
// before the first, its end after the last; -q prints none of it.
func TestProgressGitLabSection(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(e.dir, "home", ".config", "slotctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("progress-every: 200ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gitlab := []string{"GITLAB_CI=true", "CI_JOB_URL=https://gitlab.example/g/p/-/jobs/2"}
	holder := startHolder(ctx, t, e, "held", gitlab, "--limit", "g")
	waiter := e.startWith(ctx, "waiter", gitlab, "run", "--limit", "g", "--", "sh", "-c", "echo job output >&2")
	ptWaitFor(t, "the waiter waiting", 60*time.Second, func() bool { return strings.Contains(waiter.stderr(), "waiting for limit") })
	quiet := e.startWith(ctx, "quiet", gitlab, "-q", "run", "--limit", "g", "--", "true") // behind the waiter
	ptWaitFor(t, "two progress lines", 90*time.Second, func() bool { return len(progressLines(waiter.stderr())) >= 2 })
	if err := os.WriteFile(e.path("release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*ptProc{waiter, quiet, holder} {
		if code := p.wait(t, 90*time.Second); code != 0 {
			t.Errorf("%s exited %d; stderr:\n%s", p.name, code, p.stderr())
		}
	}
	re := regexp.MustCompile("^\x1b\\[0Ksection_start:[0-9]+:slotctl_wait\\[collapsed=true\\]\r\x1b\\[0Kslotctl: waiting for limit \"g\"\n" +
		"slotctl: waiting for limit \"g\" \\(1/1 held\\), 1st in queue; held by sh -c .* \\(pid [0-9]+ on [^,]+, [0-9]+s, https://gitlab\\.example/g/p/-/jobs/2\\)\n" +
		"(slotctl: still waiting after [0-9]+s for limit \"g\" \\(1/1 held\\), 1st in queue; held by https://gitlab\\.example/g/p/-/jobs/2 \\([0-9]+s\\)\n){2,}" +
		"\x1b\\[0Ksection_end:[0-9]+:slotctl_wait\r\x1b\\[0K\n" +
		"job output\n$")
	if s := waiter.stderr(); !re.MatchString(s) {
		t.Errorf("stderr:\n%q\nwant it to match\n%q", s, re)
	}
	if s := quiet.stderr(); s != "" {
		t.Errorf("-q: stderr %q, want none", s)
	}
}

// TestProgressHostile: holders whose URL and command line (written as a
// member of the store's group can) try to be terminal control or
// Markdown reach the progress lines and the summary as escaped text; in
// GitLab the section still ends before the run's error.
func TestProgressHostile(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := "https://ci.example/x](javascript:alert(1))<img src=x onerror=alert(1)>"
	a := startHolder(ctx, t, e, "held", nil, "--limit", "h", "--slots", "2", "--url", url)
	evil := holdUntilReleased("held2")
	evil[2] = "# \x1b[2J\x1b]0;owned\a\n# ## forged](javascript:alert(1))\n" + evil[2] // first: the lines cut a long command
	b := e.startWith(ctx, "held2", []string{"SLOTCTLTEST_HOST=ci-7\x1b[1A\x1b[2Kforged"}, append([]string{"run", "--limit", "h", "--slots", "2", "--"}, evil...)...)
	ptWaitFor(t, "held2 holding", 60*time.Second, func() bool { return ptExists(e.path("held2")) })
	e.notePid(int(ptWaitInt(t, e.path("held2.pid"), 30*time.Second)))

	sum := e.path("summary.md")
	w := e.startWith(ctx, "waiter", []string{"GITLAB_CI=true", "GITHUB_STEP_SUMMARY=" + sum},
		"run", "--limit", "h", "--slots", "2", "--wait", "2s", "--progress-every", "200ms", "--", "touch", "ran")
	if code := w.wait(t, 90*time.Second); code != 75 {
		t.Errorf("waiter exited %d, want 75; stderr:\n%s", code, w.stderr())
	}
	if err := os.WriteFile(e.path("release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a.wait(t, 60*time.Second)
	b.wait(t, 60*time.Second)

	stderr := w.stderr()
	if n := len(gitlabMarker.FindAllString(stderr, -1)); n != 2 {
		t.Errorf("%d GitLab markers, want 2 (a start and an end):\n%q", n, stderr)
	}
	plain := gitlabMarker.ReplaceAllString(stderr, "")
	assertPrintable(t, "waiter's stderr", plain, false)
	lines := strings.Split(strings.TrimSuffix(plain, "\n"), "\n")
	for _, l := range lines {
		if l != "" && !strings.HasPrefix(l, "slotctl: ") {
			t.Errorf("a line slotctl did not begin: %q", l)
		}
	}
	if len(progressLines(plain)) == 0 {
		t.Errorf("no progress line:\n%s", plain)
	}
	for _, l := range progressLines(plain) {
		if !strings.Contains(l, url+" (") || !strings.Contains(l, `\x1b[2J\x1b]0;owned\a\n# ## forged](javascript:alert(1))\n`) ||
			!strings.Contains(l, `on "ci-7\x1b[1A\x1b[2Kforged"`) {
			t.Errorf("progress line without the holders, escaped: %q", l)
		}
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, `slotctl: limit "h": not admitted within --wait`) ||
		!strings.HasSuffix(strings.TrimSuffix(stderr, last+"\n"), "\x1b[0K\n") {
		t.Errorf("the section does not end just before the error line:\n%q", stderr)
	}

	got := readFile(t, sum)
	for _, bad := range []string{"\x1b", "\a", "](javascript", "\n# ", "\n## "} {
		if strings.Contains(got, bad) {
			t.Errorf("summary holds %q raw:\n%s", bad, got)
		}
	}
	if m := regexp.MustCompile(`(^|[^\\])<`).FindString(got); m != "" {
		t.Errorf("summary holds an unescaped <:\n%s", got)
	}
	for _, want := range []string{
		"- [https\\://ci.example/x\\]\\(javascript\\:alert\\(1\\)\\)\\<img src=x onerror=alert\\(1\\)\\>](https://ci.example/x%5D%28javascript:alert%281%29%29%3Cimg%20src=x%20onerror=alert%281%29%3E) (held for ",
		`\\x1b\[2J\\x1b\]0;owned\\a\\n\#`,
		`on "ci\-7\\x1b\[1A\\x1b\[2Kforged"`,
		"Not admitted within --wait 2s; the job did not run.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary:\n%s\nwant it to contain %s", got, want)
		}
	}
	if ptExists(e.path("ran")) {
		t.Error("the waiter's command ran")
	}
}
