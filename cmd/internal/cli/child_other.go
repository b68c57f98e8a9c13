//go:build !linux

package cli

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/slotctl/slotctl/gate/holder"
)

// startJob starts COMMAND in its own process group off a terminal. There is
// no guard and no parent-death signal here: the job is COMMAND's process
// group, and a SIGKILLed slotctl leaves it running (README).
func startJob(streams *IOStreams, path string, argv, env []string, extra []*os.File, fg bool, log *logger) (*child, error) {
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args, cmd.Env, cmd.ExtraFiles = argv, env, extra
	cmd.Stdin, cmd.Stdout, cmd.Stderr = streams.In, streams.Out, streams.ErrOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: !fg}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited, gone := make(chan struct{}), make(chan struct{})
	c := &child{log: log, fg: fg, exited: exited, gone: gone}
	if !fg {
		c.pgid = cmd.Process.Pid
	}
	var werr error
	go func() {
		werr = cmd.Wait()
		close(exited)
		for c.pgid > 0 && groupAlive(c.pgid) {
			time.Sleep(20 * time.Millisecond)
		}
		close(gone)
	}()
	c.signal = func(s syscall.Signal) {
		if c.pgid > 0 {
			_ = syscall.Kill(-c.pgid, s)
			return
		}
		_ = cmd.Process.Signal(s)
	}
	c.exit = func() (holder.Exit, error) {
		st := cmd.ProcessState
		if st == nil {
			if werr == nil {
				werr = errors.New("child status unknown")
			}
			return holder.Exit{}, werr
		}
		return exitOf(st.Sys().(syscall.WaitStatus)), nil
	}
	c.close = func() {}
	return c, nil
}

// groupAlive reports whether any process is left in process group pgid.
// EPERM means one is, owned by someone else.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// An earlyGuard is nothing here: there is no guard to start early.
type earlyGuard struct{}

func startEarlyGuard(*Factory, []string) *earlyGuard { return nil }

type preparedJob struct{}

func (*earlyGuard) take() *preparedJob { return nil }
func (*earlyGuard) drop()              {}

func (*preparedJob) foreground() bool { return false }
func (*preparedJob) abort()           {}

func (*preparedJob) start(string, []string, []string, *logger) (*child, error) {
	return nil, errors.New("no guard on this platform")
}

var errGuardNotStarted = errors.New("no guard on this platform")
