package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
)

// AcquireOptions are slotctl acquire's flags: slotctl run's, and where the
// job's variables go and what else ends the hold.
type AcquireOptions struct {
	Run       RunOptions
	EnvFile   string // --env-file: a dotenv file the variables are appended to
	BindPid   int    // --bind-pid: release when it exits; 0 for none
	bindStart uint64 // its start time, so that a reused pid is not taken for it
	// RunArgs are the flags given to acquire that its slotctl run takes,
	// as arguments; Shown is the command line ls shows for the ticket.
	RunArgs []string
	Shown   []string
}

// defaultAcquireMaxHold bounds a keeper's hold when --max-hold is not
// given: a pipeline that never reaches its release step frees the slot.
const defaultAcquireMaxHold = time.Hour

// acquireOnly are acquire's flags that its slotctl run does not take.
var acquireOnly = []string{"env-file", "bind-pid", "max-hold"}

func newAcquireCmd(f *Factory, g *globalOptions, runF func(*AcquireOptions) error) *cobra.Command {
	o := &AcquireOptions{}
	var noWait bool
	var wait string
	cmd := &cobra.Command{
		Use:         "acquire --limit NAME [--limit NAME...] [flags]",
		Short:       "Take a slot and hold it until slotctl release (a slot across CI steps)",
		Long:        acquireLong,
		Annotations: manPage(acquireManPage),
		Example:     acquireExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return errArgs(cmd, "acquire takes no COMMAND (%s): to hold a slot while one command runs, use slotctl run", quoteInput(args[0]))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.resolve(f, cmd, wait, noWait); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return runAcquire(cmd.Context(), f, g, o)
		},
	}
	addRunFlags(cmd, f, &o.Run, &wait, &noWait)
	fl := cmd.Flags()
	for _, name := range []string{"jobserver", "jobserver-style", "jobserver-max"} {
		_ = fl.MarkHidden(name)
	}
	o.Run.MaxHold = defaultAcquireMaxHold
	for name, usage := range map[string]string{
		"max-hold":   "release the slot after this long (0: no bound)",
		"on-lost":    "when the lease is lost: kill (end the keeper, exit 76 in its log) or continue (warn in its log)",
		"label":      "text ls shows instead of the acquire command line",
		"kill-after": "when the keeper is stopped, SIGKILL what is left of its job after this long",
		"ping":       "cron monitor URL told when the slot is taken and released, or that it was not (healthchecks.io, Cronitor)",
	} {
		fl.Lookup(name).Usage = usage
	}
	fl.Lookup("max-hold").DefValue = defaultAcquireMaxHold.String()
	fl.StringVar(&o.EnvFile, "env-file", "", "also append the variables to this dotenv `FILE` (GitLab: artifacts: reports: dotenv)")
	fl.IntVar(&o.BindPid, "bind-pid", 0, "release when the process `PID` exits (e.g. $$, the shell that acquires)")
	_ = cmd.RegisterFlagCompletionFunc("bind-pid", cobra.NoFileCompletions)
	return cmd
}

// acquireLong is slotctl acquire's help.
const acquireLong = `Wait for a slot of each --limit as slotctl run does, then leave a keeper
process holding it, print the job's variables (export SLOTCTL_TICKET=...,
one a line, for eval) and exit 0. A later slotctl release, with those variables
in its environment, lets the slot go. $GITHUB_ENV, when set, and
--env-file get the variables too. The keeper also lets go at --max-hold
(default 1h) or when the --bind-pid process exits.`

