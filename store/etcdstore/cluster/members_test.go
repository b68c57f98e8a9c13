package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/slotctl/slotctl/internal/testkit/loopback"
)

// member is one etcd member process.
type member struct {
	cfg  memberConfig
	log  string // its stderr
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// cluster is three members on loopback, each its own process.
type cluster struct {
	t       *testing.T
	members []*member
	cli     *clientv3.Client // the test's own client, to every member
}

func freePort(t *testing.T) string {
	t.Helper()
	p, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// startCluster starts three members and waits until they have a leader.
// They are SIGKILLed when the test ends.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	return startClusterOf(t, 3)
}

// startClusterOf starts a cluster of n members (the scale test measures
// one member too: the embedded server, in its own process).
func startClusterOf(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{t: t}
	var initial []string
	dir := t.TempDir()
	for i := range n {
		mc := memberConfig{Name: fmt.Sprintf("m%d", i), Client: freePort(t), Peer: freePort(t)}
		mc.Dir = filepath.Join(dir, mc.Name)
		initial = append(initial, mc.Name+"=http://"+mc.Peer)
		c.members = append(c.members, &member{cfg: mc, log: filepath.Join(dir, mc.Name+".log")})
	}
	for _, m := range c.members {
		m.cfg.Initial = strings.Join(initial, ",")
		c.spawn(m)
	}
	t.Cleanup(func() {
		if c.cli != nil {
			c.cli.Close()
		}
		for _, m := range c.members {
			if m.cmd != nil {
				_ = m.cmd.Process.Signal(syscall.SIGCONT)
				_ = m.cmd.Process.Kill()
				<-m.done
			}
		}
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	c.cli = cli
	for i := range c.members {
		c.waitHealthy(i)
	}
	return c
}

// binaryFlags are an etcd binary's flags for member mc, as runMember
// configures the embedded server (fsync stays on: the oldest releases
// cannot turn it off).
func binaryFlags(mc memberConfig) []string {
	cu, pu := "http://"+mc.Client, "http://"+mc.Peer
	return []string{"--name", mc.Name, "--data-dir", mc.Dir,
		"--listen-client-urls", cu, "--advertise-client-urls", cu,
		"--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
		"--initial-cluster", mc.Initial, "--initial-cluster-token", "slotctl-cluster-test",
		"--initial-cluster-state", "new", "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"}
}

func (c *cluster) spawn(m *member) {
	c.t.Helper()
	js, _ := json.Marshal(m.cfg)
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memberEnv+"="+string(js))
	if etcdBinary != "" {
		cmd = exec.Command(etcdBinary, binaryFlags(m.cfg)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start member %s: %v", m.cfg.Name, err)
	}
	m.cmd, m.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(m.done)
}

// endpoints are the members' client addresses.
func (c *cluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.cfg.Client)
	}
	return eps
}

// storeURL is slotctl's --store for these endpoints and prefix.
func storeURL(prefix string, endpoints ...string) string {
	return "etcd://" + strings.Join(endpoints, ",") + "/" + prefix
}

// status asks member i who leads; ok is false if it does not answer or
// knows no leader.
func (c *cluster) status(i int) (leader, self uint64, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := c.cli.Status(ctx, c.members[i].cfg.Client)
	if err != nil || r.Leader == 0 {
		return 0, 0, false
	}
	return r.Leader, r.Header.MemberId, true
}

// waitHealthy waits until member i answers, knows a leader, and serves a
// linearizable read (it caught up).
func (c *cluster) waitHealthy(i int) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, _, ok := c.status(i); ok {
			one, err := clientv3.New(clientv3.Config{Endpoints: []string{c.members[i].cfg.Client}, DialTimeout: time.Second, Logger: zap.NewNop()})
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err = one.Get(ctx, "health")
				cancel()
				one.Close()
				if err == nil {
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, _ := os.ReadFile(c.members[i].log)
	c.t.Fatalf("member %s not healthy within 30s; its log:\n%s", c.members[i].cfg.Name, tail(string(out), 3000))
}

// leader is the index of the member that leads (waiting up to 10 s for one).
func (c *cluster) leader() int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for i := range c.members {
			if l, self, ok := c.status(i); ok && l == self {
				return i
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatal("no leader within 10s")
	return -1
}

// follower is the index of a member that does not lead.
func (c *cluster) follower() int {
	return (c.leader() + 1) % len(c.members)
}

// leaderSince waits for a member other than old to lead and returns when.
func (c *cluster) waitNewLeader(old int, within time.Duration) (int, time.Time, bool) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for i := range c.members {
			if i == old {
				continue
			}
			if l, self, ok := c.status(i); ok && l == self {
				return i, time.Now(), true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return -1, time.Time{}, false
}

func (c *cluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	if err := c.members[i].cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal %v to member %s: %v", sig, c.members[i].cfg.Name, err)
	}
}

// pause stops member i (SIGSTOP): its sockets stay open, it answers nothing.
func (c *cluster) pause(i int) { c.signal(i, syscall.SIGSTOP) }

// resume continues a paused member.
func (c *cluster) resume(i int) { c.signal(i, syscall.SIGCONT) }

// kill SIGKILLs member i and waits for it to go.
func (c *cluster) kill(i int) {
	c.t.Helper()
	c.signal(i, syscall.SIGKILL)
	<-c.members[i].done
	c.members[i].cmd = nil
}

// stop stops member i cleanly (SIGTERM), as a rolling restart does.
func (c *cluster) stop(i int) {
	c.t.Helper()
	c.signal(i, syscall.SIGTERM)
	select {
	case <-c.members[i].done:
	case <-time.After(20 * time.Second):
		c.t.Errorf("member %s did not stop within 20s of SIGTERM: killed", c.members[i].cfg.Name)
		c.signal(i, syscall.SIGKILL)
		<-c.members[i].done
	}
	c.members[i].cmd = nil
}

// restart starts a stopped member again on its ports and data, and waits
// until it is healthy.
func (c *cluster) restart(i int) {
	c.t.Helper()
	c.spawn(c.members[i])
	c.waitHealthy(i)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// grepLog is the member's log lines that mention any of words (the last 30).
func (m *member) grepLog(words ...string) string {
	b, _ := os.ReadFile(m.log)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(strings.ToLower(line), w) {
				out = append(out, "  "+line)
				break
			}
		}
	}
	if len(out) > 30 {
		out = out[len(out)-30:]
	}
	return strings.Join(out, "\n")
}
