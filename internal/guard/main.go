//go:build linux

package guard

import (
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Main runs this process as a guard when it was started as one (argv[0]
// is Name) and never returns then; otherwise it returns at once. Every
// binary that starts jobs calls it first thing, tests' binaries too.
func Main() {
	if len(os.Args) != 3 || os.Args[0] != Name {
		return
	}
	os.Exit(run(os.Args[1:]))
}

// maxSpec bounds the command's path, arguments and environment, as the
// kernel bounds what exec takes.
const maxSpec = 16 << 20

// run is the guard: ARGS are NFILES OWNGROUP; descriptors 0 to NFILES-1
// are the command's, NFILES is the socket to the supervisor, which sends
// the command (the spec: "d" datagrams, then "go") once it may run: the
// guard starts before the job is admitted, and waits.
func run(args []string) int {
	nfiles, err := strconv.Atoi(args[0])
	if err != nil || nfiles < 3 || nfiles > 1024 {
		return 70
	}
	ownGroup := args[1] == "1"
	sock := nfiles
	syscall.CloseOnExec(sock)
	g := &guard{sock: sock, self: os.Getpid()}
	path, argv, env, ok := readSpec(sock)
	if !ok {
		return 0 // slotctl went away, or never admitted the job: nothing to guard
	}

	// The job's orphans become this process's children, whatever group or
	// session they moved to: the job is this process's descendants.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		g.send(msgErr, int(errnoOf(err)))
		return 70
	}
	// ps and top show the guard by its name, not as "exe".
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&[]byte(Name + "\x00")[0])), 0, 0, 0)
	// Signals are caught, not ignored: ignoring would pass on to the
	// command through exec. On a terminal they reach the guard with the
	// foreground group, and the job gets them itself. Off one, a signal
	// for the guard was meant for slotctl (a job that signals its $PPID):
	// it is passed on to slotctl, which passes it on to the job.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGUSR1, syscall.SIGUSR2)
	supervisor := os.Getppid()
	go func() {
		for s := range sigs {
			if ownGroup && s != syscall.SIGPIPE && os.Getppid() == supervisor {
				_ = unix.Kill(supervisor, s.(syscall.Signal))
			}
		}
	}()

	fds := make([]uintptr, nfiles)
	for i := range fds {
		fds[i] = uintptr(i)
	}
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Env:   env,
		Files: fds,
		// The command dies with the guard; the rest of the job is the
		// guard's to kill, or its subreaper's if the guard is killed.
		Sys: &syscall.SysProcAttr{Setpgid: ownGroup, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		g.send(msgErr, int(errnoOf(err)))
		return 127
	}
	for i := 3; i < nfiles; i++ {
		unix.Close(i) // the command's, not the guard's to keep open
	}
	g.child, g.pgid = pid, 0
	if ownGroup {
		g.pgid = pid
	}
	g.send(msgPid, pid)

	go g.commands()
	g.reap()
	return 0
}

// readSpec reads the command from the socket: its path, its argv and its
// environment, NUL-terminated strings after the argument count.
func readSpec(sock int) (path string, argv, env []string, ok bool) {
	var spec []byte
	buf := make([]byte, specChunk+1)
	for {
		n, err := unix.Read(sock, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return "", nil, nil, false
		}
		switch {
		case string(buf[:n]) == msgGo:
			return parseSpec(spec)
		case buf[0] == 'd' && len(spec)+n-1 <= maxSpec:
			spec = append(spec, buf[1:n]...)
		default:
			return "", nil, nil, false
		}
	}
}

func parseSpec(spec []byte) (path string, argv, env []string, ok bool) {
	f := strings.Split(string(spec), "\x00")
	if len(f) < 3 || f[len(f)-1] != "" {
		return "", nil, nil, false
	}
	f = f[:len(f)-1]
	argc, err := strconv.Atoi(f[1])
	if err != nil || argc < 1 || 2+argc > len(f) {
		return "", nil, nil, false
	}
	return f[0], f[2 : 2+argc], f[2+argc:], true
}

