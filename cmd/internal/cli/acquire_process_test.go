package cli

// slotctl acquire and slotctl release end to end: the real slotctl (see
// process_test.go), its keeper a real slotctl run and its job. Each test
// starts acquire in a testguard scope of its own, which its run, guard and
// keeper inherit: the scope shows what is left of the keeper.

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// acqTimeout bounds every wait of these tests: room for a loaded machine,
// never a measure of speed.
const acqTimeout = 30 * time.Second

// acqStart starts slotctl with args in scope sc, with env added.
func acqStart(ctx context.Context, e *ptEnv, sc testguard.Scope, name string, env []string, args ...string) *ptProc {
	e.t.Helper()
	return e.startWith(ctx, name, append([]string{sc.Env()}, env...), args...)
}

// acqVars reads the variables acquire p printed.
func acqVars(t *testing.T, e *ptEnv, p *ptProc) [][2]string {
	t.Helper()
	return acqParse(t, readFile(t, e.path(p.name+".stdout")))
}

// acqParse reads the variables acquire printed (out), one "export
// NAME=value" a line (a value in single quotes as the shell reads it), in
// order; they must be all that its standard output holds.
func acqParse(t *testing.T, out string) [][2]string {
	t.Helper()
	var vars [][2]string
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		assignment, export := strings.CutPrefix(line, "export ")
		name, value, ok := strings.Cut(assignment, "=")
		if !export || !ok || !strings.HasPrefix(name, "SLOTCTL_") {
			t.Fatalf("acquire's stdout has a line that is not an assignment: %q\nstdout:\n%s", line, out)
		}
		if strings.HasPrefix(value, "'") {
			value = strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(value, "'"), "'"), `'\''`, "'")
		}
		vars = append(vars, [2]string{name, value})
	}
	return vars
}

// acqGet is the value of name in vars, failing the test without it.
func acqGet(t *testing.T, vars [][2]string, name string) string {
	t.Helper()
	for _, kv := range vars {
		if kv[0] == name {
			return kv[1]
		}
	}
	t.Fatalf("no %s among acquire's variables %q", name, vars)
	return ""
}

// acqEnv is vars as an environment, as a later CI step has them.
func acqEnv(vars [][2]string) []string {
	var env []string
	for _, kv := range vars {
		env = append(env, kv[0]+"="+kv[1])
	}
	return env
}

// acqAcquire runs acquire with args in scope sc until it exits 0 and
// returns its variables.
func acqAcquire(ctx context.Context, t *testing.T, e *ptEnv, sc testguard.Scope, name string, env []string, args ...string) [][2]string {
	t.Helper()
	p := acqStart(ctx, e, sc, name, env, append([]string{"acquire"}, args...)...)
	if code := p.wait(t, acqTimeout); code != 0 {
		t.Fatalf("acquire exited %d; stderr:\n%s", code, p.stderr())
	}
	return acqVars(t, e, p)
}

// acqNoneLeft waits until nothing of scope sc runs: the keeper's run,
// guard and job all gone.
func acqNoneLeft(t *testing.T, sc testguard.Scope, what string) {
	t.Helper()
	deadline := time.Now().Add(acqTimeout)
	for {
		left := sc.Running()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: processes of the keeper still run after %s: %v", what, acqTimeout, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// acqTickets are the store's tickets, as ls -o json lists them.
func acqTickets(t *testing.T, e *ptEnv) []ticketJSON {
	t.Helper()
	out, err := e.output("ls", "-o", "json")
	if err != nil {
		t.Fatalf("ls: %v", err)
	}
	var l lsJSON
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("ls -o json: %v\n%s", err, out)
	}
	return l.Tickets
}

// acqRun runs slotctl run on limit with flags until it exits, and returns
// its status and stderr.
func acqRun(ctx context.Context, t *testing.T, e *ptEnv, name, limit string, flags ...string) (int, string) {
	t.Helper()
	args := append(append([]string{"run", "--limit", limit}, flags...), "--", "true")
	p := e.start(ctx, name, args...)
	return p.wait(t, 2*acqTimeout), p.stderr()
}

// acqKeeperDirs are the keepers' directories left in the test's TMPDIR.
func acqKeeperDirs(t *testing.T, e *ptEnv) []string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(e.path("tmp"), "slotctl-"+strconv.Itoa(os.Getuid()), "acquire-*"))
	return dirs
}

