package cli

// slotctl on etcd: the script command that gives a script its own etcd
// server, the test-only host identity, and the fault tests that need real
// processes and a real server: an outage, a partitioned client.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

type etcdKey struct{}

// etcdBox holds a script's etcd server, once "etcd start" made one.
type etcdBox struct{ srv *etcdtest.Server }

// etcdScriptSetup gives each script a place for its etcd server and drops
// the etcd settings and test identity an ancestor may have set.
func etcdScriptSetup(env *testscript.Env) {
	env.Values[etcdKey{}] = &etcdBox{}
	for _, k := range []string{"SLOTCTL_ETCD_USERNAME", "SLOTCTL_ETCD_PASSWORD", "SLOTCTLTEST_HOST", "SLOTCTLTEST_BOOT"} {
		env.Setenv(k, "")
	}
}

// scriptTB lets etcdtest report to, and clean up with, a script.
type scriptTB struct{ ts *testscript.TestScript }

func (s scriptTB) Helper()                           {}
func (s scriptTB) Fatalf(format string, args ...any) { s.ts.Fatalf(format, args...) }
func (s scriptTB) Cleanup(f func())                  { s.ts.Defer(f) }

// cmdEtcd: "etcd start" starts the script's own etcd server on loopback
// ports (again, on the same ports and data, after "etcd stop") and points
// SLOTCTL_STORE at it; $ETCD is its HOST:PORT. "etcd stop" stops it.
//
// "etcd start -tls [-auth USER PASSWORD PREFIX]" serves clients over TLS
// only, with a client certificate required, from certificates written to
// $WORK/certs (ca.pem, client.pem, client-key.pem); -auth turns
// authentication on, USER having read-write access under PREFIX only
// ("etcd start -auth ..." does so on a server without TLS).
func cmdEtcd(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! etcd")
	}
	usage := "usage: etcd start [-tls] [-auth USER PASSWORD PREFIX] | etcd stop"
	if len(args) == 0 {
		ts.Fatalf("%s", usage)
	}
	box := ts.Value(etcdKey{}).(*etcdBox)
	switch args[0] {
	case "start":
		if box.srv != nil {
			box.srv.Restart()
			break
		}
		o := etcdtest.Options{Dir: ts.MkAbs("etcd-data")}
		var auth []string
		withTLS := len(args) > 1 && args[1] == "-tls"
		switch {
		case len(args) == 1:
		case len(args) == 2 && withTLS:
		case len(args) == 6 && withTLS && args[2] == "-auth":
			auth = args[3:]
		case len(args) == 5 && args[1] == "-auth":
			auth = args[2:]
		default:
			ts.Fatalf("%s", usage)
		}
		if withTLS {
			dir := ts.MkAbs("certs")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				ts.Fatalf("%v", err)
			}
			o.TLS = etcdtest.WriteCerts(scriptTB{ts}, dir)
			o.TLS.ClientCertAuth = true
		}
		box.srv = etcdtest.Start(scriptTB{ts}, o)
		if auth != nil {
			var tc *tls.Config
			if o.TLS != nil {
				tc = o.TLS.ClientConfig(scriptTB{ts})
			}
			box.srv.EnableAuth(auth[0], auth[1], auth[2], tc)
		}
	case "stop":
		if box.srv == nil {
			ts.Fatalf("etcd stop: no etcd started")
		}
		box.srv.Stop()
		return
	default:
		ts.Fatalf("%s", usage)
	}
	ts.Setenv("ETCD", box.srv.Endpoint)
	ts.Setenv("SLOTCTL_STORE", "etcd://"+box.srv.Endpoint+"/slotctl")
}

// etcdPTEnv is a process-test environment on an etcd server of its own.
func etcdPTEnv(t *testing.T) (*ptEnv, *etcdtest.Server) {
	t.Helper()
	return etcdPTEnvWith(t, newPTEnv)
}

