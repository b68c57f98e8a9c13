package cli

// The keeper of slotctl acquire (docs/acquire.md): a job like any other,
// run by a real slotctl run, whose command is this hidden subcommand. It
// holds the ticket by running: it tells acquire the job's variables, then
// waits for a release request on its socket, for the process it is bound
// to to exit, or for a signal (slotctl run's --max-hold and lost lease stop
// it with SIGTERM), and exits 0; run then drains and releases as for any
// job, and if run dies the guard kills the keeper with the rest of the job.
//
// Its directory, made by acquire, is private (0700, this user's): it holds
// the socket, the FIFO the variables go through, run's log and the records
// of which processes use it (keeper_dir.go). A request
// is obeyed only from a process of the same user (SO_PEERCRED on Linux);
// nothing in the store authorises anything here.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/internal/proc"
)

// keeperCmdName is the hidden subcommand a keeper runs as.
const keeperCmdName = "__keeper"

// keeperVar names the keeper's socket in the job's variables.
const keeperVar = "SLOTCTL_KEEPER"

// The files of a keeper's directory.
const (
	keeperSocket = "keeper.sock"
	keeperReady  = "ready" // a FIFO: the keeper writes the job's variables, acquire reads them
	keeperLog    = "run.log"
)

// keeperOptions are the hidden subcommand's flags; its arguments are the
// acquire command line that ls shows (shownArgv).
type keeperOptions struct {
	Dir     string
	BindPid string // PID:START, "" for none
}

func newKeeperCmd(f *Factory) *cobra.Command {
	o := &keeperOptions{}
	cmd := &cobra.Command{
		Use:               keeperCmdName + " --dir DIR [--bind-pid PID:START] -- slotctl acquire ...",
		Short:             "Hold a ticket for slotctl acquire (started by it, under slotctl run)",
		Hidden:            true,
		PersistentPreRunE: noPreRun,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runKeeper(f, o)
		},
	}
	cmd.Flags().StringVar(&o.Dir, "dir", "", "the keeper's private directory")
	cmd.Flags().StringVar(&o.BindPid, "bind-pid", "", "release when the process PID:START exits")
	return cmd
}

// shownArgv is the command line a ticket records for a job run with argv:
// argv itself, but for a keeper the acquire command line it was given, so
// that ls shows what the operator typed.
func shownArgv(argv []string) []string {
	if len(argv) > 2 && argv[1] == keeperCmdName {
		for i, a := range argv {
			if a == "--" {
				return argv[i+1:]
			}
		}
	}
	return argv
}

// runKeeper is the keeper: listen, tell acquire, wait for the end.
func runKeeper(f *Factory, o *keeperOptions) error {
	log := &logger{w: f.IO.ErrOut}
	if f.Getenv(proc.TicketVar) == "" {
		return usageError("%s is slotctl acquire's keeper: it runs under slotctl run, which gives it %s", keeperCmdName, proc.TicketVar)
	}
	if err := checkPrivateDir(o.Dir); err != nil {
		return err
	}
	var bound <-chan struct{}
	if o.BindPid != "" {
		pid, start, err := parseBindPid(o.BindPid)
		if err != nil {
			return err
		}
		bound = watchPid(pid, start)
	}
	// Signals first: slotctl run stops its job with SIGTERM (--max-hold,
	// a lost lease, a replace) and forwards the others it gets.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)

	// Recorded before acquire is told and may exit: from then on this
	// record and acquire's (which names the run) keep a later acquire or
	// release from removing the directory while any of them runs
	// (keeper_dir.go).
	if self, ok := proc.SelfMarker(); ok {
		ms := []proc.Marker{self}
		if sup, err := proc.ParseMarker(f.Getenv(proc.SupervisorVar)); err == nil {
			ms = append(ms, sup)
		}
		if err := writeKeeperID(o.Dir, keeperID, ms); err != nil {
			log.warn("keeper: %v", err)
		}
	}
	sock := filepath.Join(o.Dir, keeperSocket)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("keeper: listen on %s: %w", sock, err)
	}
	defer ln.Close() // removes the socket
	requests := make(chan *net.UnixConn)
	go serveKeeper(ln, log, requests, os.Getuid())

	if err := tellAcquire(filepath.Join(o.Dir, keeperReady), keeperVars(f, sock)); err != nil {
		// acquire is gone (killed while it waited): nobody knows of this
		// ticket, so it goes at once rather than at --max-hold.
		log.warn("keeper: %v: releasing", err)
		return nil
	}
	select {
	case c := <-requests:
		// The answer names the ticket and its store, in which the
		// releaser sees it go once run has drained and released.
		reply, _ := json.Marshal(keeperReply{Ticket: f.Getenv(proc.TicketVar), Store: f.Getenv(storeVar)})
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write(append(reply, '\n'))
		// c stays open until this process exits: its end tells the
		// releaser that the keeper is gone.
		log.info("keeper: released on request")
	case <-bound:
		log.info("keeper: process %s exited: releasing", o.BindPid)
	case s := <-sigs:
		log.info("keeper: %v: releasing", s)
	}
	return nil
}

// keeperReply is a keeper's answer to a release request.
type keeperReply struct {
	Ticket string `json:"ticket"`
	Store  string `json:"store"`
}

// keeperVars are the job's variables as acquire prints them: those slotctl
// run gave the keeper, and the keeper's socket.
func keeperVars(f *Factory, sock string) []string {
	var vars []string
	for _, name := range jobVarNames {
		if v := f.Getenv(name); v != "" && name != keeperVar {
			vars = append(vars, name+"="+v)
		}
	}
	return append(vars, keeperVar+"="+sock)
}

