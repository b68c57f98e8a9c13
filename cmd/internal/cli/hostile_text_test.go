package cli

// Hostile text in the store (docs/leases.md §4.5): a member of a
// shared store's group can write any label, host, user or command line into
// a ticket, and an older or hostile writer any bytes into any record. None
// of it may reach root's terminal or the reaper's journal as anything but
// escaped text: no ESC, CR, other C0 or C1 control, DEL, line or paragraph
// separator, bidi override or invalid UTF-8 in what slotctl prints, and
// never a line of output that the record, not slotctl, began.

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// What a hostile member writes into its own tickets through the store API.
const (
	// Clears the screen, sets the window title, then forges a second line
	// of reap output; a bidi override, a C1 CSI and a DEL at the end.
	hostileLabel = "nightly\x1b[2J\x1b]0;owned\x07\r\nreaped 00000000 (limit build, held slot 0, make, pid 1 on h): expired 1s ago\u202egnp.exe\u009b2J\x7f"
	hostileHost  = "ci-7\x1b[1A\x1b[2Kforged"
	hostileUser  = "root\rmallory\u2028\u0085x"
	hostileArg   = "\x1b[2J\x1b[Hline1\nslotctl: forged"
)

// hostileTickets are the tickets of hostileStore, in limit "build" (1 slot):
// the first holds, the others wait.
var hostileTickets = []store.EnqueueRequest{
	{ID: "aaaa1111bbbb2222cccc3333dddd4444", Holder: store.Holder{Host: hostileHost, User: "alice", Pid: 100, Argv: []string{"printf", hostileArg}}},
	{ID: "aaaa5555bbbb6666cccc7777dddd8888", Holder: store.Holder{Host: "h2", User: hostileUser, Pid: 101, Label: hostileLabel}},
	{ID: "eeee1111ffff2222aaaa3333bbbb4444", Holder: store.Holder{Host: "h3\t\x00x", User: "bob", Pid: 102, Argv: []string{"sh", "-c", "echo \x9b\xff"}}},
}

// hostileStore writes hostileTickets into a new store at e.store with a fake
// clock, and returns the clock.
func hostileStore(t *testing.T, e *lsEnv) *boltstore.FakeClock {
	t.Helper()
	clock := boltstore.NewFakeClock(boltstore.Instant{Boot: "hostile-boot", Mono: 1000 * time.Hour, Wall: lsGoldenWall})
	// Loud: every waiter's lease runs from its enqueue, so that an hour
	// later a reap removes them all and prints each.
	st, err := boltstore.New(e.store, boltstore.Options{Clock: clock, NoSync: true, Loud: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, r := range hostileTickets {
		r.Limit, r.Slots, r.TTL = "build", 1, 30*time.Second
		if _, err := st.Enqueue(context.Background(), r); err != nil {
			t.Fatalf("Enqueue %s: %v", r.ID, err)
		}
		clock.Advance(time.Second)
	}
	return clock
}

// sgr matches the colour sequences that slotctl itself writes on a terminal.
var sgr = regexp.MustCompile("\x1b\\[[0-9;]*m")

// assertPrintable fails if s holds anything but graphic characters and
// newlines (and tabs, with tabs set): what may reach a terminal or a log.
func assertPrintable(t *testing.T, what, s string, tabs bool) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Errorf("%s: invalid UTF-8 in %q", what, s)
	}
	for i, r := range s {
		if r == '\n' || tabs && r == '\t' || unicode.IsGraphic(r) { // U+FFFD too: invalid UTF-8 is checked above
			continue
		}
		t.Errorf("%s: raw %U at byte %d of\n%s", what, r, i, s)
		return
	}
}

// lines splits output into its lines (without the final newline).
func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

func hostileRun(t *testing.T, e *lsEnv, clock boltstore.Clock, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	f, out, errOut := lsFactory(e.env, clock, false, 0)
	code = lsRun(t, f, args...)
	return code, out.String(), errOut.String()
}

