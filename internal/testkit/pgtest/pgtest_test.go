//go:build linux

package pgtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// helperEnv makes TestHelperServer, in a child test binary, start a
// server and wait to be killed.
const helperEnv = "SLOTCTLTEST_PGTEST_HELPER"

func connect(t testing.TB, u string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connecting to %s: %v", u, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func query[T any](t testing.TB, c *pgx.Conn, sql string, args ...any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var v T
	if err := c.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func execSQL(t testing.TB, c *pgx.Conn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// userRelations counts what is not the system's in a database.
const userRelations = `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'`

func TestDatabasesAreDistinctAndEmpty(t *testing.T) {
	a, b := URL(t), URL(t)
	if a == b {
		t.Fatalf("two calls gave the same URL %s", a)
	}
	ca, cb := connect(t, a), connect(t, b)
	da, db := query[string](t, ca, "SELECT current_database()"), query[string](t, cb, "SELECT current_database()")
	if da == db {
		t.Fatalf("both URLs reach database %s", da)
	}
	for _, c := range []*pgx.Conn{ca, cb} {
		if n := query[int64](t, c, userRelations); n != 0 {
			t.Errorf("a new database has %d relations", n)
		}
	}
	execSQL(t, ca, "CREATE TABLE slots (name text PRIMARY KEY, n int NOT NULL)")
	execSQL(t, ca, "INSERT INTO slots VALUES ('build', 2)")
	if !query[bool](t, ca, "SELECT to_regclass('slots') IS NOT NULL") {
		t.Errorf("the table is not in the database it was created in, %s", da)
	}
	if query[bool](t, cb, "SELECT to_regclass('slots') IS NOT NULL") {
		t.Errorf("a table created in %s is in %s too", da, db)
	}
}

func TestServerAnswers(t *testing.T) {
	c := connect(t, URL(t))
	t.Logf("%s", query[string](t, c, "SELECT version()"))
	if os.Getenv(EnvURL) == "" {
		if s := query[string](t, c, "SHOW fsync"); s != "off" {
			t.Errorf("fsync = %s on a test server", s)
		}
		if u := query[string](t, c, "SELECT current_user"); u != role {
			t.Errorf("connected as %s, want %s", u, role)
		}
	}
}

// TestDroppedAtCleanup: a subtest's database is gone when the subtest has
// ended, though the subtest left a connection to it open.
func TestDroppedAtCleanup(t *testing.T) {
	var name, dropped string
	t.Run("sub", func(t *testing.T) {
		var c *pgx.Conn
		t.Cleanup(func() { // registered first: runs after URL's drop
			if c != nil {
				c.Close(context.Background())
			}
		})
		dropped = URL(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if c, err = pgx.Connect(ctx, dropped); err != nil {
			t.Fatal(err)
		}
		name = query[string](t, c, "SELECT current_database()")
	})
	if name == "" {
		t.Fatal("the subtest failed")
	}
	c := connect(t, URL(t))
	if n := query[int64](t, c, "SELECT count(*) FROM pg_database WHERE datname = $1", name); n != 0 {
		t.Fatalf("database %s still exists after its test's cleanup", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c, err := pgx.Connect(ctx, dropped); err == nil {
		c.Close(ctx)
		t.Fatalf("connected to %s after its test's cleanup", dropped)
	}
}

// TestParallelTests: tests in parallel each get a database of their own.
func TestParallelTests(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	for i := range 4 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			u := URL(t)
			c := connect(t, u)
			execSQL(t, c, "CREATE TABLE t (i int)")
			db := query[string](t, c, "SELECT current_database()")
			mu.Lock()
			defer mu.Unlock()
			if seen[db] {
				t.Errorf("database %s given twice", db)
			}
			seen[db] = true
		})
	}
}

// TestURLForm: a started server's URLs name the Unix socket's directory
// and the role.
func TestURLForm(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Skip(EnvURL + " is set: no server started")
	}
	raw := URL(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Query().Get("host")
	if u.Scheme != "postgres" || u.User.Username() != role || u.Host != "" || !filepath.IsAbs(host) || u.Query().Get("port") != port {
		t.Errorf("URL %s: want postgres://%s@/DBNAME?host=/DIR&port=%s", raw, role, port)
	}
	if fi, err := os.Stat(filepath.Join(host, ".s.PGSQL."+port)); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("no socket in %s: %v", host, err)
	}
}

// TestHelperServer is the child binary of TestServerDiesWithBinary: it
// starts a server, holds a connection to it, says the postmaster's pid and
// the server's directory, and waits to be killed.
func TestHelperServer(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("TestServerDiesWithBinary's child binary")
	}
	connect(t, URL(t))
	s := started.Load()
	fmt.Printf("pgtest-helper postmaster=%d dir=%s\n", s.cmd.Process.Pid, s.dir)
	time.Sleep(2 * time.Minute)
	t.Fatal("not killed within 2 minutes")
}