// TestAcquireRelease: acquire holds the slot after it exits (another
// step's run --no-wait is busy), prints its variables and writes them to
// $GITHUB_ENV and --env-file; release with those variables returns once
// the ticket is gone and nothing of the keeper runs, and the next run is
// admitted.
func TestAcquireRelease(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*acqTimeout)
	defer cancel()
	sc := testguard.Test(t)
	gh := e.path("github.env")
	if err := os.WriteFile(gh, []byte("EARLIER=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := acqAcquire(ctx, t, e, sc, "acquire", []string{"GITHUB_ENV=" + gh}, "--limit", "dep", "--key", "prod", "--env-file", e.path("vars.env"))
	id := acqGet(t, vars, proc.TicketVar)
	for name, want := range map[string]string{"SLOTCTL_LIMIT": "dep", "SLOTCTL_SLOT": "0", "SLOTCTL_SLOTS": "dep=0"} {
		if got := acqGet(t, vars, name); got != want {
			t.Errorf("%s=%q, want %q", name, got, want)
		}
	}
	sock := acqGet(t, vars, keeperVar)
	if st, err := os.Stat(filepath.Dir(sock)); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("keeper's directory %s: %v, mode %v; want 0700", filepath.Dir(sock), err, st.Mode())
	}

	plain := strings.Join(acqEnv(vars), "\n") + "\n"
	if got := readFile(t, gh); got != "EARLIER=1\n"+plain {
		t.Errorf("GITHUB_ENV holds\n%s\nwant what it held, then\n%s", got, plain)
	}
	if got := readFile(t, e.path("vars.env")); got != plain {
		t.Errorf("--env-file holds\n%s\nwant\n%s", got, plain)
	}

	tickets := acqTickets(t, e)
	if len(tickets) != 1 || tickets[0].ID != id || tickets[0].State != "held" || !strings.HasPrefix(tickets[0].Command, "slotctl acquire --limit=dep") {
		t.Errorf("ls: %+v; want ticket %s held, its command slotctl acquire --limit=dep ...", tickets, id)
	}
	if code, stderr := acqRun(ctx, t, e, "busy", "dep", "--no-wait"); code != exitBusy || !strings.Contains(stderr, `limit "dep" is full (1/1 held)`) {
		t.Errorf("another step's run --no-wait exited %d, want %d (busy); stderr:\n%s", code, exitBusy, stderr)
	}

	rel := e.startWith(ctx, "release", acqEnv(vars), "release")
	if code := rel.wait(t, acqTimeout); code != 0 || !strings.Contains(rel.stderr(), "released ticket "+short(id)) {
		t.Fatalf("release exited %d, want 0; stderr:\n%s", code, rel.stderr())
	}
	// release returned: the ticket is gone already, not soon.
	if tickets := acqTickets(t, e); len(tickets) != 0 {
		t.Errorf("after release, ls lists %+v", tickets)
	}
	acqNoneLeft(t, sc, "after release")
	if code, stderr := acqRun(ctx, t, e, "next", "dep", "--no-wait"); code != 0 {
		t.Errorf("the next run exited %d, want 0 (admitted); stderr:\n%s", code, stderr)
	}
	if dirs := acqKeeperDirs(t, e); len(dirs) != 0 {
		t.Errorf("keeper directories left after release: %q", dirs)
	}
}