func TestHostileTextLs(t *testing.T) {
	e := newLsEnv(t)
	clock := hostileStore(t, e)
	for _, args := range [][]string{{"ls"}, {"ls", "-o", "wide"}, {"ls", "build"}} {
		code, out, errOut := hostileRun(t, e, clock, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errOut)
		}
		assertPrintable(t, strings.Join(args, " "), out, false)
		assertPrintable(t, strings.Join(args, " ")+" stderr", errOut, false)
		// LIMIT header, build, blank, TICKET header, three tickets.
		if n := len(lines(out)); n != 4+len(hostileTickets) {
			t.Errorf("%q: %d lines, want %d:\n%s", args, n, 4+len(hostileTickets), out)
		}
	}

	// On a terminal: coloured, fitted to the width, and still no text of the record's own making.
	for _, width := range []int{0, 60, 200} {
		for _, args := range [][]string{{"ls"}, {"ls", "-o", "wide"}} {
			out := lsTTY(t, e, clock, width, args...)
			if !sgr.MatchString(out) {
				t.Fatalf("%q on a terminal: no colour, so this does not test the terminal table:\n%s", args, out)
			}
			plain := sgr.ReplaceAllString(out, "")
			assertPrintable(t, strings.Join(args, " ")+" on a terminal", plain, false)
			if n := len(lines(plain)); n != 4+len(hostileTickets) {
				t.Errorf("%q on a %d-wide terminal: %d lines, want %d:\n%s", args, width, n, 4+len(hostileTickets), plain)
			}
		}
	}
}

// JSON keeps the schema and the text itself (decoded, it is the record's
// own), but writes every control, C1, DEL and format character as \u escape.
func TestHostileTextLsJSON(t *testing.T) {
	e := newLsEnv(t)
	clock := hostileStore(t, e)
	code, out, errOut := hostileRun(t, e, clock, "ls", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertPrintable(t, "ls -o json", out, false)
	var j lsJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.Tickets) != len(hostileTickets) {
		t.Fatalf("%d tickets, want %d", len(j.Tickets), len(hostileTickets))
	}
	byID := map[string]ticketJSON{}
	for _, tk := range j.Tickets {
		byID[tk.ID] = tk
	}
	for _, r := range hostileTickets {
		got := byID[r.ID]
		want := r.Holder
		if got.Host != want.Host {
			t.Errorf("%s: host %q, want %q", r.ID, got.Host, want.Host)
		}
		if got.User != want.User {
			t.Errorf("%s: user %q, want %q", r.ID, got.User, want.User)
		}
		if want.Label != "" && got.Command != want.Label {
			t.Errorf("%s: command %q, want the label %q", r.ID, got.Command, want.Label)
		}
	}
}

func TestHostileTextReap(t *testing.T) {
	e := newLsEnv(t)
	clock := hostileStore(t, e)
	clock.Advance(time.Hour) // every lease has expired
	for _, c := range []struct {
		args []string
		verb string
	}{
		{[]string{"reap", "--dry-run"}, "would reap "},
		{[]string{"reap", "-v"}, "reaped "},
	} {
		code, out, errOut := hostileRun(t, e, clock, c.args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", c.args, code, errOut)
		}
		assertPrintable(t, strings.Join(c.args, " "), out, false)
		assertPrintable(t, strings.Join(c.args, " ")+" stderr", errOut, false)
		// One line per removed ticket, each of slotctl's making.
		got := lines(out)
		if len(got) != len(hostileTickets) {
			t.Errorf("%q: %d lines, want one per ticket (%d):\n%s", c.args, len(got), len(hostileTickets), out)
		}
		for _, l := range got {
			if !strings.HasPrefix(l, c.verb) || !strings.Contains(l, "): expired ") {
				t.Errorf("%q: line %q is not one of slotctl's", c.args, l)
			}
		}
	}
	// Reaped: the event log shows them, one line each.
	code, out, errOut := hostileRun(t, e, clock, "log")
	if code != 0 {
		t.Fatalf("log: exit %d: %s", code, errOut)
	}
	assertPrintable(t, "log", out, false)
	_, jout, _ := hostileRun(t, e, clock, "log", "-o", "json")
	assertPrintable(t, "log -o json", jout, false)
	events := lines(jout)
	if len(lines(out)) != 1+len(events) {
		t.Errorf("log: %d lines for %d events:\n%s", len(lines(out)), len(events), out)
	}
	reaped := 0
	for _, l := range events {
		var ev eventJSON
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("log -o json line %q: %v", l, err)
		}
		if ev.Kind == "reaped" {
			reaped++
		}
		if ev.Ticket == hostileTickets[1].ID && ev.Command != hostileLabel {
			t.Errorf("log -o json: command %q, want the label %q", ev.Command, hostileLabel)
		}
	}
	if reaped != len(hostileTickets) {
		t.Errorf("log -o json: %d reaped events, want %d", reaped, len(hostileTickets))
	}

	// reap -o json on a fresh store: the text itself, escaped as JSON.
	e2 := newLsEnv(t)
	clock2 := hostileStore(t, e2)
	clock2.Advance(time.Hour)
	code, out, errOut = hostileRun(t, e2, clock2, "reap", "--dry-run", "-o", "json")
	if code != 0 {
		t.Fatalf("reap -o json: exit %d: %s", code, errOut)
	}
	assertPrintable(t, "reap -o json", out, false)
	var rj reapJSON
	if err := json.Unmarshal([]byte(out), &rj); err != nil {
		t.Fatal(err)
	}
	if len(rj.Removed) != len(hostileTickets) {
		t.Fatalf("reap -o json: %d removed, want %d", len(rj.Removed), len(hostileTickets))
	}
}

