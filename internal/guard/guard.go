//go:build linux

package guard

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Name is the guard's argv[0]: how Main knows it is one, and what ps shows.
const Name = "slotctl-guard"

// The messages on the guard's socket, one per datagram: from the guard
// "pid N" (the command started), "err ERRNO" (it could not be), "exit
// WAITSTATUS" (the command exited), "gone" (nothing of the job is left),
// "last WAITSTATUS" (both at once: the command exited, and nothing of the
// job is left); from the supervisor "sig N" (signal the whole job).
const (
	msgPid  = "pid"
	msgErr  = "err"
	msgExit = "exit"
	msgGone = "gone"
	msgLast = "last"
	msgSig  = "sig"
	msgGo   = "go" // the spec is complete: start the command
	// "lease STOP KILL": unless another lease comes first, SIGTERM the job
	// STOP ns from now and SIGKILL it KILL ns from now (Job.Lease).
	msgLease = "lease"
)

// A Config says what job to start and how.
type Config struct {
	Path string   // the command, resolved
	Args []string // its argv, argv[0] included
	Env  []string // its whole environment; of two NAME=, the later wins, as with os/exec
	// Files are the command's descriptors: 0, 1, 2 and any extra ones,
	// which it gets at 3 and up.
	Files []*os.File
	// OwnGroup: the command leads a process group of its own (off a
	// terminal). Otherwise it stays in the supervisor's, the terminal's
	// foreground group, so that job control works as without slotctl.
	OwnGroup bool
	// Exe is the guard's executable; empty means this one (/proc/self/exe).
	Exe string
	// Mark is a NAME=VALUE in Env that the job's processes inherit: should
	// the guard be killed on its own, its orphans come to this process (a
	// subreaper), and those below it that carry Mark are killed as the
	// job's. Empty: none are.
	Mark string
}

// A Job is a command started under a guard, as the supervisor sees it.
type Job struct {
	guard  *os.Process
	conn   *os.File
	pid    int
	mark   string
	exited chan struct{}
	gone   chan struct{}

	mu     sync.Mutex
	status syscall.WaitStatus
	err    error // why the guard stopped answering, if it did before "gone"
}

// Start starts the guard and, under it, the job's command. An error the
// command's exec returned (not found, not executable) comes back as the
// errno, so callers can tell 126 from 127.
//
// This process becomes a subreaper: should a guard be killed on its own,
// its orphans come here (Config.Mark).
func Start(cfg Config) (*Job, error) {
	p, err := Prepare(cfg)
	if err != nil {
		return nil, err
	}
	return p.Start(cfg.Path, cfg.Args, cfg.Env, cfg.Mark)
}

// A Pending guard is started and waits for its command, which may follow
// later (a guard started while its job waits for a slot).
type Pending struct {
	guard *os.Process
	conn  *os.File
}

// Prepare starts a guard for a command not yet known: cfg's Files,
// OwnGroup and Exe count, and its Env is the guard's own.
func Prepare(cfg Config) (*Pending, error) {
	exe := cfg.Exe
	if exe == "" {
		exe = "/proc/self/exe"
	}
	if len(cfg.Files) < 3 {
		return nil, errors.New("guard: the command needs stdin, stdout and stderr")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("guard: socketpair: %w", err)
	}
	// Non-blocking, so that the wait for the guard's first answer can have
	// a deadline.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("guard: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "guard")
	theirs := os.NewFile(uintptr(fds[1]), "guard")
	defer theirs.Close()
	// The guard gets the command's descriptors where the command will have
	// them, and its socket just after.
	files := append(append([]*os.File{}, cfg.Files...), theirs)
	own := "0"
	if cfg.OwnGroup {
		own = "1"
	}
	// The guard leads a group of its own off a terminal, so that a signal
	// to the supervisor's group (a cron daemon's, a CI runner's) does not
	// take it with the supervisor; on a terminal it must stay in the
	// foreground group for the command to be there.
	p, err := os.StartProcess(exe, []string{Name, strconv.Itoa(len(cfg.Files)), own}, &os.ProcAttr{
		Env:   cfg.Env,
		Files: files,
		Sys:   &syscall.SysProcAttr{Setpgid: cfg.OwnGroup},
	})
	if err != nil {
		mine.Close()
		return nil, fmt.Errorf("guard: start %s: %w", exe, err)
	}
	return &Pending{guard: p, conn: mine}, nil
}