// TestAcquireKeeperKilled: the keeper's slotctl run, or the keeper
// process itself, is SIGKILLed. The slot comes back (a run waiting for it
// is admitted, well within the short TTL's room), nothing of the keeper's
// job is left, and a later release says it was already released.
func TestAcquireKeeperKilled(t *testing.T) {
	for _, which := range []string{"run", "keeper"} {
		t.Run(which, func(t *testing.T) {
			e := newPTEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 4*acqTimeout)
			defer cancel()
			sc := testguard.Test(t)
			vars := acqAcquire(ctx, t, e, sc, "acquire", nil, "--limit", "k", "--ttl", "2s")
			var pid int
			if which == "run" {
				m, err := proc.ParseMarker(acqGet(t, vars, proc.SupervisorVar))
				if err != nil {
					t.Fatal(err)
				}
				pid = m.Pid
			} else {
				for _, p := range sc.Running() {
					// The keeper itself, not its run (whose command line names it too).
					if f := strings.Fields(p.Argv); len(f) > 1 && f[1] == keeperCmdName {
						pid = p.Pid
					}
				}
			}
			if pid <= 0 {
				t.Fatalf("no %s process in the scope: %v", which, sc.Running())
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if code, stderr := acqRun(ctx, t, e, "next", "k", "--ttl", "2s", "--wait", acqTimeout.String()); code != 0 {
				t.Fatalf("a run waiting for the slot exited %d, want 0; stderr:\n%s", code, stderr)
			}
			acqNoneLeft(t, sc, "after the "+which+" was killed")
			rel := e.startWith(ctx, "release", acqEnv(vars), "release")
			if code := rel.wait(t, acqTimeout); code != 0 || !strings.Contains(rel.stderr(), "already released") {
				t.Errorf("release exited %d, want 0 (already released); stderr:\n%s", code, rel.stderr())
			}
		})
	}
}

// TestAcquireBindPid: the keeper lets go when the process it is bound to
// exits, and not before.
func TestAcquireBindPid(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*acqTimeout)
	defer cancel()
	sc := testguard.Test(t)
	sleep := exec.CommandContext(ctx, "sleep", "1000")
	sleep.Env = append(os.Environ(), sc.Env())
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	e.notePid(sleep.Process.Pid)
	waited := make(chan struct{})
	go func() { _ = sleep.Wait(); close(waited) }()

	acqAcquire(ctx, t, e, sc, "acquire", nil, "--limit", "b", "--bind-pid", strconv.Itoa(sleep.Process.Pid))
	if code, stderr := acqRun(ctx, t, e, "busy", "b", "--no-wait"); code != exitBusy {
		t.Errorf("run --no-wait while the bound process runs exited %d, want %d; stderr:\n%s", code, exitBusy, stderr)
	}
	_ = sleep.Process.Kill()
	<-waited
	if code, stderr := acqRun(ctx, t, e, "next", "b", "--wait", acqTimeout.String()); code != 0 {
		t.Fatalf("a run waiting for the slot exited %d, want 0; stderr:\n%s", code, stderr)
	}
	acqNoneLeft(t, sc, "after the bound process exited")
}

// TestAcquireMaxHold: the keeper lets go when --max-hold passes, not before.
func TestAcquireMaxHold(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*acqTimeout)
	defer cancel()
	sc := testguard.Test(t)
	const hold = 2 * time.Second
	start := time.Now()
	acqAcquire(ctx, t, e, sc, "acquire", nil, "--limit", "m", "--max-hold", hold.String())
	if code, stderr := acqRun(ctx, t, e, "next", "m", "--wait", acqTimeout.String()); code != 0 {
		t.Fatalf("a run waiting for the slot exited %d, want 0; stderr:\n%s", code, stderr)
	}
	if d := time.Since(start); d < hold {
		t.Errorf("the slot came back %s after acquire started: before --max-hold %s", d, hold)
	}
	acqNoneLeft(t, sc, "after --max-hold")
}

