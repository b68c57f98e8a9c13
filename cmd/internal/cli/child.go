package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/slotctl/slotctl/renew"
)

// lookCommand resolves COMMAND like a shell would, with exit 127 when it is
// not found and 126 when it cannot be executed.
func lookCommand(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	if errors.Is(err, exec.ErrDot) {
		return "", &ExitError{Code: exitNotFound, Err: fmt.Errorf("%s: refusing to run a command found through a relative PATH entry; use ./%s", name, name)}
	}
	if strings.Contains(name, "/") {
		if st, serr := os.Stat(name); serr == nil {
			if st.IsDir() {
				return "", &ExitError{Code: exitCannotExec, Err: fmt.Errorf("%s: is a directory", name)}
			}
			return "", &ExitError{Code: exitCannotExec, Err: fmt.Errorf("%s: permission denied", name)}
		}
		return "", &ExitError{Code: exitNotFound, Err: fmt.Errorf("%s: no such file or directory", name)}
	}
	return "", &ExitError{Code: exitNotFound, Err: fmt.Errorf("%s: command not found", name)}
}

// signals are the ones slotctl run catches: forwarded to the child, or ending
// a wait. SIGCONT only makes the renewer check its deadline after a stop.
type signals struct {
	C chan os.Signal
}

var sigCont os.Signal = syscall.SIGCONT

var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

func notifySignals() *signals {
	s := &signals{C: make(chan os.Signal, 16)}
	signal.Notify(s.C, append(forwarded, sigCont)...)
	return s
}

func stopSignals(s *signals) { signal.Stop(s.C) }