// acquireManPage is slotctl acquire's man page, after the help.
const acquireManPage = `Take a slot in one step of a pipeline and release it in a later one.

slotctl acquire takes slotctl run's flags and waits exactly as it does:
in arrival order, with the same --wait, --no-wait, --key, --supersede,
--replace, --max-waiting, --weight and --slots, the same messages and
the same exit status when it is not admitted. While it waits it shows
run's messages.

Once admitted, the slot is held by a keeper: a slotctl run, started in a
session of its own with its output in a log file, whose job is a small
slotctl process listening on a Unix socket. The keeper's lease is renewed
and judged like any run's, and its job is contained like any run's: if
the keeper's slotctl run dies, its job is killed and the slot comes back
within the --ttl. ls shows the ticket with this acquire command line.

acquire prints the variables a run's COMMAND gets, one "export
NAME=value" a line (values quoted for the shell where needed, so that
eval "$(slotctl acquire ...)" exports them to the commands after it): SLOTCTL_LIMIT, SLOTCTL_TICKET, SLOTCTL_FENCE, SLOTCTL_SLOT,
SLOTCTL_SLOTS, SLOTCTL_STORE (with SLOTCTL_STORE_EXPORTED and
SLOTCTL_STORE_BEFORE), SLOTCTL_SUPERVISOR, and SLOTCTL_KEEPER, the
keeper's socket. Standard output holds nothing else. When GITHUB_ENV is
set (GitHub Actions) they are appended to that file, and with --env-file
to that one too (GitLab: a dotenv report), unquoted.

slotctl release with no TICKET, run with those variables (or given
--keeper), asks the keeper to let go and waits until the ticket is gone
from the store. The keeper also lets go when --max-hold passes (default
1h; 0: no bound), when the process given by --bind-pid exits, and when
its slotctl run is stopped (a lost lease, --replace by a newer run).

The keeper's directory is slotctl-UID/acquire-* in $TMPDIR (else /tmp),
mode 0700: it holds the socket, the log of the keeper's slotctl run
(run.log) and which processes use it (acquire.id, keeper.id). release
removes it; a keeper that ended otherwise leaves it, with its log, until
the next acquire or release of the same user, which removes the
directories whose processes are all provably gone (pid and start time, on
this boot and pid namespace). The keeper obeys only processes of the same
user.

EXIT STATUS
  0    admitted: the keeper holds the slot, the variables are printed
  64   usage error: bad flag, bad limit name, --slots disagrees with the
       limit, --weight above a limit's size, no such --bind-pid process,
       an --env-file or GITHUB_ENV that cannot be opened
  69   the store cannot be opened or reached
  70   internal error
  75   not admitted within --wait, a --max-waiting queue was full, or a
       newer run of the --key superseded this one (--busy-exit-code
       changes it)
  128+N  acquire was stopped by signal N while it waited (it left the queue)

EXAMPLES
  # one deploy at a time per environment, across the steps of a job
  eval "$(slotctl acquire --limit deploy --key prod --wait 30m)"
  ./migrate && ./deploy
  slotctl release`

// acquireExample are slotctl acquire's examples.
const acquireExample = `  # GitHub Actions: in one step (the variables go to $GITHUB_ENV) ...
  slotctl acquire --limit deploy --wait 30m
  # ... and in a later one, with if: always()
  slotctl release

  # a shell session: the slot is let go when this shell exits
  eval "$(slotctl acquire --limit db --bind-pid $$)"`