// tellAcquire writes vars, one a line and an empty line after them, to
// acquire's FIFO. acquire holds it open for reading while it waits; when
// it does not (it died), the open fails at once (ENXIO) instead of
// blocking.
func tellAcquire(fifo string, vars []string) error {
	fd, err := syscall.Open(fifo, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("tell slotctl acquire: %w", err)
	}
	w := os.NewFile(uintptr(fd), fifo)
	defer w.Close()
	_, err = io.WriteString(w, strings.Join(vars, "\n")+"\n\n")
	if err != nil {
		return fmt.Errorf("tell slotctl acquire: %w", err)
	}
	return nil
}

// serveKeeper accepts connections: a "release" line from a process of
// user uid (this keeper's) goes to requests; a connection from another
// user is closed unanswered, anything else answered and dropped.
func serveKeeper(ln *net.UnixListener, log *logger, requests chan<- *net.UnixConn, uid int) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		if peer, err := peerUID(c); err != nil || peer != uid {
			log.warn("keeper: refused a connection from uid %d (%v): only uid %d may release", peer, err, uid)
			c.Close()
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(io.LimitReader(c, 64)).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "release" {
			_, _ = io.WriteString(c, "{\"error\":\"want release\"}\n")
			c.Close()
			continue
		}
		_ = c.SetReadDeadline(time.Time{})
		requests <- c
		return
	}
}

// errNoKeeper: nothing listens on the keeper's socket (it has ended).
var errNoKeeper = errors.New("no keeper listens there")

// askKeeper asks the keeper at sock to release and returns its answer and
// the connection, which closes when the keeper has exited. The socket's
// directory must be private to this user, and the process listening this
// user's.
func askKeeper(sock string) (keeperReply, *net.UnixConn, error) {
	return askKeeperOf(sock, os.Getuid())
}

// askKeeperOf is askKeeper for a keeper that must be user uid's.
func askKeeperOf(sock string, uid int) (keeperReply, *net.UnixConn, error) {
	if err := checkPrivateDir(filepath.Dir(sock)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return keeperReply{}, nil, errNoKeeper
		}
		return keeperReply{}, nil, err
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return keeperReply{}, nil, errNoKeeper
		}
		return keeperReply{}, nil, fmt.Errorf("keeper %s: %w", sock, err)
	}
	if peer, err := peerUID(c); err != nil || peer != uid {
		c.Close()
		return keeperReply{}, nil, fmt.Errorf("keeper %s: listened on by uid %d, not this user's %d (%v)", sock, peer, uid, err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "release\n"); err != nil {
		c.Close()
		return keeperReply{}, nil, fmt.Errorf("keeper %s: %w", sock, err)
	}
	line, err := bufio.NewReader(io.LimitReader(c, 4096)).ReadString('\n')
	var r keeperReply
	if err == nil {
		err = json.Unmarshal([]byte(line), &r)
	}
	if err == nil && checkTicketPrefix(r.Ticket) != nil {
		err = fmt.Errorf("answer names no ticket: %q", strings.TrimSpace(line))
	}
	if err != nil {
		c.Close()
		if errors.Is(err, io.EOF) {
			return keeperReply{}, nil, errNoKeeper // it ended as it was asked
		}
		return keeperReply{}, nil, fmt.Errorf("keeper %s: %w", sock, err)
	}
	_ = c.SetDeadline(time.Time{})
	return r, c, nil
}

// checkPrivateDir refuses a keeper directory that is not a directory of
// this user's that only this user can open: another user's socket there
// could be anyone's.
func checkPrivateDir(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) {
		return usageError("keeper directory %s: want an absolute path", quoteInput(dir))
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return usageError("keeper directory %s: not a directory (%s)", quoteInput(dir), fileType(st.Mode()))
	}
	if uid, ok := fileOwner(st); ok && uid != os.Getuid() {
		return usageError("keeper directory %s: owned by uid %d, not by this user (%d)", quoteInput(dir), uid, os.Getuid())
	}
	if st.Mode().Perm()&0o077 != 0 {
		return usageError("keeper directory %s: mode %04o, want 0700 (only its owner may open it)", quoteInput(dir), st.Mode().Perm())
	}
	return nil
}

// fileOwner is the uid owning the file st describes.
func fileOwner(st os.FileInfo) (int, bool) {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid), true
	}
	return 0, false
}

// keeperBase is the directory the keepers' directories are made in:
// slotctl-UID in $TMPDIR (else /tmp), made 0700 if missing and refused if
// it is not this user's own.
func keeperBase(f *Factory) (string, error) {
	base := keeperBasePath(f)
	tmp := filepath.Dir(base)
	if err := os.Mkdir(base, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", &ExitError{Code: exitUsage, Err: fmt.Errorf("make the keeper's directory in %s: %v", tmp, unwrapPathError(err)),
			Hint: "set TMPDIR to a directory of yours"}
	}
	if err := checkPrivateDir(base); err != nil {
		return "", &ExitError{Code: exitUsage, Err: fmt.Errorf("%v", err), Hint: "set TMPDIR to a directory of yours"}
	}
	return base, nil
}

// keeperBasePath is where keeperBase makes the keepers' directories.
func keeperBasePath(f *Factory) string {
	tmp := f.Getenv("TMPDIR")
	if tmp == "" || !filepath.IsAbs(tmp) {
		tmp = "/tmp"
	}
	return filepath.Join(tmp, "slotctl-"+strconv.Itoa(os.Getuid()))
}

// parseBindPid reads the keeper's --bind-pid PID:START.
func parseBindPid(s string) (int, uint64, error) {
	p, st, ok := strings.Cut(s, ":")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(st, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 {
		return 0, 0, usageError("--bind-pid %s: want PID:START", quoteInput(s))
	}
	return pid, start, nil
}
