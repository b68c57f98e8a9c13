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

// child is the running COMMAND: the real holder.Child.
type child struct {
	cmd  *exec.Cmd
	log  *logger
	pgid int  // its own process group, 0 when it shares slotctl's (terminal foreground)
	fg   bool // shares slotctl's process group on a terminal
	err  error
	// exited is closed once the child has been waited for.
	exited chan struct{}
}

var _ holder.Child = (*child)(nil)

// startChild starts COMMAND with env added to slotctl's environment
// (childEnv: never the credentials; nil env: a nested run's, as it is). On a
// terminal in the foreground it stays in slotctl's process group so that
// Ctrl-C and job control behave as without slotctl; otherwise it leads its
// own group so that a stop reaches the whole job. On Linux it dies with
// slotctl (parent-death signal).
func startChild(f *Factory, path string, argv, env []string, log *logger) (*child, error) {
	return startChildFiles(f, path, argv, env, log, nil)
}

// startChildFiles is startChild with extra descriptors for the child, at
// 3 and up (the jobserver's pipe).
func startChildFiles(f *Factory, path string, argv, env []string, log *logger, extra []*os.File) (*child, error) {
	cmd := exec.Command(path, argv[1:]...)
	cmd.ExtraFiles = extra
	cmd.Args = argv
	cmd.Stdin, cmd.Stdout, cmd.Stderr = f.IO.In, f.IO.Out, f.IO.ErrOut
	environ := os.Environ
	if f.Environ != nil {
		environ = f.Environ
	}
	cmd.Env = childEnv(environ(), env)
	fg := f.IO.InTTY && foregroundTTY()
	cmd.SysProcAttr = childAttr(!fg)
	becomeSubreaper()
	if err := cmd.Start(); err != nil {
		return nil, startError(argv[0], err)
	}
	c := &child{cmd: cmd, log: log, fg: fg, exited: make(chan struct{})}
	if !fg {
		c.pgid = cmd.Process.Pid
	}
	go func() {
		c.err = cmd.Wait()
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

// Exited implements holder.Child.
func (c *child) Exited() <-chan struct{} { return c.exited }

// Foreground implements holder.Child.
func (c *child) Foreground() bool { return c.fg }

// Signal sends s to the child's whole process group, or to the child alone
// when it shares slotctl's group.
func (c *child) Signal(s syscall.Signal) {
	if c.pgid > 0 {
		_ = syscall.Kill(-c.pgid, s)
		return
	}
	_ = c.cmd.Process.Signal(s)
}

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
func (c *child) Exit() (holder.Exit, error) {
	st := c.cmd.ProcessState
	if st == nil {
		if c.err == nil {
			c.err = errors.New("child status unknown")
		}
		return holder.Exit{}, c.err
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return holder.Exit{Signal: ws.Signal()}, nil
	}
	return holder.Exit{Code: st.ExitCode()}, nil
}

// Drain waits for what the child left in its process group: asked to stop
// with SIGTERM, then SIGKILL after killAfter. The slot is only released
// once the whole job is gone.
func (c *child) Drain(killAfter time.Duration) {
	if reapOrphans(); c.pgid <= 0 || !groupAlive(c.pgid) {
		return
	}
	c.log.verbose("process group %d outlived its leader: stopping it", c.pgid)
	_ = syscall.Kill(-c.pgid, syscall.SIGTERM)
	deadline := time.Now().Add(killAfter)
	killed := false
	for reapOrphans(); groupAlive(c.pgid); reapOrphans() {
		if !killed && time.Now().After(deadline) {
			_ = syscall.Kill(-c.pgid, syscall.SIGKILL)
			killed = true
			deadline = time.Now().Add(time.Second) // zombies await their reaper; do not wait for ever
		} else if killed && time.Now().After(deadline) {
			c.log.warn("process group %d did not go away after SIGKILL", c.pgid)
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