// resolve checks acquire's flags: run's (but the jobserver's: there is no
// build to serve), --bind-pid and --env-file; and sets RunArgs and Shown.
func (o *AcquireOptions) resolve(f *Factory, cmd *cobra.Command, wait string, noWait bool) error {
	fl := cmd.Flags()
	for _, name := range []string{"jobserver", "jobserver-style", "jobserver-max"} {
		if fl.Changed(name) {
			return usageError("--%s: acquire runs no build to serve; use slotctl run --jobserver", name)
		}
	}
	o.Run.Argv = []string{"slotctl"}
	if err := o.Run.resolveFlags(f, cmd, wait, noWait); err != nil {
		return err
	}
	if fl.Changed("bind-pid") {
		if o.BindPid <= 0 {
			return usageError("--bind-pid %d: want the pid of a running process", o.BindPid)
		}
		start, err := bindPidStart(o.BindPid)
		if err != nil {
			return usageError("--bind-pid %d: no such process", o.BindPid)
		}
		o.bindStart = start
	}
	if fl.Changed("env-file") && o.EnvFile == "" {
		return usageError("--env-file '': want a file name")
	}
	o.RunArgs, o.Shown = nil, []string{"slotctl", "acquire"}
	fromConfig := func(name string) bool { return f.cfg != nil && f.cfg.Filled[name] }
	// The flags given, as run takes them; what the config file or the
	// environment set, run reads from them itself.
	fl.Visit(func(fl *pflag.Flag) {
		if !contains(acquireOnly, fl.Name) && !fromConfig(fl.Name) {
			o.RunArgs = append(o.RunArgs, flagArgs(fl)...)
		}
	})
	o.RunArgs = append(o.RunArgs, "--max-hold="+o.Run.MaxHold.String())
	// LocalFlags is a set of its own, which records no flag as set: ask
	// each flag. The limits first, as an operator would write them.
	var rest []string
	cmd.LocalFlags().VisitAll(func(fl *pflag.Flag) {
		switch {
		case !fl.Changed || fromConfig(fl.Name):
		case fl.Name == "limit":
			o.Shown = append(o.Shown, flagArgs(fl)...)
		default:
			rest = append(rest, flagArgs(fl)...)
		}
	})
	o.Shown = append(o.Shown, rest...)
	return nil
}

// flagArgs is a flag given on the command line as arguments that set it
// again: --name=value, once for each value of a repeated flag.
func flagArgs(fl *pflag.Flag) []string {
	if sv, ok := fl.Value.(pflag.SliceValue); ok {
		var args []string
		for _, v := range sv.GetSlice() {
			args = append(args, "--"+fl.Name+"="+v)
		}
		return args
	}
	return []string{"--" + fl.Name + "=" + fl.Value.String()}
}

// runAcquire is slotctl acquire: start the keeper's slotctl run, relay its
// messages while it waits, and once the keeper holds the slot print the
// variables it tells and exit; if run ends first, end as it did.
func runAcquire(ctx context.Context, f *Factory, g *globalOptions, o *AcquireOptions) error {
	log := newLogger(f, g)
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find slotctl's own executable: %w", err)
	}
	// The files the variables go to, opened before the wait: a bad path
	// is said before the slot is taken.
	outs, err := openEnvFiles(f, o)
	if err != nil {
		return err
	}
	defer func() {
		for _, w := range outs {
			w.f.Close()
		}
	}()
	k, err := prepareKeeper(f)
	if err != nil {
		return err
	}
	defer k.close()

	run, err := startKeeperRun(f, o, self, k)
	if err != nil {
		return err
	}
	recordAcquire(k.dir, run.Process.Pid)
	exited := make(chan struct{})
	go func() {
		_ = run.Wait()
		close(exited)
	}()
	vars := make(chan keeperVarsResult, 1)
	go func() { vars <- readKeeperVars(k.ready) }()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	relay := func() { _, _ = io.Copy(f.IO.ErrOut, k.logR) }
	stopped := false
	for {
		select {
		case <-tick.C:
			relay()
		case s := <-sigs:
			// run leaves the queue, or stops the keeper, and exits:
			// acquire ends as it does.
			_ = run.Process.Signal(s)
			stopped = true
		case r := <-vars:
			if stopped {
				vars = nil // the keeper is being stopped; run's exit follows
				continue
			}
			relay()
			if r.err != nil {
				_ = run.Process.Signal(syscall.SIGTERM)
				<-exited
				relay()
				return fmt.Errorf("keeper: %w", r.err)
			}
			k.keep = true
			return publishVars(f, log, o, outs, r.vars, k.dir)
		case <-exited:
			relay()
			return runEnded(run.ProcessState)
		}
	}
}

