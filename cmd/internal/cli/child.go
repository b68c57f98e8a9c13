package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/internal/proc"
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

func signalNumber(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 0
}

// child is the running COMMAND: the real holder.Child. The platform's
// startJob fills in how it is followed and signalled.
type child struct {
	log    *logger
	pgid   int  // its own process group, 0 when it shares slotctl's (terminal foreground)
	fg     bool // shares slotctl's process group on a terminal
	exited <-chan struct{}
	gone   <-chan struct{}
	exit   func() (holder.Exit, error)
	signal func(syscall.Signal)
	close  func()
	lease  func(stopIn, killIn time.Duration)
}

var _ holder.Child = (*child)(nil)

// startChild starts COMMAND with env added to slotctl's environment
// (childEnv: never the credentials; nil env: a nested run's, as it is). On a
// terminal in the foreground it stays in slotctl's process group so that
// Ctrl-C and job control behave as without slotctl; otherwise it leads its
// own group. Either way the job is COMMAND and everything it starts.
func startChild(f *Factory, path string, argv, env []string, log *logger) (*child, error) {
	return startChildFiles(f, path, argv, env, log, nil)
}

// startChildFiles is startChild with extra descriptors for the child, at
// 3 and up (the jobserver's pipe).
func startChildFiles(f *Factory, path string, argv, env []string, log *logger, extra []*os.File) (*child, error) {
	fg := f.IO.InTTY && foregroundTTY()
	c, err := startJob(f.IO, path, argv, childEnv(f.environ(), env), extra, fg, log)
	if err != nil {
		return nil, startError(argv[0], err)
	}
	return c, nil
}

// startPrepared is startChild under a guard already started (earlyGuard).
// A guard that ended while it waited (killed while its run was next in
// line) was given nothing, and one started for the other side of the
// terminal's foreground is of no use: the command starts under a new one.
func startPrepared(f *Factory, pj *preparedJob, path string, argv, env []string, log *logger) (*child, error) {
	if pj.foreground() != (f.IO.InTTY && foregroundTTY()) {
		// The run was moved into or out of the terminal's foreground
		// while it waited: the job's group is chosen now.
		pj.abort()
		return startChild(f, path, argv, env, log)
	}
	c, err := pj.start(path, argv, childEnv(f.environ(), env), log)
	if errors.Is(err, errGuardNotStarted) {
		log.verbose("the guard started as this run queued has ended (%v): starting another", err)
		return startChild(f, path, argv, env, log)
	}
	if err != nil {
		return nil, startError(argv[0], err)
	}
	return c, nil
}

// environ is the environment slotctl runs in (Factory.Environ in tests).
func (f *Factory) environ() []string {
	if f.Environ != nil {
		return f.Environ()
	}
	return os.Environ()
}

func startError(name string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &ExitError{Code: exitNotFound, Err: fmt.Errorf("%s: %v", name, unwrapPathError(err))}
	default:
		return &ExitError{Code: exitCannotExec, Err: fmt.Errorf("%s: %v", name, unwrapPathError(err))}
	}
}

// Exited implements holder.Child.
func (c *child) Exited() <-chan struct{} { return c.exited }

// Gone implements holder.Child.
func (c *child) Gone() <-chan struct{} { return c.gone }

// Foreground implements holder.Child.
func (c *child) Foreground() bool { return c.fg }

// Signal implements holder.Child: the whole job.
func (c *child) Signal(s syscall.Signal) { c.signal(s) }

// Group implements holder.Child: the child's group, or slotctl's own (the
// terminal job's) when it shares it.
func (c *child) Group() (int, uint64, bool) {
	pgid := c.pgid
	if pgid == 0 {
		pgid = syscall.Getpgrp()
	}
	start, _ := proc.StartTime(pgid)
	return pgid, start, true
}

// Exit implements holder.Child.
func (c *child) Exit() (holder.Exit, error) { return c.exit() }

// Close implements holder.Child.
func (c *child) Close() { c.close() }

// Lease implements holder.Child: the guard stops the job by itself at the
// lease's end, should slotctl not be running then. Without a guard, nothing.
func (c *child) Lease(stopIn, killIn time.Duration) {
	if c.lease != nil {
		c.lease(stopIn, killIn)
	}
}

// exitOf is holder's Exit of a wait status.
func exitOf(ws syscall.WaitStatus) holder.Exit {
	if ws.Signaled() {
		return holder.Exit{Signal: ws.Signal()}
	}
	return holder.Exit{Code: ws.ExitStatus()}
}