// etcdPTEnvWith is etcdPTEnv on an environment from newEnv (newPTEnvAlone).
func etcdPTEnvWith(t *testing.T, newEnv func(*testing.T) *ptEnv) (*ptEnv, *etcdtest.Server) {
	t.Helper()
	e := newEnv(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	e.env = append(e.env, "SLOTCTL_STORE=etcd://"+srv.Endpoint+"/slotctl")
	return e, srv
}

// TestEtcdOutageStopsChild: the etcd server stops while a job runs with
// --ttl 3s. The holder cannot renew: it stops its child before the lease
// it last renewed could expire, and exits 76. The server comes back: new
// runs are admitted, after the old lease is gone, so never beside the job.
func TestEtcdOutageStopsChild(t *testing.T) {
	e, srv := etcdPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	const ttl = 3 * time.Second
	p := e.start(ctx, "holder", "run", "--limit", "o", "--ttl", ttl.String(), "--store-timeout", "500ms", "--",
		"sh", "-c", `echo $$ > pid; date +%s%N > started; trap ': > stopped; exit 143' TERM; while :; do sleep 0.05; done`)
	ptWaitFor(t, "child started", 10*time.Second, func() bool { return ptExists(e.path("started")) })
	pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
	e.notePid(pid)
	time.Sleep(1500 * time.Millisecond) // a renewal or two go through first

	srv.Stop()
	downAt := time.Now()
	code := p.wait(t, 20*time.Second)
	if code != exitLost {
		t.Fatalf("holder exited %d, want %d (lease lost, child stopped); stderr:\n%s", code, exitLost, p.stderr())
	}
	stopped := ptWaitMtime(t, e.path("stopped"), 2*time.Second)
	if !ptGone(pid) {
		t.Fatalf("child %d still runs after slotctl exited", pid)
	}
	// Its last acknowledged renewal was sent before the server stopped, so
	// the server's deadline is at least that + TTL: the child had to be
	// stopped before downAt + TTL at the latest.
	if after := stopped.Sub(downAt); after >= ttl {
		t.Errorf("child stopped %s after the server went down: a %s lease may have expired first", after, ttl)
	}
	if se := strings.ToLower(p.stderr()); !strings.Contains(se, "lease") || !strings.Contains(se, "lost") {
		t.Errorf("holder's stderr does not say the lease was lost:\n%s", p.stderr())
	}

	srv.Restart()
	next := e.start(ctx, "next", "run", "--limit", "o", "--ttl", ttl.String(), "--wait", "20s", "--", "sh", "-c", `date +%s%N > next`)
	if code := next.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("run after the server came back exited %d, want 0; stderr:\n%s", code, next.stderr())
	}
	nextAt := time.Unix(0, ptReadInt(t, e.path("next")))
	if !nextAt.After(stopped) {
		t.Errorf("the next job started at %s, before the first one's child stopped at %s", nextAt.Format(time.StampMicro), stopped.Format(time.StampMicro))
	}
	t.Logf("server down -> child stopped %s, holder exited %s; next job (after the restart) started %s after the server went down",
		ptMS(stopped.Sub(downAt)), ptMS(p.exitedAt.Sub(downAt)), ptMS(nextAt.Sub(downAt)))
}

// blackhole is a TCP proxy that can be cut: while cut it forwards nothing
// and accepts nothing, but closes no connection, as a network partition
// behaves (the client learns nothing; its requests time out).
type blackhole struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	healed *sync.Cond
	conns  []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{l: l, target: target}
	b.healed = sync.NewCond(&b.mu)
	go b.serve()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.l.Addr().String() }

func (b *blackhole) serve() {
	for {
		c, err := b.l.Accept()
		if err != nil {
			return
		}
		go func() {
			b.wait()
			s, err := net.Dial("tcp", b.target)
			if err != nil {
				c.Close()
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c, s)
			b.mu.Unlock()
			go b.pipe(s, c)
			go b.pipe(c, s)
		}()
	}
}

// wait blocks while the proxy is cut.
func (b *blackhole) wait() {
	b.mu.Lock()
	for b.cut {
		b.healed.Wait()
	}
	b.mu.Unlock()
}

func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b.wait() // held, not lost: delivered if the partition heals
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			dst.Close()
			return
		}
	}
}

func (b *blackhole) setCut(cut bool) {
	b.mu.Lock()
	b.cut = cut
	b.mu.Unlock()
	b.healed.Broadcast()
}