// TestReleaseWithoutKeeper: release with no TICKET and no keeper to ask
// says so in one line: exit 64 with nothing named, 0 when the keeper has
// ended and its ticket is gone, 64 for a ticket that a slotctl run holds.
func TestReleaseWithoutKeeper(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*acqTimeout)
	defer cancel()
	holder := e.start(ctx, "holder", "run", "--limit", "r", "--", "sh", "-c", `echo $SLOTCTL_TICKET > ticket; exec sleep 1000`)
	held := strings.TrimSpace(readFile(t, waitFile(t, e.path("ticket"))))
	gone := "0123456789abcdef0123456789abcdef"
	private := e.path("private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	// A keeper's socket is asked only in a directory of this user's that
	// nobody else can open (anyone could listen in another), and not
	// through a symbolic link.
	openDir := e.path("open")
	if err := os.Mkdir(openDir, 0o700); err != nil || os.Chmod(openDir, 0o755) != nil {
		t.Fatal(err)
	}
	link := e.path("link")
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
		code int
		line string
	}{
		{"nothing", nil, exitUsage, "no TICKET given and no keeper to ask: SLOTCTL_KEEPER is not set"},
		{"ended", []string{keeperVar + "=" + filepath.Join(private, keeperSocket), proc.TicketVar + "=" + gone}, 0, "has ended and ticket 01234567 is gone: already released"},
		{"no-dir", []string{keeperVar + "=" + e.path("gone/keeper.sock"), proc.TicketVar + "=" + gone}, 0, "already released"},
		{"run's", []string{proc.TicketVar + "=" + held}, exitUsage, "and SLOTCTL_KEEPER is not set: no keeper of slotctl acquire to ask"},
		{"open-dir", []string{keeperVar + "=" + filepath.Join(openDir, keeperSocket), proc.TicketVar + "=" + held}, exitUsage, "mode 0755, want 0700"},
		{"linked-dir", []string{keeperVar + "=" + filepath.Join(link, keeperSocket), proc.TicketVar + "=" + held}, exitUsage, "not a directory"},
	} {
		p := e.startWith(ctx, "release-"+c.name, c.env, "release")
		code := p.wait(t, acqTimeout)
		stderr := p.stderr()
		if code != c.code || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.line) {
			t.Errorf("%s: release exited %d, want %d, with one line saying %q; stderr:\n%s", c.name, code, c.code, c.line, stderr)
		}
	}
	if tickets := acqTickets(t, e); len(tickets) != 1 || tickets[0].ID != held {
		t.Errorf("the run's ticket is not held as before: %+v", tickets)
	}
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	holder.wait(t, acqTimeout)
}

// waitFile waits for path to hold a whole line and returns it.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	ptWaitFor(t, filepath.Base(path), acqTimeout, func() bool {
		b, err := os.ReadFile(path)
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	return path
}

// TestAcquireBusy: an acquire not admitted exits as run would, with run's
// message and nothing on stdout, and leaves nothing behind: no process,
// no ticket of its own, no keeper directory.
func TestAcquireBusy(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*acqTimeout)
	defer cancel()
	holder := e.start(ctx, "holder", "run", "--limit", "x", "--", "sh", "-c", `echo $$ > pid; exec sleep 1000`)
	e.notePid(int(ptWaitInt(t, e.path("pid"), acqTimeout)))
	_, runMsg := acqRun(ctx, t, e, "run-busy", "x", "--no-wait")
	for _, c := range []struct {
		name  string
		flags []string
		code  int
		want  string
	}{
		{"no-wait", []string{"--no-wait"}, exitBusy, runMsg},
		{"exit-code", []string{"--no-wait", "--busy-exit-code", "0"}, 0, runMsg},
		{"wait", []string{"--wait", "1s"}, exitBusy, `slotctl: limit "x": not admitted within --wait (1/1 held)` + "\n"},
	} {
		sc := testguard.Test(t)
		p := acqStart(ctx, e, sc, "acquire-"+c.name, nil, append([]string{"acquire", "--limit", "x"}, c.flags...)...)
		code := p.wait(t, acqTimeout)
		// run says once that it waits, off a terminal: then its verdict.
		if code != c.code || !strings.HasSuffix(p.stderr(), c.want) || strings.Count(p.stderr(), "\n") > 2 {
			t.Errorf("%s: acquire exited %d, want %d; stderr:\n%s\nwant:\n%s", c.name, code, c.code, p.stderr(), c.want)
		}
		if out := readFile(t, e.path(p.name+".stdout")); out != "" {
			t.Errorf("%s: acquire printed %q", c.name, out)
		}
		if left := sc.Running(); len(left) != 0 {
			t.Errorf("%s: processes left: %v", c.name, left)
		}
	}
	if dirs := acqKeeperDirs(t, e); len(dirs) != 0 {
		t.Errorf("keeper directories left: %q", dirs)
	}
	if tickets := acqTickets(t, e); len(tickets) != 1 || tickets[0].Pid != holder.cmd.Process.Pid {
		t.Errorf("tickets: %+v; want the holder's alone", tickets)
	}
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	holder.wait(t, acqTimeout)
}