// TestServerDiesWithBinary: a test binary SIGKILLed (no TestMain cleanup
// runs), its postmaster and the postmaster's children end; the next sweep
// removes the server's directory and shared memory segment.
func TestServerDiesWithBinary(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Skip(EnvURL + " is set: no server started")
	}
	if _, _, err := binaries(); err != nil {
		skipMissing(t)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServer$", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	said := make(chan string, 1)
	var rest strings.Builder
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "pgtest-helper ") {
				said <- sc.Text()
				break
			}
			rest.WriteString(sc.Text() + "\n")
		}
		close(said)
		_, _ = io.Copy(io.Discard, out)
	}()
	var line string
	select {
	case line = <-said:
	case <-time.After(2 * time.Minute):
	}
	var pm int
	var dir string
	if _, err := fmt.Sscanf(line, "pgtest-helper postmaster=%d dir=%s", &pm, &dir); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		killed = true
		t.Fatalf("the child binary said no postmaster (%q: %v); its output:\n%s%s", line, err, rest.String(), stderr.String())
	}

	// The postmaster and its children (checkpointer, the child binary's
	// backend, ...), each with its start time: a pid may be reused.
	procs := map[int]uint64{}
	st, err := startTime(pm)
	if err != nil {
		t.Fatalf("postmaster %d: %v", pm, err)
	}
	procs[pm] = st
	for _, pid := range children(pm) {
		if st, err := startTime(pid); err == nil {
			procs[pid] = st
		}
	}
	if len(procs) < 2 {
		t.Fatalf("postmaster %d has no children", pm)
	}
	segment := ""
	if l := pidFile(filepath.Join(dir, "data")); len(l) >= 7 {
		segment = strings.TrimSpace(l[6])
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	deadline := time.Now().Add(20 * time.Second)
	for {
		var left []int
		for pid, st := range procs {
			if now, err := startTime(pid); err == nil && now == st {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, pid := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("20 s after the child binary was SIGKILLed, these of its server's %d processes still ran (killed now): %v (postmaster %d)", len(procs), left, pm)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("postmaster %d and its %d children ended with the binary", pm, len(procs)-1)

	sweep(filepath.Dir(dir))
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the killed binary's server directory %s is still there after a sweep: %v", dir, err)
	}
	if segment != "" {
		f := strings.Fields(segment)
		b, _ := os.ReadFile("/proc/sysvipc/shm")
		for _, l := range strings.Split(string(b), "\n")[1:] {
			if g := strings.Fields(l); len(g) > 1 && len(f) == 2 && g[0] == f[0] && g[1] == f[1] {
				t.Errorf("the killed server's shared memory segment (key %s, id %s) is still there after a sweep", f[0], f[1])
			}
		}
	}
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	names, _ := filepath.Glob("/proc/[0-9]*/stat")
	var kids []int
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			k, _ := strconv.Atoi(filepath.Base(filepath.Dir(n)))
			kids = append(kids, k)
		}
	}
	return kids
}