func (b *blackhole) close() {
	b.setCut(false)
	b.l.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

// TestEtcdPartitionNeverOverlaps: a holder cut off from etcd for longer than
// its TTL stops its job before the server expires its lease, so the job
// that replaces it (on a client that still reaches etcd) never runs beside it.
func TestEtcdPartitionNeverOverlaps(t *testing.T) {
	e, srv := etcdPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	proxy := newBlackhole(t, srv.Endpoint)

	const ttl = 3 * time.Second
	a := e.start(ctx, "a", "run", "--store", "etcd://"+proxy.addr()+"/slotctl", "--limit", "p", "--ttl", ttl.String(),
		"--store-timeout", "1s", "--", "sh", "-c",
		`echo $$ > a.pid; date +%s%N > a.start; trap ': > a.stop; exit 143' TERM; while :; do sleep 0.02; done`)
	ptWaitFor(t, "A's child started", 10*time.Second, func() bool { return ptExists(e.path("a.start")) })
	e.notePid(int(ptWaitInt(t, e.path("a.pid"), 5*time.Second)))
	b := e.start(ctx, "b", "run", "--limit", "p", "--ttl", ttl.String(), "--", "sh", "-c", `date +%s%N > b.start`)
	waitQueue(t, e, srv, "p", 1)
	time.Sleep(1200 * time.Millisecond) // A renews through the proxy meanwhile

	proxy.setCut(true)
	cutAt := time.Now()
	if code := b.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("B exited %d, want 0; stderr:\n%s", code, b.stderr())
	}
	bStart := time.Unix(0, ptReadInt(t, e.path("b.start")))
	aStop := ptWaitMtime(t, e.path("a.stop"), 5*time.Second)
	if time.Since(cutAt) < ttl {
		time.Sleep(ttl - time.Since(cutAt)) // partitioned longer than its TTL
	}
	code := a.wait(t, 15*time.Second)
	proxy.setCut(false)

	if !aStop.Before(bStart) {
		t.Fatalf("B's job started at %s, before A's job stopped at %s: they overlapped", bStart.Format(time.StampMicro), aStop.Format(time.StampMicro))
	}
	if code != exitLost {
		t.Errorf("A exited %d, want %d; stderr:\n%s", code, exitLost, a.stderr())
	}
	t.Logf("partition -> A's job stopped %s later, B's job started %s later (gap %s)",
		ptMS(aStop.Sub(cutAt)), ptMS(bStart.Sub(cutAt)), ptMS(bStart.Sub(aStop)))
}

// waitQueue waits until limit has n waiters.
func waitQueue(t *testing.T, e *ptEnv, srv *etcdtest.Server, limit string, n int) {
	t.Helper()
	want := fmt.Sprintf(`"waiting": %d,`, n)
	ptWaitFor(t, fmt.Sprintf("%d waiting in %q", n, limit), 10*time.Second, func() bool {
		out, err := e.output("limit", "ls", "-o", "json", limit)
		return err == nil && strings.Contains(out, want)
	})
}

// output runs slotctl to completion and returns its stdout.
func (e *ptEnv) output(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin, args...)
	cmd.Dir, cmd.Env = e.dir, e.env
	out, err := cmd.Output()
	return string(out), err
}

// The --etcd-* flags win over the environment and the config file (and
// etcd_tls_auth.txtar runs them against a TLS cluster with auth).
func TestEtcdFlagsOverride(t *testing.T) {
	dir := t.TempDir()
	config := dir + "/config.yaml"
	if err := os.WriteFile(config, []byte("etcd:\n  username: from-file\n  dial-timeout: 3s\n  request-timeout: 4s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SLOTCTL_CONFIG": config, "SLOTCTL_ETCD_USERNAME": "from-env", "SLOTCTL_ETCD_PASSWORD": "pw"}
	f := &Factory{Getenv: func(k string) string { return env[k] }}
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	cmd.Flags().String("config", "", "")
	addEtcdFlags(cmd.Flags())
	if err := cmd.ParseFlags([]string{"--etcd-username", "from-flag", "--etcd-dial-timeout", "250ms"}); err != nil {
		t.Fatal(err)
	}
	if err := f.loadConfig(cmd); err != nil {
		t.Fatal(err)
	}
	es, err := f.etcdSettings(&globalOptions{StoreTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if es.Username != "from-flag" || es.Password != "pw" || es.DialTimeout != 250*time.Millisecond || es.RequestTimeout != 4*time.Second {
		t.Errorf("settings %+v: want user from the flag, password from the environment, dial timeout from the flag, request timeout from the file", es)
	}
	if src := es.source("dial-timeout"); src != "flag --etcd-dial-timeout" {
		t.Errorf("source of dial-timeout = %q", src)
	}
	if src := es.source("request-timeout"); src != "config file "+config {
		t.Errorf("source of request-timeout = %q", src)
	}
}

// ptWaitMtime waits for path to exist and returns when it was written: a
// job's SIGTERM trap makes it with a builtin (no fork), so that it is
// written within the half margin before SIGKILL on a loaded machine too.
// The file system's clock is coarse (a few ms behind at most): far finer
// than the margins these tests check.
func ptWaitMtime(t *testing.T, path string, timeout time.Duration) time.Time {
	t.Helper()
	ptWaitFor(t, filepath.Base(path), timeout, func() bool { return ptExists(path) })
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.ModTime()
}