// isTerminating: the signals whose default action ends a process.
func isTerminating(s os.Signal) bool {
	switch s {
	case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}

func signalNumber(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 0
}

// child is the running COMMAND.
type child struct {
	cmd  *exec.Cmd
	pgid int  // its own process group, 0 when it shares slotctl's (terminal foreground)
	fg   bool // shares slotctl's process group on a terminal
	done chan error
	// exited is closed once the child has been waited for.
	exited chan struct{}
}

// startChild starts COMMAND with env added to slotctl's environment
// (childEnv: never the credentials; nil env: a nested run's, as it is). On a
// terminal in the foreground it stays in slotctl's process group so that
// Ctrl-C and job control behave as without slotctl; otherwise it leads its
// own group so that a stop reaches the whole job. On Linux it dies with
// slotctl (parent-death signal).
func startChild(f *Factory, path string, argv, env []string) (*child, error) {
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args = argv
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = childEnv(os.Environ(), env)
	fg := foregroundTTY()
	cmd.SysProcAttr = childAttr(!fg)
	becomeSubreaper()
	if err := cmd.Start(); err != nil {
		return nil, startError(argv[0], err)
	}
	c := &child{cmd: cmd, fg: fg, done: make(chan error, 1), exited: make(chan struct{})}
	if !fg {
		c.pgid = cmd.Process.Pid
	}
	go func() {
		c.done <- cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func startError(name string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &ExitError{Code: exitNotFound, Err: fmt.Errorf("%s: %v", name, unwrapPathError(err))}
	default:
		return &ExitError{Code: exitCannotExec, Err: fmt.Errorf("%s: %v", name, unwrapPathError(err))}
	}
}

// signal sends s to the child's whole process group, or to the child alone
// when it shares slotctl's group.
func (c *child) signal(s syscall.Signal) {
	if c.pgid > 0 {
		_ = syscall.Kill(-c.pgid, s)
		return
	}
	_ = c.cmd.Process.Signal(s)
}

// result is how a supervised run ended.
type result struct {
	state *os.ProcessState // nil if the child did not run
	code  int              // if not 0, overrides the child's status (76, 124)
	err   error
}

// exitErr turns the result into Main's error: the child's status passes
// through, 128+N for a signal.
func (r result) exitErr() error {
	if r.err != nil {
		return r.err
	}
	if r.code != 0 {
		return &ExitError{Code: r.code}
	}
	if r.state == nil {
		return &ExitError{Code: exitInternal, Err: errors.New("child status unknown")}
	}
	if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return &ExitError{Code: 128 + int(ws.Signal())}
	}
	if code := r.state.ExitCode(); code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

// supervise waits for the child, forwarding signals, stopping it when the
// lease is lost (--on-lost kill) or --max-hold runs out, and escalating to
// SIGKILL after --kill-after. It returns only when the child and (if it has
// its own) its process group are gone: drain before release.
func (c *child) supervise(ctx context.Context, log *logger, sigs *signals, keeper *renew.Keeper, o *RunOptions) result {
	var res result
	var lost <-chan struct{}
	if keeper != nil {
		lost = keeper.Lost()
	}
	var maxHold <-chan time.Time
	if o.MaxHold > 0 {
		t := time.NewTimer(o.MaxHold)
		defer t.Stop()
		maxHold = t.C
	}
	var killTimer *time.Timer
	var killC <-chan time.Time
	stop := func(s syscall.Signal) {
		c.signal(s)
		if killTimer == nil {
			killTimer = time.NewTimer(o.KillAfter)
			killC = killTimer.C
		}
	}
	defer func() {
		if killTimer != nil {
			killTimer.Stop()
		}
	}()
	for {
		select {
		case err := <-c.done:
			res.state = c.cmd.ProcessState
			if res.state == nil {
				res.err = &ExitError{Code: exitInternal, Err: fmt.Errorf("wait for %s: %v", o.Argv[0], err)}
			}
			c.drainGroup(log, o.KillAfter)
			return res
		case s := <-sigs.C:
			if s == sigCont {
				if keeper != nil {
					keeper.Check()
				}
				continue
			}
			// A terminal sends Ctrl-C and Ctrl-\ to the whole foreground
			// group, the child included: do not deliver them twice.
			if c.fg && (s == syscall.SIGINT || s == syscall.SIGQUIT) {
				continue
			}
			if isTerminating(s) {
				stop(s.(syscall.Signal))
			} else {
				c.signal(s.(syscall.Signal))
			}
		case <-lost:
			lost = nil
			if o.OnLost == "kill" {
				log.warn("lease of limit %q lost (%v): stopping %s", o.Limit, keeper.Err(), o.Argv[0])
				res.code = exitLost
				stop(syscall.SIGTERM)
			} else {
				log.warn("LEASE LOST for limit %q (%v): %s keeps running without a slot (--on-lost continue)", o.Limit, keeper.Err(), o.Argv[0])
			}
		case <-maxHold:
			maxHold = nil
			log.warn("--max-hold %s ran out: stopping %s", o.MaxHold, o.Argv[0])
			if res.code == 0 {
				res.code = exitMaxHold
			}
			stop(syscall.SIGTERM)
		case <-killC:
			killC = nil
			log.warn("%s still running %s after being stopped: sending SIGKILL", o.Argv[0], o.KillAfter)
			c.signal(syscall.SIGKILL)
		case <-ctx.Done():
			stop(syscall.SIGTERM)
		}
	}
}

// drainGroup waits for what the child left in its process group: asked to
// stop with SIGTERM, then SIGKILL after killAfter. The slot is only released
// once the whole job is gone (LEASES rule 8).
func (c *child) drainGroup(log *logger, killAfter time.Duration) {
	if reapOrphans(); c.pgid <= 0 || !groupAlive(c.pgid) {
		return
	}
	log.verbose("process group %d outlived its leader: stopping it", c.pgid)
	_ = syscall.Kill(-c.pgid, syscall.SIGTERM)
	deadline := time.Now().Add(killAfter)
	killed := false
	for reapOrphans(); groupAlive(c.pgid); reapOrphans() {
		if !killed && time.Now().After(deadline) {
			_ = syscall.Kill(-c.pgid, syscall.SIGKILL)
			killed = true
			deadline = time.Now().Add(time.Second) // zombies await their reaper; do not wait for ever
		} else if killed && time.Now().After(deadline) {
			log.warn("process group %d did not go away after SIGKILL", c.pgid)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// groupAlive reports whether any process is left in process group pgid.
// EPERM means one is, owned by someone else.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