// startKeeperRun starts the keeper's slotctl run: the flags acquire was
// given, and the keeper (self's hidden command) as its job.
func startKeeperRun(f *Factory, o *AcquireOptions, self string, k *keeperDir) (*exec.Cmd, error) {
	args := append([]string{"run"}, o.RunArgs...)
	args = append(args, "--", self, keeperCmdName, "--dir", k.dir)
	if o.BindPid > 0 {
		args = append(args, "--bind-pid", fmt.Sprintf("%d:%d", o.BindPid, o.bindStart))
	}
	args = append(append(args, "--"), o.Shown...)
	run := exec.Command(self, args...)
	run.Env = factoryEnviron(f)
	// Its own session, stdin from /dev/null, its output to the log: the
	// keeper outlives acquire and keeps no descriptor of acquire's (a CI
	// runner waits for its step's pipes to close).
	run.Stdin, run.Stdout, run.Stderr = nil, k.logW, k.logW
	run.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// Nor any descriptor acquire was given beyond its three streams (a
	// runner's pipe would stay open for as long as the keeper runs).
	closeInheritedOnExec()
	if err := run.Start(); err != nil {
		return nil, fmt.Errorf("start slotctl run for the keeper: %w", err)
	}
	k.logW.Close()
	return run, nil
}

// recordAcquire records in the keeper's directory that this acquire and
// its slotctl run, pid, use it: until both are gone (and the keeper, which
// records itself), no sweep removes it. Without the record the directory is
// only never swept.
func recordAcquire(dir string, pid int) {
	self, ok := proc.SelfMarker()
	start, err := proc.StartTime(pid) // acquire's child, not yet reaped: pid is still run's
	if !ok || err != nil {
		return
	}
	_ = writeKeeperID(dir, acquireID, []proc.Marker{self, {Pid: pid, Start: start, PidNS: self.PidNS}})
}

// runEnded is acquire's end when its slotctl run ended before the keeper
// held the slot: run's status, its message already relayed.
func runEnded(ps *os.ProcessState) error {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return &ExitError{Code: 128 + int(ws.Signal()), Err: fmt.Errorf("the keeper's slotctl run was killed by %v before it held the slot", ws.Signal())}
	}
	// Its message is relayed; its status is acquire's, 0 included
	// (--busy-exit-code 0: not admitted, and nothing to release).
	return &ExitError{Code: ps.ExitCode()}
}

// factoryEnviron is the environment the factory gives commands.
func factoryEnviron(f *Factory) []string {
	if f.Environ != nil {
		return f.Environ()
	}
	return os.Environ()
}

// A keeperDir is the private directory of a keeper being started, with
// acquire's ends of its files. close removes it unless keep is set.
type keeperDir struct {
	dir   string
	ready *os.File // the FIFO, open for reading (and writing, so that it never reads EOF)
	logW  *os.File // run's output
	logR  *os.File // acquire's reader of it
	keep  bool
}

// prepareKeeper makes a keeper's directory, its FIFO and its log.
func prepareKeeper(f *Factory) (*keeperDir, error) {
	base, err := keeperBase(f)
	if err != nil {
		return nil, err
	}
	// A keeper that ended other than by release left its directory.
	sweepKeeperDirs(base)
	dir, err := os.MkdirTemp(base, keeperDirPrefix) // 0700
	if err != nil {
		return nil, fmt.Errorf("make the keeper's directory: %w", err)
	}
	k := &keeperDir{dir: dir}
	fail := func(err error) (*keeperDir, error) {
		k.close()
		return nil, err
	}
	fifo := filepath.Join(dir, keeperReady)
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return fail(fmt.Errorf("make %s: %w", fifo, err))
	}
	if k.ready, err = os.OpenFile(fifo, os.O_RDWR, 0); err != nil {
		return fail(err)
	}
	logPath := filepath.Join(dir, keeperLog)
	if k.logW, err = os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600); err != nil {
		return fail(err)
	}
	if k.logR, err = os.Open(logPath); err != nil {
		return fail(err)
	}
	return k, nil
}

func (k *keeperDir) close() {
	for _, c := range []*os.File{k.ready, k.logW, k.logR} {
		if c != nil {
			c.Close()
		}
	}
	if k.keep {
		// The keeper has the socket; the FIFO has served.
		_ = os.Remove(filepath.Join(k.dir, keeperReady))
		return
	}
	_ = os.RemoveAll(k.dir)
}

