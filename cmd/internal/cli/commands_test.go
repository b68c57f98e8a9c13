package cli

// Tests of the commands' flag parsing alone: each command fills its Options
// and hands them to a stub run function (cli/cli's NewCmdX(f, runF)), so
// nothing here opens a store. Bad input is exactly one line (docs/leases.md §7).

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// flagsFactory is a factory with buffers for streams and a private
// environment (no config file, a store path that is never opened).
func flagsFactory(t *testing.T) (*Factory, *bytes.Buffer, *bytes.Buffer) {
	dir := t.TempDir()
	env := map[string]string{
		"HOME":            filepath.Join(dir, "home"),
		"XDG_CONFIG_HOME": filepath.Join(dir, "home", ".config"),
		"XDG_STATE_HOME":  filepath.Join(dir, "home", ".local", "state"),
		"SLOTCTL_STORE":   filepath.Join(dir, "never-opened.db"),
	}
	var out, errOut bytes.Buffer
	f := &Factory{
		Version: "v0.0.0-test", Commit: "testcommit", Date: "2026-01-01T00:00:00Z",
		IO:     &IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
		Getenv: func(k string) string { return env[k] },
		Now:    time.Now,
	}
	return f, &out, &errOut
}

// stubRunFs records the options every command hands to its run function.
func stubRunFs(got *any) runFs {
	rec := func(o any) error { *got = o; return nil }
	return runFs{
		run:     func(o *RunOptions) error { return rec(o) },
		acquire: func(o *AcquireOptions) error { return rec(o) },
		ls:      func(o *LsOptions) error { return rec(o) },
		limit: limitRunFs{
			set: func(o *LimitSetOptions) error { return rec(o) },
			ls:  func(o *LimitLsOptions) error { return rec(o) },
			rm:  func(o *LimitRmOptions) error { return rec(o) },
		},
		reap:       func(o *ReapOptions) error { return rec(o) },
		release:    func(o *ReleaseOptions) error { return rec(o) },
		log:        func(o *LogOptions) error { return rec(o) },
		version:    func(o *VersionOptions) error { return rec(o) },
		completion: func(o *CompletionOptions) error { return rec(o) },
	}
}