type guard struct {
	sock  int
	self  int
	child int
	pgid  int // the command's own group, 0 when it shares the guard's

	mu         sync.Mutex
	asked      bool        // slotctl has signalled the job
	termed     bool        // the guard has sent the job SIGTERM at the lease's end
	stop, kill *time.Timer // the lease's end, if slotctl said when
}

// parseLease reads "lease STOP KILL".
func parseLease(b []byte) (stop, kill time.Duration, ok bool) {
	f := strings.Fields(string(b))
	if len(f) != 3 || f[0] != msgLease {
		return 0, 0, false
	}
	s, err1 := strconv.ParseInt(f[1], 10, 64)
	k, err2 := strconv.ParseInt(f[2], 10, 64)
	return time.Duration(s), time.Duration(k), err1 == nil && err2 == nil
}

// lease sets the lease's end: the job is stopped at stop and killed at
// kill from now, unless a later lease moves them.
func (g *guard) lease(stop, kill time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stop != nil {
		g.stop.Stop()
		g.kill.Stop()
	}
	g.stop = time.AfterFunc(max(stop, 0), func() {
		g.mu.Lock()
		asked := g.asked
		g.termed = g.termed || !asked
		g.mu.Unlock()
		if !asked {
			g.signal(syscall.SIGTERM)
		}
	})
	g.kill = time.AfterFunc(max(kill, 0), func() {
		for range 200 { // until none is left: a process forked meanwhile
			if signalTree(g.self, syscall.SIGKILL) == 0 {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

func (g *guard) send(kind string, n int) {
	msg := kind
	if kind != msgGone {
		msg += " " + strconv.Itoa(n)
	}
	_, _ = unix.Write(g.sock, []byte(msg))
}

// reap waits for every process of the job, reports the command's exit and,
// when no process is left, that the job is gone.
func (g *guard) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			// No child is left, so no descendant: an orphan becomes this
			// process's child before its parent can be reaped.
			g.send(msgGone, 0)
			return
		case err != nil:
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if pid == g.child {
			if g.reapAll() {
				// Nothing else of the job ever ran, or it is all gone: one
				// message, so that slotctl sees the job end with its
				// command and releases at once.
				g.send(msgLast, int(ws))
				return
			}
			g.send(msgExit, int(ws))
		}
	}
}

// reapAll collects the children that have exited, and reports whether
// none is left.
func (g *guard) reapAll() bool {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.ECHILD):
			return true
		case err != nil, pid == 0:
			return false
		}
	}
}

// commands takes the supervisor's requests until it hangs up, which it
// does only by dying before the job is gone: then the whole job is killed,
// as nobody keeps its lease any more.
func (g *guard) commands() {
	buf := make([]byte, 64)
	for {
		n, err := unix.Read(g.sock, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			g.killAll()
			return
		}
		if stop, kill, ok := parseLease(buf[:n]); ok {
			g.lease(stop, kill)
			continue
		}
		kind, arg, perr := parse(buf[:n])
		if perr != nil || kind != msgSig || arg <= 0 || arg >= 65 {
			continue
		}
		g.mu.Lock()
		g.asked = true // slotctl stops the job itself: no SIGTERM of the guard's
		termed := g.termed
		g.mu.Unlock()
		if termed && syscall.Signal(arg) == syscall.SIGTERM {
			continue // the guard's own, at the lease's end: not twice
		}
		g.signal(syscall.Signal(arg))
	}
}

// signal sends sig to the command's group and to every descendant of the
// guard, in whatever group or session.
func (g *guard) signal(sig syscall.Signal) {
	if g.pgid > 0 {
		_ = unix.Kill(-g.pgid, sig)
	}
	signalTree(g.self, sig)
}

// killAll SIGKILLs every descendant until none is left; reap reports the
// job gone and the guard exits.
func (g *guard) killAll() {
	for {
		if signalTree(g.self, syscall.SIGKILL) == 0 {
			// Nothing left to signal; reap sees ECHILD once the zombies are
			// collected, and the process exits.
			time.Sleep(10 * time.Millisecond)
			if signalTree(g.self, syscall.SIGKILL) == 0 {
				os.Exit(0)
			}
		}
		time.Sleep(time.Millisecond)
	}
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EINVAL
}
