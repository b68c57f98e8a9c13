package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// EnvURL is the environment variable naming a server to use instead of
// starting one: a URL (postgres://USER[:PASSWORD]@HOST[:PORT]/DBNAME?...)
// whose user may create and drop databases. The databases of the tests are
// created and dropped on it; DBNAME is where that is done from.
const EnvURL = "SLOTCTL_PG_URL"

// role is the superuser of a server pgtest starts (trust authentication,
// Unix socket only).
const role = "slotctl"

// Bounds: a server not answering readyWithin after it was started is an
// error (its log's tail says why); initdb gets initdbWithin; stop waits
// stopWithin for a shutdown before it SIGKILLs.
const (
	readyWithin  = 30 * time.Second
	initdbWithin = 2 * time.Minute
	stopWithin   = 10 * time.Second
	opWithin     = 30 * time.Second
)

// port only names the socket file (.s.PGSQL.5432): the server listens on
// no TCP port, and each server has a socket directory of its own. It is
// written into the URLs so that PGPORT in the environment changes nothing.
const port = "5432"

// dirPrefix starts the name of a server's directory under the temporary
// directory; ownerFile in it names the test binary that made it, so that
// the directories of binaries that were killed can be told from those of
// live ones and removed (sweep).
const (
	dirPrefix = "pgtest-"
	ownerFile = "pgtest.owner"
	logFile   = "postgres.log"
)

// libDir holds Debian's versioned PostgreSQL installations (a variable for
// the tests).
var libDir = "/usr/lib/postgresql"

var mainCalled atomic.Bool

// Main is a package's TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// It runs the tests under testguard.Main (the package must not call that
// too), then stops the server that URL started, if any, and removes its
// directory, then exits with the tests' code. When the tests failed it
// prints the tail of the server's log first.
//
// The server never outlives the test binary, even when the binary is
// killed (SIGKILL, go test's -timeout, a panic): postgres runs as a direct
// child of the binary (not through pg_ctl, which daemonises it), in a
// process group of its own, with SysProcAttr.Pdeathsig = SIGKILL (Linux),
// started from an OS thread that stays locked to the goroutine waiting for
// it (a parent-death signal fires when the thread that started the child
// ends, not the process). The postmaster SIGKILLed, its backends notice its
// death and exit. The postmaster also carries testguard's mark: were it to
// outlive the tests, testguard would kill it and fail the run. The directory of a killed binary's server (data, socket)
// is removed by the next server start (sweep), with its System V shared
// memory segment.
func Main(m *testing.M) { os.Exit(testguard.Main(Run(m))) }

// Run is Main for a TestMain that calls testguard.Main itself:
//
//	code := testguard.Main(pgtest.Run(m))
//
// The server URL started is stopped when m's tests are done.
func Run(m *testing.M) testguard.M {
	mainCalled.Store(true)
	return runThenStop{m}
}

// runThenStop stops the server inside testguard's Run: testguard then
// finds no process left behind.
type runThenStop struct{ m *testing.M }

func (r runThenStop) Run() int {
	code := r.m.Run()
	if s := started.Load(); s != nil {
		if code != 0 {
			if tail := s.logTail(40); tail != "" {
				fmt.Fprintf(os.Stderr, "pgtest: the tail of the server's log:\n%s\n", tail)
			}
		}
		if err := s.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stopping the server: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// URL returns the URL of a fresh, empty database created for this test
// (CREATE DATABASE from template0, under a name of its own), and drops it
// when the test and its subtests end (t.Cleanup; WITH (FORCE) from
// PostgreSQL 13 on, so that connections the test left open do not keep
// it). For a server pgtest started the URL is
//
//	postgres://slotctl@/DBNAME?host=/tmp/pgtest-NNN&port=5432
//
// (a Unix socket, trust authentication); with SLOTCTL_PG_URL it is that
// URL with the database name replaced.
//
// Without SLOTCTL_PG_URL, the first call in the test binary starts its
// server: initdb into a temporary directory and postgres on a Unix socket
// in it, durability off (fsync, synchronous_commit, full_page_writes), run
// as the user postgres (else nobody) when the tests run as root. The
// binaries are postgres and initdb on PATH, else in the newest
// /usr/lib/postgresql/*/bin. Without them the test is skipped, saying how
// to install them, or fails when CI=true.
//
// URL fails the test when the package's TestMain is not pgtest.Main.
func URL(t testing.TB) string {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("pgtest: URL needs the package's TestMain to be pgtest.Main: func TestMain(m *testing.M) { pgtest.Main(m) }")
	}
	s := get(t)
	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), opWithin)
	defer cancel()
	if err := s.exec(ctx, s.createSQL(name)); err != nil {
		t.Fatalf("pgtest: creating database %s: %v%s", name, err, s.diagnosis())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opWithin)
		defer cancel()
		if err := s.drop(ctx, name); err != nil {
			t.Errorf("pgtest: dropping database %s: %v%s", name, err, s.diagnosis())
		}
	})
	return s.dbURL(name)
}