func TestCommandOptions(t *testing.T) {
	cases := []struct {
		args string
		want any
	}{
		{"ls", &LsOptions{Output: "table", Limits: []string{}}},
		{"ls -o wide build deploy", &LsOptions{Output: "wide", Limits: []string{"build", "deploy"}}},
		{"ls --watch", &LsOptions{Output: "table", Watch: time.Second, Limits: []string{}}},
		{"ls --watch=2s -o json build", &LsOptions{Output: "json", Watch: 2 * time.Second, Limits: []string{"build"}}},
		{"reap", &ReapOptions{Output: "table", Limits: []string{}}},
		{"reap --dry-run -o json a b", &ReapOptions{DryRun: true, Output: "json", Limits: []string{"a", "b"}}},
		{"limit set build 3", &LimitSetOptions{Name: "build", Slots: 3}},
		{"limit set deploy 0", &LimitSetOptions{Name: "deploy", Slots: 0}},
		{"limit ls", &LimitLsOptions{Output: "table", Limits: []string{}}},
		{"limit ls -o json x", &LimitLsOptions{Output: "json", Limits: []string{"x"}}},
		{"limit rm old", &LimitRmOptions{Name: "old"}},
		{"limit rm --force old", &LimitRmOptions{Name: "old", Force: true}},
		{"release 3f2a", &ReleaseOptions{Tickets: []string{"3f2a"}}},
		{"release -y --force 3f2a 77b0", &ReleaseOptions{Yes: true, Force: true, Tickets: []string{"3f2a", "77b0"}}},
		{"release", &ReleaseOptions{Tickets: []string{}}},
		{"release --keeper /run/k/keeper.sock", &ReleaseOptions{Tickets: []string{}, Keeper: "/run/k/keeper.sock"}},
		{"log", &LogOptions{N: 20, Output: "table"}},
		{"log -n 5 -o json build", &LogOptions{N: 5, Output: "json", Limit: "build"}},
		{"completion zsh", &CompletionOptions{Shell: "zsh"}},
		{"completion fish --no-descriptions -o out.fish", &CompletionOptions{Shell: "fish", Output: "out.fish", NoDescriptions: true}},
		{"run --limit build --slots 2 --no-wait -- make -j8", &RunOptions{Limits: []string{"build"}, Weight: 1, Slots: 2, SlotsSet: true, Wait: 0,
			BusyExitCode: exitBusy, TTL: defaultTTL, OnLost: "kill", KillAfter: defaultKillAfter, MaxWaiting: -1, Argv: []string{"make", "-j8"}}},
		{"run -l build --limit db --weight 2 -- make", &RunOptions{Limits: []string{"build", "db"}, Weight: 2, Slots: 1, Wait: -1,
			BusyExitCode: exitBusy, TTL: defaultTTL, OnLost: "kill", KillAfter: defaultKillAfter, MaxWaiting: -1, Argv: []string{"make"}}},
		{"run -l ci --key main --supersede --max-waiting 1 --url https://ci.example/1 -- make", &RunOptions{Limits: []string{"ci"}, Weight: 1, Slots: 1, Wait: -1,
			BusyExitCode: exitBusy, TTL: defaultTTL, OnLost: "kill", KillAfter: defaultKillAfter, Key: "main", Supersede: true, MaxWaiting: 1,
			URL: "https://ci.example/1", Argv: []string{"make"}}},
		{"run -l deploy --key prod --replace --max-waiting 0 -- make", &RunOptions{Limits: []string{"deploy"}, Weight: 1, Slots: 1, Wait: -1,
			BusyExitCode: exitBusy, TTL: defaultTTL, OnLost: "kill", KillAfter: defaultKillAfter, Key: "prod", Replace: true, MaxWaiting: 0,
			Argv: []string{"make"}}},
	}
	for _, c := range cases {
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

	t.Run("version", func(t *testing.T) {
		f, _, errOut := flagsFactory(t)
		var got any
		if code := mainWith(context.Background(), []string{"version"}, f, stubRunFs(&got)); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if o, ok := got.(*VersionOptions); !ok || !strings.HasPrefix(o.Version, "slotctl v0.0.0-test (commit testcommit, built 2026-01-01T00:00:00Z, go") {
			t.Errorf("version options: %#v", got)
		}
	})
}

// TestCommandBadInput: each bad input is refused before the run function,
// with exit 64 and exactly one line that names it (a hint at its end).
func TestCommandBadInput(t *testing.T) {
	name := `want 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit`
	cases := []struct{ args, line string }{
		{"ls -o yaml", `-o "yaml": want table, wide or json`},
		{"ls a/b", `limit "a/b": ` + name},
		{"ls --watch 5s", `ls 5s: write the interval with =: --watch=5s`},
		{"ls --watch=10ms", `--watch 10ms: want a duration from 100ms to 1h0m0s`},
		{"ls --bogus", `unknown flag: --bogus; see 'slotctl ls --help'`},
		{"reap -o wide", `-o "wide": want table or json`},
		{"reap ok .bad", `limit ".bad": ` + name},
		{"limit set a/b 1", `limit name "a/b": ` + name},
		{"limit set build two", `slot count "two": want a whole number 0..65535 (0 pauses the limit)`},
		{"limit set build", `want NAME SLOTS, e.g. slotctl limit set build 2; see 'slotctl limit set --help'`},
		{"limit ls -o yaml", `-o "yaml": want table or json`},
		{"limit ls a/b", `limit "a/b": ` + name},
		{"limit rm a/b", `limit "a/b": ` + name},
		{"limit rm", `want one limit NAME; see 'slotctl limit rm --help'`},
		{"limit sett build 0", `unknown command "sett" for "slotctl limit": want set, ls or rm; see 'slotctl limit --help'`},
		{"release ab/cd", `ticket "ab/cd": want a ticket id or a prefix of one (letters, digits, - and _)`},
		{"release --keeper /k/keeper.sock 3f2a", `--keeper asks a keeper to let go of its own ticket: give it without TICKET; see 'slotctl release --help'`},
		{"acquire --limit a -- true", `acquire takes no COMMAND ("true"): to hold a slot while one command runs, use slotctl run; see 'slotctl acquire --help'`},
		{"acquire --limit a --jobserver", `--jobserver: acquire runs no build to serve; use slotctl run --jobserver`},
		{"acquire --limit a --bind-pid 0", `--bind-pid 0: want the pid of a running process`},
		{"acquire --limit a --env-file=", `--env-file '': want a file name`},
		{"acquire --limit a --supersede", `--supersede needs --key KEY: it acts only on the runs of the same key (1-256 printable characters)`},
		{"acquire", `--limit is required: name the limit to run under, e.g. --limit build; see 'slotctl acquire --help'`},
		{"log -o yaml", `-o "yaml": want table or json`},
		{"log -n 0", `-n 0: want 1..10000`},
		{"log a b", `want at most one LIMIT; see 'slotctl log --help'`},
		{"log a/b", `limit "a/b": ` + name},
		{"completion tcsh", `shell "tcsh": want bash, zsh, fish or powershell; see 'slotctl completion --help'`},
		{"frobnicate", `unknown command "frobnicate" for "slotctl"; see 'slotctl --help'`},
		// cobra's suggestions come on lines of their own after a tab: words here, never a literal \t.
		{"lss", `unknown command "lss" for "slotctl": did you mean ls or log?; see 'slotctl --help'`},
		{"rn", `unknown command "rn" for "slotctl": did you mean run or ls?; see 'slotctl --help'`},
		{"limits", `unknown command "limits" for "slotctl": did you mean limit?; see 'slotctl --help'`},
		{"run --limit x --ttl soon -- true", `--ttl "soon": want a duration such as 30s, 5m or 1h30m; see 'slotctl run --help'`},
		{"run --limit a --limit b --limit a -- true", `--limit "a" given twice: name each limit once`},
		{"run --limit a -l b/c -- true", `--limit "b/c": ` + name},
		{"run --limit a --weight 0 -- true", `--weight 0: want 1..65535 (the slots taken in each limit)`},
		{"run --limit a --weight -1 -- true", `--weight -1: want 1..65535 (the slots taken in each limit)`},
		{"run --limit a --weight 65536 -- true", `--weight 65536: want 1..65535 (the slots taken in each limit)`},
		{"run --limit a --weight two -- true", `--weight "two": want a whole number; see 'slotctl run --help'`},
		{"run --limit a --limit b --slots 2 --weight 3 -- true", `--weight 3 is more than --slots 2: want a weight of 1..2`},
		{"run --limit a --limit b --weight 2", `missing COMMAND: want slotctl run --limit NAME -- COMMAND [ARGS...]; see 'slotctl run --help'`},
		{"run" + manyLimits(17) + " -- true", `--limit given 17 times: want at most 16 limits`},
	}
	for _, c := range cases {
		t.Run(c.args, func(t *testing.T) {
			f, out, errOut := flagsFactory(t)
			var got any
			code := mainWith(context.Background(), strings.Fields(c.args), f, stubRunFs(&got))
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if got != nil {
				t.Errorf("the run function ran with %#v", got)
			}
			if want := "slotctl: " + c.line + "\n"; errOut.String() != want {
				t.Errorf("stderr:\n got %q\nwant %q", errOut, want)
			}
			if strings.Contains(errOut.String(), `\t`) || strings.Contains(errOut.String(), "\t") {
				t.Errorf("stderr has a tab, escaped or not: %q", errOut)
			}
			if out.Len() != 0 {
				t.Errorf("stdout: %q", out)
			}
		})
	}
}

// manyLimits is n --limit flags, each naming another limit.
func manyLimits(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, " --limit l%d", i)
	}
	return b.String()
}

