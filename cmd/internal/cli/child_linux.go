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
	pj, err := prepareJob(streams, env, extra, fg)
	if err != nil {
		return nil, err
	}
	return pj.start(path, argv, env, log)
}

// A preparedJob is a started guard, with the descriptors it will give the
// command.
type preparedJob struct {
	files  *jobStreams
	copied func()
	p      *guard.Pending
	fg     bool
}

// prepareJob starts a guard for a command to come; env is the guard's own.
func prepareJob(streams *IOStreams, env []string, extra []*os.File, fg bool) (*preparedJob, error) {
	files, copied, err := jobFiles(streams)
	if err != nil {
		return nil, err
	}
	p, err := guard.Prepare(guard.Config{Env: env, Files: append(files.child, extra...), OwnGroup: !fg, Exe: guardExe()})
	files.closeChild()
	if err != nil {
		files.abandon()
		return nil, err
	}
	return &preparedJob{files: files, copied: copied, p: p, fg: fg}, nil
}

// start runs COMMAND under the prepared guard.
func (pj *preparedJob) start(path string, argv, env []string, log *logger) (*child, error) {
	// The job's processes carry its ticket: by it, slotctl finds them
	// should the guard be killed on its own.
	mark := ""
	for _, kv := range env {
		if strings.HasPrefix(kv, proc.TicketVar+"=") {
			mark = kv
		}
	}
	j, err := pj.p.Start(path, argv, env, mark)
	if err != nil {
		pj.files.abandon()
		return nil, err
	}
	c := &child{log: log, fg: pj.fg, exited: j.Exited(), gone: j.Gone(), signal: j.Signal, lease: j.Lease}
	if !pj.fg {
		c.pgid = j.Pid()
	}
	c.exit = func() (holder.Exit, error) { return exitOf(j.Status()), nil }
	c.close = func() {
		if err := j.Err(); err != nil {
			log.warn("the guard of %s ended before the job did (%v): processes of the job may be left", argv[0], err)
		}
		reapOrphans()
		pj.copied()
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

// An earlyGuard is a guard started as the run enqueues: its process start
// then overlaps the store's write instead of following it, which is most of
// what an uncontended run costs above its own start. A run that waits
// keeps it only while it is next in line, where it shortens the handoff; one
// further back drops it (an idle process per waiter would cost the quiet of
// a long queue), and its job gets a guard started the usual way once
// admitted.
type earlyGuard struct {
	ready chan struct{}
	pj    *preparedJob
	once  sync.Once
}

// startEarlyGuard starts a guard for the run's job in the background. Its
// own environment carries the job's marks (the ticket and the supervisor)
// from the start, as a guard started at admission does.
func startEarlyGuard(f *Factory, marks []string) *earlyGuard {
	g := &earlyGuard{ready: make(chan struct{})}
	fg := f.IO.InTTY && foregroundTTY()
	env := childEnv(f.environ(), marks)
	go func() {
		defer close(g.ready)
		g.pj, _ = prepareJob(f.IO, env, nil, fg) // a guard that did not start is started again at admission
	}()
	return g
}

// take hands the guard over, once; nil when it could not be started or was
// dropped (the caller starts one the usual way).
func (g *earlyGuard) take() *preparedJob {
	if g == nil {
		return nil
	}
	var pj *preparedJob
	g.once.Do(func() {
		<-g.ready
		pj = g.pj
	})
	return pj
}

// drop ends the guard if nobody took it.
func (g *earlyGuard) drop() {
	if g == nil {
		return
	}
	g.once.Do(func() {
		<-g.ready
		if g.pj != nil {
			g.pj.abort()
		}
	})
}

// foreground is whether the guard was started to stay in slotctl's
// terminal foreground group.
func (pj *preparedJob) foreground() bool { return pj.fg }

// abort ends a prepared guard whose command will not come.
func (pj *preparedJob) abort() {
	pj.p.Abort()
	pj.files.abandon()
}

// errGuardNotStarted: a prepared guard ended before it had the command.
var errGuardNotStarted = guard.ErrNotStarted