// TestAcquireOptions: acquire hands its run the flags it was given (not
// those of the config or the environment, which run reads itself), with
// --max-hold always, and records its own command line for ls.
func TestAcquireOptions(t *testing.T) {
	f, _, errOut := flagsFactory(t)
	var got any
	args := []string{"acquire", "-q", "--ttl", "1m", "--key", "prod", "-l", "deploy", "--limit", "db", "--no-wait", "--env-file", "x.env", "--bind-pid", strconv.Itoa(os.Getpid())}
	if code := mainWith(context.Background(), args, f, stubRunFs(&got)); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	o := got.(*AcquireOptions)
	wantRun := []string{"--key=prod", "--limit=deploy", "--limit=db", "--no-wait=true", "--quiet=true", "--ttl=1m0s", "--max-hold=1h0m0s"}
	if !reflect.DeepEqual(o.RunArgs, wantRun) {
		t.Errorf("run's flags %q, want %q", o.RunArgs, wantRun)
	}
	wantShown := []string{"slotctl", "acquire", "--limit=deploy", "--limit=db", "--bind-pid=" + strconv.Itoa(os.Getpid()), "--env-file=x.env", "--key=prod", "--no-wait=true", "--ttl=1m0s"}
	if !reflect.DeepEqual(o.Shown, wantShown) {
		t.Errorf("shown %q, want %q", o.Shown, wantShown)
	}
	if o.BindPid != os.Getpid() || o.EnvFile != "x.env" || !slices.Equal(o.Run.Limits, []string{"deploy", "db"}) {
		t.Errorf("options %+v", o)
	}
	if got := shownArgv(append([]string{"/usr/bin/slotctl", keeperCmdName, "--dir", "/tmp/d", "--"}, wantShown...)); !slices.Equal(got, wantShown) {
		t.Errorf("shownArgv of the keeper's command: %q", got)
	}
}

// TestAcquireStoppedWhileWaiting: an acquire interrupted while it waits
// leaves the queue as run does (SIGINT: exit 130); one SIGKILLed leaves a
// run that is admitted later, but its keeper, finding nobody to tell, lets
// go at once: the slot is not held for --max-hold by a ticket nobody knows.
func TestAcquireStoppedWhileWaiting(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*acqTimeout)
	defer cancel()
	holder := e.start(ctx, "holder", "run", "--limit", "w", "--", "sh", "-c", `echo $$ > pid; exec sleep 1000`)
	e.notePid(int(ptWaitInt(t, e.path("pid"), acqTimeout)))
	waiting := func(n int) func() bool {
		return func() bool {
			w := 0
			for _, x := range acqTickets(t, e) {
				if x.State == "waiting" {
					w++
				}
			}
			return w == n
		}
	}

	sc := testguard.Test(t)
	p := acqStart(ctx, e, sc, "acquire-int", nil, "acquire", "--limit", "w")
	ptWaitFor(t, "acquire's waiting ticket", acqTimeout, waiting(1))
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	if code := p.wait(t, acqTimeout); code != 128+int(syscall.SIGINT) || !strings.Contains(p.stderr(), "left the queue") {
		t.Errorf("interrupted acquire exited %d, want %d, saying it left the queue; stderr:\n%s", code, 128+int(syscall.SIGINT), p.stderr())
	}
	acqNoneLeft(t, sc, "after SIGINT")
	if !waiting(0)() {
		t.Errorf("a waiting ticket is left after SIGINT: %+v", acqTickets(t, e))
	}

	sc = testguard.Test(t)
	p = acqStart(ctx, e, sc, "acquire-kill", nil, "acquire", "--limit", "w")
	ptWaitFor(t, "acquire's waiting ticket", acqTimeout, waiting(1))
	_ = p.cmd.Process.Kill()
	p.wait(t, acqTimeout)
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	holder.wait(t, acqTimeout)
	// The orphaned run is admitted, its keeper lets go, it releases.
	acqNoneLeft(t, sc, "after acquire was killed and its run admitted")
	if code, stderr := acqRun(ctx, t, e, "next", "w", "--no-wait"); code != 0 {
		t.Errorf("the next run exited %d, want 0; stderr:\n%s", code, stderr)
	}
	if dirs := acqKeeperDirs(t, e); len(dirs) != 1 {
		t.Errorf("keeper directories: %q; want the killed acquire's (no acquire or release has swept it since)", dirs)
	}
}