// TestErrorLineFoldsHints: every hint slotctl gives ends the error's own line.
func TestErrorLineFoldsHints(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{&store.SlotsConflictError{Limit: "c", Have: 2, Want: 3}, `slotctl: limit "c" has 2 slots, not 3; to resize it: slotctl limit set c 3` + "\n"},
		{fmt.Errorf("limit %q: %w", "build", store.ErrLimitInUse), "slotctl: limit \"build\": " + store.ErrLimitInUse.Error() + "; wait for its tickets to go, or pass --force to remove them\n"},
		{fmt.Errorf("store /x.db: %w", store.ErrCorrupt), "slotctl: store /x.db: " + store.ErrCorrupt.Error() + "; move the file aside (slotctl will start a new one) or point --store elsewhere\n"},
		{&ExitError{Code: 64, Err: fmt.Errorf("two\nlines"), Hint: "a hint\nwith a newline"}, "slotctl: two lines; a hint with a newline\n"},
		{&ExitError{Code: 3}, ""},
		{weightError(&store.WeightError{Limit: "db", Slots: 2, Weight: 3}), `slotctl: --weight 3 is more than the 2 slots of limit "db": want a weight of 1..2; or resize it: slotctl limit set db 3` + "\n"},
	}
	for _, c := range cases {
		if got := errorLine(c.err); got != c.want {
			t.Errorf("errorLine(%v):\n got %q\nwant %q", c.err, got, c.want)
		}
	}
}