type keeperVarsResult struct {
	vars []string
	err  error
}

// readKeeperVars reads the keeper's variables from the FIFO: NAME=value
// lines up to an empty one, each a job variable with a value of printable
// characters.
func readKeeperVars(r io.Reader) keeperVarsResult {
	br := bufio.NewReader(io.LimitReader(r, 64<<10))
	var vars []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return keeperVarsResult{err: fmt.Errorf("reading its variables: %w", err)}
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			return keeperVarsResult{vars: vars}
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok || !contains(jobVarNames, name) && name != keeperVar || strings.ContainsFunc(value, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return keeperVarsResult{err: fmt.Errorf("unexpected variable %s", quoteInput(line))}
		}
		vars = append(vars, line)
	}
}

// envFile is a file the variables are appended to.
type envFile struct {
	name string // what to call it in a message
	f    *os.File
}

// openEnvFiles opens $GITHUB_ENV (when set) and --env-file for appending.
func openEnvFiles(f *Factory, o *AcquireOptions) ([]envFile, error) {
	var outs []envFile
	add := func(name, path string, flags int) error {
		w, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|flags, 0o600)
		if err != nil {
			for _, o := range outs {
				o.f.Close()
			}
			return usageError("%s %s: %v", name, quoteInput(path), unwrapPathError(err))
		}
		outs = append(outs, envFile{name: name + " " + path, f: w})
		return nil
	}
	if p := f.Getenv("GITHUB_ENV"); p != "" {
		if err := add("GITHUB_ENV", p, 0); err != nil { // the runner makes it
			return nil, err
		}
	}
	if o.EnvFile != "" {
		if err := add("--env-file", o.EnvFile, os.O_CREATE); err != nil {
			return nil, err
		}
	}
	return outs, nil
}

// publishVars prints the keeper's variables on stdout (export lines,
// quoted for the shell: eval "$(slotctl acquire ...)" hands them to the
// commands the shell runs after it, slotctl release among them) and
// appends them to the env files (NAME=value, as they are). If they cannot
// all be written, the keeper is told to let go: nobody would know of it.
func publishVars(f *Factory, log *logger, o *AcquireOptions, outs []envFile, vars []string, dir string) error {
	var quoted, plain strings.Builder
	sock := ""
	for _, kv := range vars {
		name, value, _ := strings.Cut(kv, "=")
		quoted.WriteString("export " + name + "=" + shellValue(value) + "\n")
		plain.WriteString(kv + "\n")
		if name == keeperVar {
			sock = value
		}
	}
	err := writeAll(f.IO.Out, "standard output", quoted.String())
	for _, w := range outs {
		if err == nil {
			err = writeAll(w.f, w.name, plain.String())
		}
	}
	if err != nil {
		if _, c, kerr := askKeeper(sock); kerr == nil {
			_, _ = io.Copy(io.Discard, c) // until the keeper has exited
			c.Close()
		}
		return err
	}
	ticket := ""
	for _, kv := range vars {
		if v, ok := strings.CutPrefix(kv, proc.TicketVar+"="); ok {
			ticket = v
		}
	}
	log.info("holding ticket %s of %s until slotctl release (or --max-hold %s); keeper's log: %s",
		short(ticket), limitsPhrase(o.Run.Limits), o.Run.MaxHold, filepath.Join(dir, keeperLog))
	return nil
}

func writeAll(w io.Writer, name, s string) error {
	if _, err := io.WriteString(w, s); err != nil {
		return fmt.Errorf("write the variables to %s: %w; the keeper let go", name, err)
	}
	if fl, ok := w.(*os.File); ok && name != "standard output" {
		if err := fl.Sync(); err != nil {
			return fmt.Errorf("write the variables to %s: %w; the keeper let go", name, err)
		}
	}
	return nil
}

// shellValue is v as a word of the shell: as it is when that is safe,
// else in single quotes.
func shellValue(v string) string {
	if v != "" && !strings.ContainsFunc(v, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_./:,=@%+-", r))
	}) {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}