// ErrNotStarted is a pending guard that ended before it was given its
// command: nothing of the command ran, and another guard may start it.
var ErrNotStarted = errors.New("the guard ended before it was given the command")

// StartWait bounds the wait for the guard to say it started the command:
// far longer than an exec takes on a loaded machine.
var StartWait = 30 * time.Second

// specChunk is the most of the spec one datagram carries.
const specChunk = 32 << 10

// Start has the guard start the command: path, its argv (argv[0]
// included), its whole environment (of two NAME=, the later wins) and the
// mark its processes carry (Config.Mark).
func (p *Pending) Start(path string, args, env []string, mark string) (*Job, error) {
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	if len(args) == 0 {
		p.Close()
		return nil, errors.New("guard: no argv[0]")
	}
	spec := []byte(path + "\x00" + strconv.Itoa(len(args)) + "\x00")
	for _, a := range append(append([]string{}, args...), dedupEnv(env)...) {
		if strings.IndexByte(a, 0) >= 0 {
			p.Close()
			return nil, fmt.Errorf("guard: %q holds a NUL byte", a)
		}
		spec = append(append(spec, a...), 0)
	}
	for len(spec) > 0 {
		n := min(len(spec), specChunk)
		if _, err := p.conn.Write(append([]byte{'d'}, spec[:n]...)); err != nil {
			p.Close()
			return nil, fmt.Errorf("guard: %w: %w", ErrNotStarted, err)
		}
		spec = spec[n:]
	}
	if _, err := p.conn.Write([]byte(msgGo)); err != nil {
		p.Close()
		return nil, fmt.Errorf("guard: %w: %w", ErrNotStarted, err)
	}
	j := &Job{guard: p.guard, conn: p.conn, mark: mark, exited: make(chan struct{}), gone: make(chan struct{})}
	// A guard that does not answer (stopped, or not one: another
	// version's) must not hold the slot for ever.
	_ = p.conn.SetReadDeadline(time.Now().Add(StartWait))
	kind, arg, err := j.read()
	_ = p.conn.SetReadDeadline(time.Time{})
	switch {
	case err != nil:
		j.abandon(err)
		return nil, fmt.Errorf("guard: %w", err)
	case kind == msgErr:
		j.abandon(nil)
		return nil, &os.PathError{Op: "exec", Path: path, Err: syscall.Errno(arg)}
	case kind != msgPid:
		j.abandon(nil)
		return nil, fmt.Errorf("guard: said %q before the command started", kind)
	}
	j.pid = arg
	go j.listen()
	return j, nil
}

// Close ends a guard whose command was never started: it exits as soon as
// its socket closes.
func (p *Pending) Close() {
	p.conn.Close()
	_, _ = p.guard.Wait()
}

// Pid is the pending guard's process id.
func (p *Pending) Pid() int { return p.guard.Pid }

// Abort ends a guard whose command was never started without waiting for
// it to notice: it may still be starting.
func (p *Pending) Abort() {
	p.conn.Close()
	_ = p.guard.Kill()
	_, _ = p.guard.Wait()
}

// abandon ends a guard that did not start the command.
func (j *Job) abandon(err error) {
	j.conn.Close()
	_ = j.guard.Kill()
	_, _ = j.guard.Wait()
}

// read takes one message: a kind and its number.
func (j *Job) read() (string, int, error) {
	buf := make([]byte, 64)
	n, err := j.conn.Read(buf)
	if errors.Is(err, syscall.ECONNRESET) {
		// The guard exited with a message of ours unread (a lease sent as
		// the job ended). The kernel reports that before the guard's last
		// messages, which are still queued: read on.
		n, err = j.conn.Read(buf)
	}
	if err != nil {
		return "", 0, fmt.Errorf("the guard stopped answering: %w", err)
	}
	kind, arg, err := parse(buf[:n])
	if err != nil {
		return "", 0, fmt.Errorf("the guard said %q: %w", buf[:n], err)
	}
	return kind, arg, nil
}

func parse(b []byte) (string, int, error) {
	s := string(b)
	if s == msgGone {
		return s, 0, nil
	}
	for _, k := range []string{msgPid, msgErr, msgExit, msgLast, msgSig} {
		if len(s) > len(k)+1 && s[:len(k)+1] == k+" " {
			n, err := strconv.Atoi(s[len(k)+1:])
			return k, n, err
		}
	}
	return "", 0, errors.New("unknown message")
}