// TestLogTablePlain: log's table, now drawn by the renderer ls uses, is the
// same text off a terminal as the tabwriter table it was before.
func TestLogTablePlain(t *testing.T) {
	at := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	events := []store.Event{
		{Seq: 1, Time: at, Kind: "admitted", Limit: "build", Ticket: "7a1c9e04b2d34f6e", Fence: 1, Slot: 0, Host: "host1", Pid: 100, User: "alice", Command: "make -j8"},
		{Seq: 2, Time: at.Add(time.Minute), Kind: "cancelled", Limit: "deploy", Ticket: "e5b7d9f1a3c54e6b", Fence: 0, Slot: -1, Host: "host2", Pid: 103, User: "bob", Command: "ansible-playbook site.yml"},
		{Seq: 3, Time: at.Add(time.Hour), Kind: "reaped", Limit: "build", Ticket: "7a1c9e04b2d34f6e", Fence: 1, Slot: 0, Host: "host1", Pid: 100, User: "alice", Command: "make -j8", Evidence: "expired 41s ago"},
	}
	var before bytes.Buffer // the table log printed before it shared the renderer
	tw := tabwriter.NewWriter(&before, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tEVENT\tLIMIT\tTICKET\tFENCE\tSLOT\tHOST\tPID\tUSER\tCOMMAND\tEVIDENCE")
	for _, e := range events {
		slot := "-"
		if e.Slot >= 0 {
			slot = fmt.Sprint(e.Slot)
		}
		p := store.Printable
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Time.Local().Format(time.DateTime), p(e.Kind), p(e.Limit),
			shortID(e.Ticket), e.Fence, slot, p(e.Host), e.Pid, p(e.User), p(e.Command), p(e.Evidence))
	}
	tw.Flush()
	var after bytes.Buffer
	if err := drawEvents(tableOut{w: &after}, events); err != nil {
		t.Fatal(err)
	}
	if after.String() != before.String() {
		t.Errorf("log's plain table changed:\n--- now ---\n%s--- before ---\n%s", after.String(), before.String())
	}
}

// TestReleasePromptFromFactory: release asks on the factory's terminal
// streams, reads the answer from the factory's stdin, and a "n" keeps the ticket.
func TestReleasePromptFromFactory(t *testing.T) {
	e := newLsEnv(t)
	lsGoldenStore(t, e)
	f, out, errOut := lsFactory(e.env, nil, false, 0)
	f.IO.In = strings.NewReader("n\n")
	f.IO.InTTY, f.IO.ErrTTY = true, true
	if code := lsRun(t, f, "release", "9b2e4d6f"); code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, errOut)
	}
	want := "slotctl: release ticket 9b2e4d6f (limit backup, held slot 0, restic backup /srv, pid 104 on host1)? [y/N] slotctl: not released\n"
	if errOut.String() != want {
		t.Errorf("stderr:\n got %q\nwant %q", errOut, want)
	}
	f, out, errOut = lsFactory(e.env, nil, false, 0)
	if code := lsRun(t, f, "limit", "ls", "backup"); code != 0 || !strings.Contains(out.String(), "backup") {
		t.Errorf("limit ls backup: exit %d: %s%s", code, out, errOut)
	}
	if !strings.Contains(out.String(), "1  ") {
		t.Errorf("the ticket went: %s", out)
	}
}