func TestHostileTextRelease(t *testing.T) {
	e := newLsEnv(t)
	clock := hostileStore(t, e)

	// The prompt on a terminal names the ticket's holder.
	f, out, errOut := lsFactory(e.env, clock, false, 0)
	f.IO.In, f.IO.InTTY, f.IO.ErrTTY = strings.NewReader("n\n"), true, true
	if code := lsRun(t, f, "release", "aaaa1111", "aaaa5555"); code != 1 {
		t.Fatalf("release at the prompt, answered n: exit %d, want 1: %s", code, errOut)
	}
	assertPrintable(t, "release prompt", errOut.String(), false)
	if out.Len() != 0 {
		t.Errorf("release: stdout %q", out)
	}
	if n := strings.Count(errOut.String(), "? [y/N] "); n != 2 {
		t.Errorf("release prompt: %d questions, want 2:\n%s", n, errOut)
	}

	// A prefix that matches several tickets: one line naming them.
	code, stdout, stderr := hostileRun(t, e, clock, "release", "--yes", "aaaa")
	if code != exitUsage {
		t.Errorf("release aaaa: exit %d, want %d: %s", code, exitUsage, stderr)
	}
	assertPrintable(t, "release aaaa", stderr+stdout, false)
	if n := len(lines(stderr)); n != 1 {
		t.Errorf("release aaaa: %d lines on stderr, want 1:\n%s", n, stderr)
	}

	// -v: the line that says what was released.
	code, stdout, stderr = hostileRun(t, e, clock, "release", "--yes", "-v", "eeee")
	if code != 0 {
		t.Fatalf("release eeee: exit %d: %s", code, stderr)
	}
	assertPrintable(t, "release -v", stderr+stdout, false)
}