// TestAcquireKeepsNoDescriptor: acquire's standard output and a pipe it
// inherited at fd 3 both read EOF once acquire has exited — the keeper
// holds neither open (eval "$(slotctl acquire ...)" returns; a CI runner
// waiting on its step's pipes is not kept waiting).
func TestAcquireKeepsNoDescriptor(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*acqTimeout)
	defer cancel()
	sc := testguard.Test(t)
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	extraR, extraW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, e.bin, "acquire", "--limit", "fd")
	cmd.Dir, cmd.Env = e.dir, append(append([]string(nil), e.env...), sc.Env())
	cmd.Stdout, cmd.ExtraFiles = outW, []*os.File{extraW}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	outW.Close()
	extraW.Close()
	eof := func(name string, r *os.File) []byte {
		done := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(r)
			done <- b
		}()
		select {
		case b := <-done:
			return b
		case <-time.After(acqTimeout):
			t.Fatalf("%s: no EOF %s after acquire started: a process still holds it; running: %v", name, acqTimeout, sc.Running())
			return nil
		}
	}
	out := eof("stdout", outR)
	eof("fd 3", extraR)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("acquire: %v; stdout:\n%s", err, out)
	}
	rel := e.startWith(ctx, "release", acqEnv(acqParse(t, string(out))), "release")
	if code := rel.wait(t, acqTimeout); code != 0 {
		t.Fatalf("release exited %d; stderr:\n%s", code, rel.stderr())
	}
	acqNoneLeft(t, sc, "after release")
}