// TestSweepKeepsLiveServers: sweep removes a directory only when the
// binary that made it is gone.
func TestSweepKeepsLiveServers(t *testing.T) {
	tmp := t.TempDir()
	live := filepath.Join(tmp, dirPrefix+"live")
	dead := filepath.Join(tmp, dirPrefix+"dead")
	unowned := filepath.Join(tmp, dirPrefix+"unowned")
	for _, d := range []string{live, dead, unowned} {
		if err := os.MkdirAll(filepath.Join(d, "data"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeOwner(live); err != nil {
		t.Fatal(err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	st, _ := startTime(os.Getpid())
	if err := os.WriteFile(filepath.Join(dead, ownerFile), fmt.Appendf(nil, "%d %d\n", gone.Process.Pid, st), 0o600); err != nil {
		t.Fatal(err)
	}
	sweep(tmp)
	for d, want := range map[string]bool{live: true, dead: false, unowned: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: exists %v after a sweep, want %v", filepath.Base(d), err == nil, want)
		}
	}
}

func TestBinaries(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	lib := t.TempDir()
	defer func(d string) { libDir = d }(libDir)
	libDir = lib
	if _, _, err := binaries(); err != errMissing {
		t.Fatalf("no binaries: %v, want errMissing", err)
	}
	for _, f := range []string{"9.6/bin/initdb", "9.6/bin/postgres", "15/bin/initdb", "15/bin/postgres", "10/bin/initdb", "10/bin/postgres", "16/bin/initdb"} {
		p := filepath.Join(lib, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	i, p, err := binaries()
	if err != nil || i != filepath.Join(lib, "15/bin/initdb") || p != filepath.Join(lib, "15/bin/postgres") {
		t.Errorf("binaries() = %s, %s, %v; want version 15's (16 has no postgres)", i, p, err)
	}
}

// recorder is a testing.TB that notes Fatal and Skip instead of ending the test.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()               {}
func (r *recorder) Fatal(args ...any)     { r.fatal = fmt.Sprint(args...) }
func (r *recorder) Skip(args ...any)      { r.skip = fmt.Sprint(args...) }
func (r *recorder) Fatalf(string, ...any) { panic("unexpected") }

func TestMissingSkipsUnlessCI(t *testing.T) {
	t.Setenv("CI", "")
	r := &recorder{TB: t}
	skipMissing(r)
	if r.fatal != "" || !strings.Contains(r.skip, "apt-get install postgresql") {
		t.Errorf("without CI: skip %q, fatal %q; want a skip saying how to install", r.skip, r.fatal)
	}
	t.Setenv("CI", "true")
	r = &recorder{TB: t}
	skipMissing(r)
	if r.skip != "" || !strings.Contains(r.fatal, "apt-get install postgresql") {
		t.Errorf("CI=true: skip %q, fatal %q; want a failure saying how to install", r.skip, r.fatal)
	}
}

func TestDBName(t *testing.T) {
	seen := map[string]bool{}
	for _, test := range []string{"TestX", "TestX", "TestVeryLongName/with_sub-tests/and More/and more and more and more", "Test/#01"} {
		n := dbName(test)
		if len(n) > 63 || seen[n] || n != strings.ToLower(n) || pgx.Identifier([]string{n}).Sanitize() != `"`+n+`"` {
			t.Errorf("dbName(%q) = %q", test, n)
		}
		seen[n] = true
	}
}

// NewDB from another goroutine gives a database of its own once URL has
// the server up.
func TestNewDBAfterURL(t *testing.T) {
	first := URL(t)
	got := make(chan string, 1)
	go func() {
		u, err := NewDB(t)
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	if u := <-got; u == "" || u == first {
		t.Fatalf("NewDB = %q, want a database other than URL's %q", u, first)
	}
}