// ServerLog returns what the server the tests started has logged so far,
// or skips the test when the server is one of EnvURL's, whose log is not
// here.
func ServerLog(t testing.TB) string {
	t.Helper()
	s := get(t)
	if s.cmd == nil {
		t.Skip("pgtest: the server's log is read only from a server the tests start")
	}
	b, err := os.ReadFile(filepath.Join(s.dir, logFile))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return string(b)
}

// missingMessage is what a test is told when there is no server to use.
const missingMessage = "pgtest: no PostgreSQL server binaries (postgres and initdb, on PATH or in " +
	"/usr/lib/postgresql/*/bin): install them (apt-get install postgresql) " +
	"or set " + EnvURL + " to the URL of a server"

// errMissing: no postgres and initdb to run.
var errMissing = errors.New(missingMessage)

// skipMissing skips t for want of a server, or fails it when CI=true.
func skipMissing(t testing.TB) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(missingMessage + " (CI=true: failing rather than skipping)")
		return
	}
	t.Skip(missingMessage)
}

var (
	once     sync.Once
	theSrv   *server
	startErr error
	started  atomic.Pointer[server] // a server this binary runs, for Main to stop
	ready    atomic.Pointer[server] // the server once get has it up: NewDB's
)

// get returns the binary's server, started on first use; it skips or
// fails t when there is none.
func get(t testing.TB) *server {
	t.Helper()
	once.Do(func() { theSrv, startErr = open() })
	if errors.Is(startErr, errMissing) {
		skipMissing(t)
	}
	if startErr != nil {
		t.Fatalf("pgtest: %v", startErr)
	}
	if err := theSrv.alive(); err != nil {
		t.Fatalf("pgtest: %v%s", err, theSrv.diagnosis())
	}
	ready.Store(theSrv)
	return theSrv
}

// open returns the server of SLOTCTL_PG_URL, or starts one.
func open() (*server, error) {
	if u := os.Getenv(EnvURL); u != "" {
		return external(u)
	}
	initdb, postgres, err := binaries()
	if err != nil {
		return nil, err
	}
	if err := startable(); err != nil {
		return nil, err
	}
	return start(initdb, postgres)
}

// A server is where the databases are made: one this binary started (cmd
// non-nil) or the one SLOTCTL_PG_URL names.
type server struct {
	admin   string   // URL of the database to create and drop from
	base    *url.URL // the admin URL, whose path dbURL replaces
	version int      // server_version_num

	// A started server's.
	dir    string // its directory: data/, the socket, the log, ownerFile
	cmd    *exec.Cmd
	exited chan struct{} // closed when the postmaster has exited
	err    error         // how it exited, once exited is closed
}

// external is the server of SLOTCTL_PG_URL.
func external(raw string) (*server, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("%s must be a URL, postgres://USER@HOST/DBNAME?...: %q", EnvURL, raw)
	}
	s := &server{admin: raw, base: u}
	ctx, cancel := context.WithTimeout(context.Background(), opWithin)
	defer cancel()
	if s.version, err = serverVersion(ctx, raw); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvURL, err)
	}
	return s, nil
}

// dbURL is the URL of database name on s.
func (s *server) dbURL(name string) string {
	u := *s.base
	u.Path, u.RawPath = "/"+name, ""
	return u.String()
}

// socketURL is a started server's URL for database db.
func socketURL(dir, db string) string {
	return "postgres://" + role + "@/" + db + "?host=" + strings.ReplaceAll(url.QueryEscape(dir), "%2F", "/") + "&port=" + port
}

func (s *server) exec(ctx context.Context, sql string, args ...any) error {
	c, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, sql, args...)
	return err
}