// TestAcquireSweepsEndedKeepers: keepers that end otherwise than by
// release — the process they are bound to exits, the keeper is SIGKILLed,
// its slotctl run is SIGKILLed — leave their directories; the next acquire
// removes them, and the next release those that ended since. A live
// keeper's directory, one that records no process, and a symbolic link
// (and what it points to) are left.
func TestAcquireSweepsEndedKeepers(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("no process is proved gone here: nothing is swept")
	}
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*acqTimeout)
	defer cancel()
	base := filepath.Join(e.path("tmp"), "slotctl-"+strconv.Itoa(os.Getuid()))
	dirOf := func(vars [][2]string) string { return filepath.Base(filepath.Dir(acqGet(t, vars, keeperVar))) }
	keeperPid := func(sc testguard.Scope) int {
		for _, p := range sc.Running() {
			if f := strings.Fields(p.Argv); len(f) > 1 && f[1] == keeperCmdName {
				return p.Pid
			}
		}
		t.Fatalf("no keeper running in its scope: %v", sc.Running())
		return 0
	}
	kill := func(pid int) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}

	scBound := testguard.Test(t)
	sleep := exec.CommandContext(ctx, "sleep", "1000")
	sleep.Env = append(os.Environ(), scBound.Env())
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	e.notePid(sleep.Process.Pid)
	bound := dirOf(acqAcquire(ctx, t, e, scBound, "acquire-bound", nil, "--limit", "b", "--bind-pid", strconv.Itoa(sleep.Process.Pid)))
	scKeeper := testguard.Test(t)
	killedKeeper := dirOf(acqAcquire(ctx, t, e, scKeeper, "acquire-keeper", nil, "--limit", "k"))
	scRun := testguard.Test(t)
	runVars := acqAcquire(ctx, t, e, scRun, "acquire-run", nil, "--limit", "r", "--ttl", "2s")
	killedRun := dirOf(runVars)
	scLive := testguard.Test(t)
	liveVars := acqAcquire(ctx, t, e, scLive, "acquire-live", nil, "--limit", "l")
	live := dirOf(liveVars)

	// What records no process, and a link to a directory of a keeper that
	// has ended: neither is proved to be an ended keeper's directory.
	if err := os.Mkdir(filepath.Join(base, "acquire-unrecorded"), 0o700); err != nil {
		t.Fatal(err)
	}
	outside := e.path("outside")
	if err := os.Mkdir(outside, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(base, "acquire-link")); err != nil {
		t.Fatal(err)
	}

	_ = sleep.Process.Kill()
	_ = sleep.Wait()
	kill(keeperPid(scKeeper))
	m, err := proc.ParseMarker(acqGet(t, runVars, proc.SupervisorVar))
	if err != nil {
		t.Fatal(err)
	}
	kill(m.Pid)
	acqNoneLeft(t, scBound, "after the bound process exited")
	acqNoneLeft(t, scKeeper, "after the keeper was killed")
	acqNoneLeft(t, scRun, "after the keeper's run was killed")
	for _, d := range []string{bound, killedKeeper, killedRun} {
		acqWaitEnded(t, filepath.Join(base, d))
	}
	// The killed run's keeper left its files there too; keep one.
	for _, f := range []string{acquireID, keeperID, keeperLog} {
		if !ptExists(filepath.Join(base, killedRun, f)) {
			t.Errorf("%s: no %s left by the keeper whose run was killed", killedRun, f)
		}
	}
	if err := os.Rename(filepath.Join(base, killedRun, acquireID), filepath.Join(outside, acquireID)); err != nil {
		t.Fatal(err)
	}

	dirs := func() []string {
		entries, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	sorted := func(names ...string) []string { slices.Sort(names); return names }
	if got, want := dirs(), sorted(bound, killedKeeper, killedRun, live, "acquire-unrecorded", "acquire-link"); !slices.Equal(got, want) {
		t.Fatalf("before another acquire, %s holds %q, want %q", base, got, want)
	}

	scNext := testguard.Test(t)
	next := dirOf(acqAcquire(ctx, t, e, scNext, "acquire-next", nil, "--limit", "n"))
	if got, want := dirs(), sorted(live, next, "acquire-unrecorded", "acquire-link"); !slices.Equal(got, want) {
		t.Errorf("after another acquire, %s holds %q, want %q", base, got, want)
	}
	if !ptExists(filepath.Join(outside, acquireID)) {
		t.Errorf("the sweep removed a file through a symbolic link")
	}

	// The next keeper ends unreleased; the live one's release removes its
	// own directory and the next one's.
	kill(keeperPid(scNext))
	acqNoneLeft(t, scNext, "after the keeper was killed")
	acqWaitEnded(t, filepath.Join(base, next))
	rel := e.startWith(ctx, "release", acqEnv(liveVars), "release")
	if code := rel.wait(t, acqTimeout); code != 0 {
		t.Fatalf("release exited %d; stderr:\n%s", code, rel.stderr())
	}
	if got, want := dirs(), sorted("acquire-unrecorded", "acquire-link"); !slices.Equal(got, want) {
		t.Errorf("after release, %s holds %q, want %q", base, got, want)
	}
	acqNoneLeft(t, scLive, "after release")
}

// acqWaitEnded waits until the keeper's directory dir is one a sweep
// removes: its processes, gone from the scope, may still be exiting.
func acqWaitEnded(t *testing.T, dir string) {
	t.Helper()
	ptWaitFor(t, "the processes of "+dir+" to be provably gone", acqTimeout, func() bool {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		return keeperDirEnded(fd)
	})
}

