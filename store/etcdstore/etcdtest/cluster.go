package etcdtest

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Cluster is an etcd cluster of several members in the test process, on
// loopback ports: for what a client does when a member (the leader) goes
// away. Its members have etcd's default timing (heartbeat 100ms, election
// 1s) and expire leases with etcd's own lessor (every 500ms), not Server's
// precise revoker. Each member is reached, by clients and by its peers,
// through a Proxy, so that a test can pause it (Pause: as SIGSTOP does,
// connections stay open and nothing moves) without stopping the process.
type Cluster struct {
	Members []*Member
	tb      testing.TB
}

// Member is one member of a Cluster.
type Member struct {
	// Endpoint is its client address (its client proxy's), 127.0.0.1:PORT.
	Endpoint string
	// Client and Peer are the proxies in front of its client and peer ports.
	Client, Peer *Proxy
	cfg          *embed.Config
	mu           sync.Mutex
	e            *embed.Etcd // nil while stopped
}

// StartCluster starts a cluster of n members and stops it when the test ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c := &Cluster{tb: tb}
	dir := tb.TempDir()
	var peers []string
	for i := range n {
		cport, pport := freePort(tb), freePort(tb)
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = filepath.Join(dir, cfg.Name)
		cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)}
		pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
		cp, pp := NewProxy(tb, cu.Host), NewProxy(tb, pu.Host)
		cpu, ppu := url.URL{Scheme: "http", Host: cp.Addr}, url.URL{Scheme: "http", Host: pp.Addr}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cpu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{ppu}
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cfg.UnsafeNoFsync = true
		cfg.InitialClusterToken = "slotctl-test-cluster"
		peers = append(peers, cfg.Name+"="+ppu.String())
		c.Members = append(c.Members, &Member{Endpoint: cp.Addr, Client: cp, Peer: pp, cfg: cfg})
	}
	for _, m := range c.Members {
		m.cfg.InitialCluster = strings.Join(peers, ",")
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, m := range c.Members {
		wg.Go(func() { errs[i] = m.start() })
	}
	wg.Wait()
	tb.Cleanup(func() {
		for _, m := range c.Members {
			m.Stop()
		}
	})
	for _, err := range errs {
		if err != nil {
			tb.Fatalf("etcdtest: %v", err)
		}
	}
	return c
}

func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.e != nil {
		return nil
	}

	var e *embed.Etcd
	var err error
	for range 50 { // the ports of a stopped member may take a moment to free
		if e, err = embed.StartEtcd(m.cfg); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("start etcd member %s: %v", m.cfg.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("etcd member %s not ready within 30s", m.cfg.Name)
	}
	m.e = e
	m.cfg.ClusterState = embed.ClusterStateFlagExisting // a restart rejoins
	return nil
}

// Stop stops the member (its data stays), gracefully: a leader hands its
// leadership on first. Idempotent.
func (m *Member) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.e != nil {
		m.e.Close()
		m.e = nil
	}

}

// Pause stalls the member's proxies, as SIGSTOP would stall the member:
// clients and peers keep their connections, and nothing passes.
func (m *Member) Pause() {
	m.Peer.Stall(true)
	m.Client.Stall(true)
}

// Resume undoes Pause.
func (m *Member) Resume() {
	m.Peer.Stall(false)
	m.Client.Stall(false)
}

// Restart starts a stopped member again on its ports and data.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	if err := c.Members[i].start(); err != nil {
		c.tb.Fatalf("etcdtest: %v", err)
	}
}

// Endpoints are the members' client addresses.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.Endpoint)
	}
	return out
}

// Leader is the index of the member that is leader now, -1 if none (of
// those running and not paused, but for skip) says it is.
func (c *Cluster) Leader(skip ...int) int {
	for i, m := range c.Members {
		m.mu.Lock()
		e := m.e
		m.mu.Unlock()
		if e != nil && !slices.Contains(skip, i) && e.Server.Leader() == e.Server.MemberID() {
			return i
		}
	}
	return -1
}

// WaitLeader waits up to d for a leader among the members but skip.
func (c *Cluster) WaitLeader(d time.Duration, skip ...int) int {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if i := c.Leader(skip...); i >= 0 {
			return i
		}
	}
	return -1
}

// MoveLeader hands the leadership to the next running member (an election:
// the raft term moves on) and returns the new leader's index.
func (c *Cluster) MoveLeader(d time.Duration) int {
	c.tb.Helper()
	from := c.WaitLeader(d)
	if from < 0 {
		c.tb.Fatal("etcdtest: no leader to move")
	}
	to := (from + 1) % len(c.Members)
	c.Members[from].mu.Lock()
	lead := c.Members[from].e
	c.Members[from].mu.Unlock()
	c.Members[to].mu.Lock()
	next := c.Members[to].e
	c.Members[to].mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := lead.Server.MoveLeader(ctx, uint64(lead.Server.MemberID()), uint64(next.Server.MemberID())); err != nil {
		c.tb.Fatalf("etcdtest: move the leader from m%d to m%d: %v", from, to, err)
	}
	if got := c.WaitLeader(d); got != to {
		c.tb.Fatalf("etcdtest: the leader is m%d after moving it to m%d", got, to)
	}
	return to
}