// listen follows the guard until the job is gone: the command's exit, then
// the last of its processes. A guard that dies first (killed on its own)
// leaves the job's processes to this process, their subreaper (Start makes
// it one): they are killed, and the job is reported exited and gone, with
// the error.
func (j *Job) listen() {
	exited := false
	for {
		kind, arg, err := j.read()
		switch {
		case err != nil:
			ws := j.waitGuard()
			if j.mark != "" {
				killOrphans(j.mark)
			}
			j.mu.Lock()
			j.err = err
			if !exited {
				j.status = ws
				if ws.Exited() && ws.ExitStatus() == 0 {
					j.status = syscall.WaitStatus(syscall.SIGKILL)
				}
			}
			j.mu.Unlock()
			if !exited {
				close(j.exited)
			}
			close(j.gone)
			return
		case kind == msgExit && !exited:
			j.mu.Lock()
			j.status = syscall.WaitStatus(arg)
			j.mu.Unlock()
			exited = true
			close(j.exited)
		case kind == msgLast && !exited:
			// Gone before exited: whoever sees the command's exit finds
			// the job gone already.
			j.mu.Lock()
			j.status = syscall.WaitStatus(arg)
			j.mu.Unlock()
			j.waitGuard()
			close(j.gone)
			close(j.exited)
			return
		case kind == msgGone:
			if !exited {
				close(j.exited)
			}
			j.waitGuard()
			close(j.gone)
			return
		}
	}
}

func (j *Job) waitGuard() syscall.WaitStatus {
	j.conn.Close()
	st, err := j.guard.Wait()
	if err != nil || st == nil {
		return syscall.WaitStatus(syscall.SIGKILL)
	}
	return st.Sys().(syscall.WaitStatus)
}

// Pid is the command's pid.
func (j *Job) Pid() int { return j.pid }

// GuardPid is the guard's pid.
func (j *Job) GuardPid() int { return j.guard.Pid }

// Exited is closed once the command has exited.
func (j *Job) Exited() <-chan struct{} { return j.exited }

// Gone is closed once nothing of the job is left: the command and every
// process descended from it, in whatever group or session.
func (j *Job) Gone() <-chan struct{} { return j.gone }

// Status is the command's wait status, after Exited.
func (j *Job) Status() syscall.WaitStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.status
}

// Err says why the guard stopped answering before the job was gone, if it
// did: the job's processes may then be left (they are this process's).
func (j *Job) Err() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// Signal sends sig to the whole job: the command's process group and
// every process descended from the command. After Gone it does nothing.
func (j *Job) Signal(sig syscall.Signal) {
	select {
	case <-j.gone:
		return
	default:
	}
	_, _ = j.conn.Write([]byte(msgSig + " " + strconv.Itoa(int(sig))))
}

// dedupEnv keeps the last of each NAME=.
func dedupEnv(env []string) []string {
	last := make(map[string]int, len(env))
	for i, kv := range env {
		last[envName(kv)] = i
	}
	out := make([]string, 0, len(last))
	for i, kv := range env {
		if last[envName(kv)] == i {
			out = append(out, kv)
		}
	}
	return out
}

func envName(kv string) string {
	if i := strings.IndexByte(kv, '='); i >= 0 {
		return kv[:i]
	}
	return kv
}

// orphanWait bounds the killing of a lost guard's orphans.
const orphanWait = 2 * time.Second

// killOrphans SIGKILLs every process below this one that carries mark in
// its environment until none is left, or orphanWait has passed: the
// orphans of a guard that was killed. One that cleared its environment is
// not found (README, When things crash).
func killOrphans(mark string) {
	deadline := time.Now().Add(orphanWait)
	for signalTreeIf(os.Getpid(), syscall.SIGKILL, func(pid int) bool { return carries(pid, mark) }) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// Lease has the guard stop the job by itself — SIGTERM stopIn from now,
// SIGKILL killIn from now — unless another Lease comes first: the job of
// a supervisor that is stopped or hung past its lease does not run on.
// After a Signal of the supervisor's own the guard sends no SIGTERM of its
// own, only the SIGKILL; after its own, it passes on no SIGTERM of the
// supervisor's. After Gone it does nothing.
func (j *Job) Lease(stopIn, killIn time.Duration) {
	select {
	case <-j.gone:
		return
	default:
	}
	_, _ = j.conn.Write([]byte(msgLease + " " + strconv.FormatInt(int64(stopIn), 10) + " " + strconv.FormatInt(int64(killIn), 10)))
}
