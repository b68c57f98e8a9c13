package cli

import (
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/internal/guard"
	"github.com/slotctl/slotctl/internal/proc"
)

// startJob starts COMMAND under a guard (internal/guard): the subreaper of
// everything COMMAND starts, which kills the whole job at once if slotctl
// dies, so a SIGKILLed slotctl leaves nothing of its job running.
func startJob(streams *IOStreams, path string, argv, env []string, extra []*os.File, fg bool, log *logger) (*child, error) {
	files, copied, err := jobFiles(streams)
	if err != nil {
		return nil, err
	}
	// The job's processes carry its ticket: by it, slotctl finds them
	// should the guard be killed on its own.
	mark := ""
	for _, kv := range env {
		if strings.HasPrefix(kv, proc.TicketVar+"=") {
			mark = kv
		}
	}
	j, err := guard.Start(guard.Config{Path: path, Args: argv, Env: env, Files: append(files.child, extra...), OwnGroup: !fg, Mark: mark, Exe: guardExe()})
	files.closeChild()
	if err != nil {
		files.abandon()
		return nil, err
	}
	c := &child{log: log, fg: fg, exited: j.Exited(), gone: j.Gone(), signal: j.Signal}
	if !fg {
		c.pgid = j.Pid()
	}
	c.exit = func() (holder.Exit, error) { return exitOf(j.Status()), nil }
	c.close = func() {
		if err := j.Err(); err != nil {
			log.warn("the guard of %s ended before the job did (%v): processes of the job may be left", argv[0], err)
		}
		reapOrphans()
		copied()
	}
	return c, nil
}

// reapOrphans collects every exited orphan. Only called after the guard
// has been waited for, so it cannot steal the guard's status.
func reapOrphans() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// guardExe is slotctl-guard beside this executable (the packages install
// it there): it links nothing but the guard, so it starts in about a
// millisecond where slotctl takes several. "" when there is none: slotctl
// then starts itself as the guard. Never looked up on PATH.
var guardExe = sync.OnceValue(func() string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		self = resolved
	}
	path := filepath.Join(filepath.Dir(self), guard.Name)
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return ""
	}
	return path
})