// TestReleaseUsesTheKeepersStore: the keeper holds its ticket in one
// store; release without TICKET waits for it there, whatever store the
// releasing step names: another one (SLOTCTL_STORE, --store), one that
// cannot be opened, or none (only --keeper given). Each keeper's slotctl
// run and guard are stopped (SIGSTOP) before release asks the keeper: the
// ticket then stays in the keeper's store until its lease expires, and
// release says so — a release looking in another store would find no
// ticket and call it released at once.
func TestReleaseUsesTheKeepersStore(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*acqTimeout)
	defer cancel()
	keeperStore := e.path("keeper.db")
	other := e.path("slots.db") // e.env's SLOTCTL_STORE
	notDir := e.path("not-a-dir")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	type release struct {
		name string
		sc   testguard.Scope
		vars [][2]string
		env  []string
		args []string
	}
	// Every acquire before any run is stopped: nothing but the releases'
	// reads touches the keeper's store once they are.
	var releases []*release
	for _, name := range []string{"env", "flag", "unopenable", "none"} {
		r := &release{name: name, sc: testguard.Test(t), args: []string{"release"}}
		r.vars = acqAcquire(ctx, t, e, r.sc, "acquire-"+name, []string{"SLOTCTL_STORE=" + keeperStore}, "--limit", name, "--ttl", "2s")
		if got := acqGet(t, r.vars, storeExportedVar); !strings.HasSuffix(got, keeperStore) {
			t.Fatalf("%s=%q, want the keeper's store %s", storeExportedVar, got, keeperStore)
		}
		r.env = acqEnv(r.vars)
		switch name {
		case "env":
			r.env = append(r.env, "SLOTCTL_STORE="+other)
		case "flag":
			r.args = append(r.args, "--store", other)
		case "unopenable":
			r.env = append(r.env, "SLOTCTL_STORE="+filepath.Join(notDir, "slots.db"))
		case "none":
			r.env = []string{"SLOTCTL_STORE="}
			r.args = append(r.args, "--keeper", acqGet(t, r.vars, keeperVar))
		}
		releases = append(releases, r)
	}
	for _, r := range releases {
		acqStopRun(t, r.sc, keeperStore+".lock")
	}
	procs := make([]*ptProc, len(releases))
	for i, r := range releases { // they wait for the leases to expire side by side
		procs[i] = e.startWith(ctx, "release-"+r.name, r.env, r.args...)
	}
	for i, r := range releases {
		code := procs[i].wait(t, acqTimeout)
		id := acqGet(t, r.vars, proc.TicketVar)
		if want := "ticket " + short(id) + " (limit " + r.name + ") was not released by its keeper's slotctl run, but its lease has expired"; code != 0 || !strings.Contains(procs[i].stderr(), want) {
			t.Errorf("%s: release exited %d, want 0 saying %q; stderr:\n%s", r.name, code, want, procs[i].stderr())
		}
	}
	if tickets := acqTickets(t, e); len(tickets) != 0 {
		t.Errorf("the other store %s holds tickets: %+v", other, tickets)
	}
}

// acqStopRun stops (SIGSTOP) every process of a keeper's scope sc but the
// keeper itself — its slotctl run and guard: nothing renews or releases its
// ticket then. They are stopped at a moment when none of them holds the
// store's lock (lock), which would stop every other user of the store.
func acqStopRun(t *testing.T, sc testguard.Scope, lock string) {
	t.Helper()
	f, err := os.Open(lock)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ptWaitFor(t, "a moment when the keeper's run does not hold "+lock, acqTimeout, func() bool {
		var stopped []int
		for _, p := range sc.Running() {
			if f := strings.Fields(p.Argv); (len(f) < 2 || f[1] != keeperCmdName) && syscall.Kill(p.Pid, syscall.SIGSTOP) == nil {
				stopped = append(stopped, p.Pid)
			}
		}
		if len(stopped) == 0 {
			t.Fatalf("no process of the keeper's run to stop; running: %v", sc.Running())
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			return true
		}
		for _, pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		return false
	})
}