// TestStatusLineWidthFromFactory: the waiting line on a terminal is cut to
// the width the factory gives for stderr, not to the process's own stderr.
func TestStatusLineWidthFromFactory(t *testing.T) {
	e := newLsEnv(t)
	clock := lsGoldenStore(t, e)
	st, err := boltstore.New(e.store, boltstore.Options{Clock: clock, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f, _, errOut := lsFactory(e.env, clock, false, 0)
	f.IO.ErrTTY = true
	f.ErrWidth = func() int { return 50 }
	s := newStatusLine(f, &logger{w: errOut}, st, []string{"build"})
	s.t = store.Ticket{ID: "c04e1a9b7d2f4c6e8a1b3d5f7092a4c6", Limit: "build", State: store.Waiting, Position: 1}
	s.draw(context.Background())
	got := strings.TrimPrefix(errOut.String(), "\r\033[K")
	if n := len([]rune(got)); n > 49 || !strings.HasSuffix(got, "…") {
		t.Errorf("status line of %d columns for a 50-column stderr: %q", n, got)
	}
	if !strings.HasPrefix(got, `slotctl: waiting for limit "build" (2/2 held), `) {
		t.Errorf("status line: %q", got)
	}
}

// TestStatusLineSeveralLimits: the waiting line of a ticket of several
// limits names the limits that keep it out (an older waiter, too few free
// slots for its weight, a size shrunk below its weight), its place in each,
// and the holders of those limits only.
func TestStatusLineSeveralLimits(t *testing.T) {
	e := newLsEnv(t)
	st, err := boltstore.New(e.store, boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for name, n := range map[string]int{"build": 4, "db": 2} {
		if _, err := st.SetLimit(ctx, name, n); err != nil {
			t.Fatal(err)
		}
	}
	enq := func(id string, limits []string, weight int, argv ...string) store.Ticket {
		t.Helper()
		tk, err := st.Enqueue(ctx, store.EnqueueRequest{ID: id, Limits: limits, Weight: weight, TTL: time.Hour,
			Holder: store.Holder{Host: "h", Pid: 7, Argv: argv}})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	enq("a0000000000000000000000000000001", []string{"build"}, 1, "make")
	enq("a0000000000000000000000000000002", []string{"db"}, 2, "migrate")
	w := enq("a0000000000000000000000000000003", []string{"build", "db"}, 2, "test")
	if w.State != store.Waiting {
		t.Fatalf("the ticket of build and db is %s, want waiting (db is full)", w.State)
	}
	f, _, errOut := lsFactory(e.env, nil, false, 0)
	s := newStatusLine(f, &logger{w: errOut}, st, []string{"build", "db"})
	got := s.text(ctx, w, 0)
	want := `waiting for limits "build", "db" (weight 2): "db" (2/2 held), 1st in queue; held by migrate (pid 7 on h, 0s)`
	if got != want {
		t.Errorf("status:\n got %q\nwant %q", got, want)
	}
	if _, err := st.SetLimit(ctx, "db", 1); err != nil {
		t.Fatal(err)
	}
	got = s.text(ctx, w, 0)
	if want := `"db" (2/1 held), 1st in queue, smaller than weight 2: waits for a resize;`; !strings.Contains(got, want) {
		t.Errorf("status after db shrank to 1:\n got %q\nwant it to contain %q", got, want)
	}
}

// TestStatusLineFollowsTheQueue: redrawn on a terminal, the waiting line
// shows the ticket's place as it is now, not as the waiter last heard it
// (the heads it reads list no waiter but the first).
func TestStatusLineFollowsTheQueue(t *testing.T) {
	e := newLsEnv(t)
	st, err := boltstore.New(e.store, boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	var tks []store.Ticket
	for i := range 4 {
		tk, err := st.Enqueue(ctx, store.EnqueueRequest{ID: fmt.Sprintf("b000000000000000000000000000000%d", i), Limit: "build", Slots: 1,
			TTL: time.Hour, Holder: store.Holder{Host: "h", Pid: 7, Argv: []string{"make"}}})
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	me := tks[3]
	if me.Position != 3 {
		t.Fatalf("the last ticket is %s at place %d, want waiting 3rd", me.State, me.Position)
	}
	if _, err := st.Cancel(ctx, tks[1]); err != nil {
		t.Fatal(err)
	}
	f, _, errOut := lsFactory(e.env, nil, false, 0)
	f.IO.ErrTTY = true
	f.ErrWidth = func() int { return 200 }
	s := newStatusLine(f, &logger{w: errOut}, st, []string{"build"})
	s.t = me // as enqueued: 3rd
	s.draw(ctx)
	if got := errOut.String(); !strings.Contains(got, ", 2nd in queue") {
		t.Errorf("status line after the waiter ahead left: %q, want it 2nd in queue", got)
	}
}