// createSQL creates database name, empty: from template0, which no one
// can have changed. On a server pgtest started, by copying its files
// (STRATEGY FILE_COPY, from PostgreSQL 15 on): with fsync off, its
// checkpoints cost less than WAL_LOG's writing every page to the WAL.
func (s *server) createSQL(name string) string {
	q := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE template0"
	if s.cmd != nil && s.version >= 150000 {
		q += " STRATEGY FILE_COPY"
	}
	return q
}

// drop drops database name: WITH (FORCE) from PostgreSQL 13 on; before,
// the database's backends are terminated and the drop tried again while
// they go.
func (s *server) drop(ctx context.Context, name string) error {
	q := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize()
	if s.version >= 130000 {
		return s.exec(ctx, q+" WITH (FORCE)")
	}
	for {
		err := s.exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
		if err == nil {
			err = s.exec(ctx, q)
		}
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || pe.Code != "55006" { // object_in_use
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dbName is a new database's name: the test's, cut to what is readable,
// and random hex, within PostgreSQL's 63 bytes.
func dbName(test string) string {
	var b strings.Builder
	b.WriteString("pgtest_")
	for _, r := range strings.ToLower(test) {
		if b.Len() >= 7+30 {
			break
		}
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			b.WriteRune(r)
		} else if !strings.HasSuffix(b.String(), "_") {
			b.WriteByte('_')
		}
	}
	if !strings.HasSuffix(b.String(), "_") {
		b.WriteByte('_')
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	b.WriteString(hex.EncodeToString(r[:]))
	return b.String()
}

func serverVersion(ctx context.Context, u string) (int, error) {
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	var v string
	if err := c.QueryRow(ctx, "SHOW server_version_num").Scan(&v); err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// binaries finds initdb and postgres: on PATH, else in the newest
// /usr/lib/postgresql/VERSION/bin that has both.
func binaries() (initdb, postgres string, err error) {
	if i, err := exec.LookPath("initdb"); err == nil {
		if p, err := exec.LookPath("postgres"); err == nil {
			return i, p, nil
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(libDir, "*", "bin"))
	slices.SortFunc(dirs, func(a, b string) int { // newest first
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	for _, d := range dirs {
		i, p := filepath.Join(d, "initdb"), filepath.Join(d, "postgres")
		if executable(i) && executable(p) {
			return i, p, nil
		}
	}
	return "", "", errMissing
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// compareVersions compares versions such as 9.6 and 15 numerically, part
// by part (what is not a number counts as 0).
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// start makes a directory for a server, runs initdb in it and starts
// postgres on a Unix socket in it, and waits until the server answers.
func start(initdb, postgres string) (_ *server, err error) {
	cred, err := account()
	if err != nil {
		return nil, err
	}
	tmp := tempRoot(cred)
	sweep(tmp)
	dir, err := os.MkdirTemp(tmp, dirPrefix)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			cleanDir(dir)
		}
	}()
	if err := writeOwner(dir); err != nil {
		return nil, err
	}
	if len(dir)+len("/.s.PGSQL."+port) > 107 {
		return nil, fmt.Errorf("the socket's path in %s would be longer than a Unix socket's 107 bytes: set TMPDIR to a shorter directory", dir)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	env := environ()

	ctx, cancel := context.WithTimeout(context.Background(), initdbWithin)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, initdb, "-D", data, "-A", "trust", "-U", role, "-E", "UTF8", "--locale=C", "--no-sync")
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, &out, &out
	cmd.SysProcAttr = procAttr(cred)
	done, err := startChild(cmd)
	if err == nil {
		err = <-done
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %v\n%s", initdb, err, tail(out.String(), 40))
	}

	log, err := os.OpenFile(filepath.Join(dir, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own descriptor
	cmd = exec.Command(postgres, "-D", data, "-k", dir, "-p", port,
		"-c", "listen_addresses=",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=1000", // every slotctl process holds two: a step's and its LISTEN
	)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, log, log
	cmd.SysProcAttr = procAttr(cred)
	s := &server{dir: dir, cmd: cmd, exited: make(chan struct{})}
	s.admin = socketURL(dir, "postgres")
	s.base, _ = url.Parse(s.admin)
	done, err = startChild(cmd)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", postgres, err)
	}
	go func() {
		s.err = <-done
		close(s.exited)
	}()
	started.Store(s)
	defer func() {
		if err != nil {
			_ = s.stop()
			started.Store(nil)
		}
	}()
	if err := s.waitReady(); err != nil {
		return nil, err
	}
	return s, nil
}

// waitReady polls until the server takes a connection, it exits, or
// readyWithin passes.
func (s *server) waitReady() error {
	deadline := time.Now().Add(readyWithin)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := serverVersion(ctx, s.admin)
		cancel()
		if err == nil {
			s.version = v
			return nil
		}
		if err := s.alive(); err != nil {
			return fmt.Errorf("%v%s", err, s.diagnosis())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres (pid %d) took no connection within %v: %v%s", s.cmd.Process.Pid, readyWithin, err, s.diagnosis())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive says how a started server ended, if it did.
func (s *server) alive() error {
	if s.cmd == nil {
		return nil
	}
	select {
	case <-s.exited:
		return fmt.Errorf("postgres (pid %d) exited: %v", s.cmd.Process.Pid, s.err)
	default:
		return nil
	}
}

// diagnosis is the tail of a started server's log, for an error message.
func (s *server) diagnosis() string {
	if s.cmd == nil {
		return ""
	}
	if t := s.logTail(20); t != "" {
		return "\nthe tail of the server's log:\n" + t
	}
	return ""
}

func (s *server) logTail(lines int) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, logFile))
	return tail(string(b), lines)
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-lines):], "\n")
}

// stop ends a started server: SIGQUIT (an immediate shutdown: the
// postmaster ends its backends, then itself), SIGKILL to its process
// group after stopWithin; then removes its directory.
func (s *server) stop() error {
	if s.cmd == nil {
		return nil
	}
	pid := s.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	var err error
	select {
	case <-s.exited:
	case <-time.After(stopWithin):
		err = fmt.Errorf("postgres (pid %d) still ran %v after SIGQUIT: SIGKILLed", pid, stopWithin)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-s.exited
	}
	cleanDir(s.dir)
	return err
}

// cleanDir removes a server's directory, and the System V shared memory
// segment its postmaster left if it was killed.
func cleanDir(dir string) {
	_ = removeSegment(filepath.Join(dir, "data"))
	_ = os.RemoveAll(dir)
}

// account is who runs initdb and postgres: nil (this process's user)
// unless this process is root, which postgres refuses to run as; then the
// user postgres (Debian's package makes it), else nobody.
func account() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	return nil, errors.New("running as root, and there is neither a user postgres nor nobody to run postgres as (postgres refuses root)")
}

// tempRoot is where a server's directory is made: the temporary
// directory, unless the socket's path would be too long there or (for
// another user) it cannot be reached; then /tmp.
func tempRoot(cred *syscall.Credential) string {
	d := os.TempDir()
	if len(d) > 64 || (cred != nil && !reachable(d)) {
		return "/tmp"
	}
	return d
}

// reachable reports whether every directory from / to d may be searched
// by others.
func reachable(d string) bool {
	for d = filepath.Clean(d); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" || d == "." {
			return true
		}
	}
}