// A holder alive on this host is refused with a message that names it.
func TestHostileTextReleaseAliveHolder(t *testing.T) {
	e := newLsEnv(t)
	st, err := boltstore.New(e.store, boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	start, err := proc.StartTime(os.Getpid())
	if err != nil {
		t.Skipf("no process start times here: %v", err)
	}
	h := store.Holder{Host: hostileHost, User: hostileUser, BootID: proc.BootID(), PidNS: proc.PidNS(),
		Pid: os.Getpid(), PidStart: start, Label: hostileLabel}
	if _, err := st.Enqueue(context.Background(), store.EnqueueRequest{ID: "alive000alive111", Limit: "build", Slots: 1, TTL: time.Hour, Holder: h}); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := hostileRun(t, e, nil, "release", "--yes", "alive000")
	if code != exitUsage {
		t.Fatalf("release of a live holder: exit %d, want %d: %s", code, exitUsage, stderr)
	}
	assertPrintable(t, "release of a live holder", stderr+stdout, false)
	if n := len(lines(stderr)); n != 1 { // the error, its hint in the same line
		t.Errorf("release of a live holder: %d lines, want 1:\n%s", n, stderr)
	}
}

func TestHostileTextComplete(t *testing.T) {
	e := newLsEnv(t)
	hostileStore(t, e)
	got, dir, stderr := compRun(t, e.env, "release", "")
	if dir != ":4" {
		t.Errorf("directive %q, want :4", dir)
	}
	if len(got) != len(hostileTickets) {
		t.Errorf("release \"\": %d candidates, want one per ticket (%d): %q", len(got), len(hostileTickets), got)
	}
	for _, c := range got {
		id, desc, _ := strings.Cut(c, "\t")
		if store.CheckID(id) != nil {
			t.Errorf("candidate %q is no ticket id", c)
		}
		assertPrintable(t, "candidate", desc, false)
	}
	assertPrintable(t, "__complete stderr", stderr, false)
}

// The waiting line and the busy message name the holders.
func TestHostileTextWaiting(t *testing.T) {
	e := newLsEnv(t)
	clock := hostileStore(t, e)
	code, stdout, stderr := hostileRun(t, e, clock, "run", "--limit", "build", "--wait", "300ms", "--", "true")
	if code != exitBusy {
		t.Fatalf("run behind a held slot: exit %d, want %d: %s", code, exitBusy, stderr)
	}
	assertPrintable(t, "run --wait", stderr+stdout, false)
	if n := len(lines(stderr)); n != 2 { // waiting ..., not admitted ...
		t.Errorf("run --wait: %d lines on stderr, want 2:\n%s", n, stderr)
	}
	if !strings.Contains(stderr, "held by ") {
		t.Errorf("run --wait: the waiting line names no holder:\n%s", stderr)
	}
}

// A record written by a hostile or broken writer, not through the store
// API: control characters in ids, limit names and event fields. Whatever
// slotctl does with it (shows it escaped, or refuses the store with exit
// 69), nothing it prints carries them.
func TestHostileTextRawRecords(t *testing.T) {
	e := newLsEnv(t)
	clock := hostileStore(t, e)
	f, _, _ := lsFactory(e.env, clock, false, 0)
	if code := lsRun(t, f, "limit", "set", "deploy", "1"); code != 0 {
		t.Fatal("limit set deploy: exit", code)
	}
	db, err := bolt.Open(e.store, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	evil := "ev\x1b]0;x\x07il\nreaped 1"
	err = db.Update(func(tx *bolt.Tx) error {
		// A ticket whose id holds control characters.
		q := tx.Bucket([]byte("queue")).Bucket([]byte("build"))
		k, v := q.Cursor().First()
		var rec map[string]any
		if err := json.Unmarshal(v, &rec); err != nil {
			return err
		}
		rec["id"] = "aaaa\x1b[2J\n" + evil
		b, _ := json.Marshal(rec)
		if err := q.Put(k, b); err != nil {
			return err
		}
		// A limit whose name does.
		lb := tx.Bucket([]byte("limits"))
		lv := lb.Get([]byte("deploy"))
		if err := lb.Put([]byte(evil), lv); err != nil {
			return err
		}
		if _, err := tx.Bucket([]byte("queue")).CreateBucketIfNotExists([]byte(evil)); err != nil {
			return err
		}
		// An event whose every text field does.
		ev := tx.Bucket([]byte("events"))
		ek, evv := ev.Cursor().Last()
		var er map[string]any
		if err := json.Unmarshal(evv, &er); err != nil {
			return err
		}
		for _, f := range []string{"kind", "limit", "ticket", "host", "user", "command", "evidence"} {
			er[f] = evil
		}
		b, _ = json.Marshal(er)
		return ev.Put(ek, b)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"ls"}, {"ls", "-o", "wide"}, {"ls", "-o", "json"}, {"limit", "ls"}, {"limit", "ls", "-o", "json"},
		{"log"}, {"log", "-o", "json"}, {"reap", "--dry-run"}, {"release", "--yes", "aaaa"},
		{"__complete", "release", ""}, {"__complete", "ls", ""}, {"__complete", "run", "--limit", ""},
	} {
		code, out, errOut := hostileRun(t, e, clock, args...)
		what := strings.Join(args, " ")
		assertPrintable(t, what, out, args[0] == "__complete")
		assertPrintable(t, what+" stderr", errOut, false)
		if code != 0 && len(lines(errOut)) > 2 {
			t.Errorf("%s: exit %d with %d lines on stderr:\n%s", what, code, len(lines(errOut)), errOut)
		}
		if args[0] == "__complete" {
			for _, c := range lines(out) {
				if c, _, _ = strings.Cut(c, "\t"); strings.HasPrefix(c, ":") {
					continue
				}
				if store.CheckID(c) != nil && !store.ValidLimitName(c) {
					t.Errorf("%s: candidate %q is neither a ticket id nor a limit name", what, c)
				}
			}
		}
		if bytes.Contains([]byte(out+errOut), []byte("reaped 1")) && !strings.Contains(out+errOut, `\nreaped 1`) {
			t.Errorf("%s: the record's text reached the output unescaped:\n%s", what, out+errOut)
		}
	}
}

// On a terminal the waiting line is redrawn in place: slotctl's own
// "\r\x1b[K" and nothing of the record's.
func TestHostileTextWaitingTerminal(t *testing.T) {
	e := newLsEnv(t)
	clock := hostileStore(t, e)
	f, out, errOut := lsFactory(e.env, clock, false, 0)
	f.IO.ErrTTY = true
	if code := lsRun(t, f, "run", "--limit", "build", "--wait", "1500ms", "--", "true"); code != exitBusy {
		t.Fatalf("run behind a held slot: exit %d, want %d: %s", code, exitBusy, errOut)
	}
	if !strings.Contains(errOut.String(), "\r\x1b[K") {
		t.Fatalf("no live status line drawn:\n%q", errOut)
	}
	plain := strings.ReplaceAll(errOut.String(), "\r\x1b[K", "\n")
	assertPrintable(t, "run --wait on a terminal", plain+out.String(), false)
	if !strings.Contains(plain, "held by ") {
		t.Errorf("the waiting line names no holder:\n%s", plain)
	}
}