// environ is this process's environment without libpq's variables
// (PGPORT, PGDATA, ...), which would change what initdb and postgres do.
// testguard's mark stays.
func environ() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
}

// startChild starts cmd from an OS thread locked to a goroutine that
// waits for it, so that the thread (whose end fires Pdeathsig) lives as
// long as the child; done receives Wait's result.
func startChild(cmd *exec.Cmd) (done <-chan error, err error) {
	startErr := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			startErr <- err
			return
		}
		startErr <- nil
		waited <- cmd.Wait()
	}()
	if err := <-startErr; err != nil {
		return nil, err
	}
	return waited, nil
}

// NewDB is URL for goroutines other than the test's (a test's workers): it
// returns an error rather than failing the test, and needs the server up
// already (a URL call on the test's goroutine starts it, or skips the test
// when there is none). The database is dropped at t's cleanup.
func NewDB(t testing.TB) (string, error) {
	s := ready.Load()
	if s == nil {
		return "", errors.New("pgtest: NewDB before the server was started by URL")
	}
	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), opWithin)
	defer cancel()
	if err := s.exec(ctx, s.createSQL(name)); err != nil {
		return "", fmt.Errorf("pgtest: creating database %s: %v%s", name, err, s.diagnosis())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opWithin)
		defer cancel()
		if err := s.drop(ctx, name); err != nil {
			t.Errorf("pgtest: dropping database %s: %v%s", name, err, s.diagnosis())
		}
	})
	return s.dbURL(name), nil
}
