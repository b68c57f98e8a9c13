// Package etcdtest runs an etcd server inside a test process, on loopback
// ports, for the tests of the etcd store and of slotctl on it. Only tests
// import it: slotctl itself never links the etcd server.
package etcdtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"
	"unsafe"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/lease"
	"go.uber.org/zap"

	"github.com/slotctl/slotctl/internal/testkit/loopback"
)

// TB is what Start needs of a test: *testing.T has it, and so can a
// testscript command.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Server is one single-member etcd cluster.
type Server struct {
	// Endpoint is the client address, 127.0.0.1:PORT.
	Endpoint string

	tb   TB
	cfg  *embed.Config
	mu   sync.Mutex
	e    *embed.Etcd   // nil while stopped
	stop chan struct{} // stops the revoker
	done chan struct{}
}

// Options tune the server. The zero value is etcd's defaults (heartbeat
// 100ms, election 1s: the shortest lease is 2s), without fsync.
type Options struct {
	// Dir is the data directory; "" is a new temporary directory (the test
	// must then be a testing.TB).
	Dir string
	// Fsync makes the server fsync its log as a production server does
	// (benchmarks compare tools on it).
	Fsync bool
	// TLS, if not nil, serves clients over TLS with these files (see
	// WriteCerts) and, with ClientCertAuth, requires a client certificate.
	TLS *Certs
	// MaxTxnOps, if not 0, is the server's --max-txn-ops (128 by default):
	// a test of the plan-size bound sets it to the store's own bound.
	MaxTxnOps uint
}

// Start starts a server with its data in a new temporary directory and
// stops it when the test ends.
func Start(tb TB, o Options) *Server {
	tb.Helper()
	if o.Dir == "" {
		t, ok := tb.(testing.TB)
		if !ok {
			tb.Fatalf("etcdtest: Options.Dir is required outside a testing.TB")
		}
		o.Dir = filepath.Join(t.TempDir(), "etcd")
	}
	cport, pport := freePort(tb), freePort(tb)
	cfg := embed.NewConfig()
	cfg.Name = "slotctl-test"
	cfg.Dir = o.Dir
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)}
	if o.TLS != nil {
		cu.Scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: o.TLS.ServerCert, KeyFile: o.TLS.ServerKey,
			TrustedCAFile: o.TLS.CA, ClientCertAuth: o.TLS.ClientCertAuth}
	}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = !o.Fsync
	// bcrypt's least cost: a user's password is checked at each handle's
	// dial, which at the default cost takes seconds under -race.
	cfg.BcryptCost = 4 // bcrypt.MinCost
	if o.MaxTxnOps != 0 {
		cfg.MaxTxnOps = o.MaxTxnOps
	}
	s := &Server{Endpoint: cu.Host, tb: tb, cfg: cfg}
	if err := s.start(); err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func freePort(tb TB) int {
	tb.Helper()
	p, err := loopback.FreePort()
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	return p
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		return nil
	}
	var e *embed.Etcd
	var err error
	for try := 0; try < 50; try++ { // the ports of a stopped server may take a moment to free
		if e, err = embed.StartEtcd(s.cfg); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("start etcd on %s: %v", s.Endpoint, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("etcd on %s not ready within 30s", s.Endpoint)
	}
	s.e = e
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.revoker(e, s.stop, s.done)
	return nil
}

// revoker revokes expired leases within 10ms of their deadline: the
// server's own lessor looks only every 500ms, which would blur every lease
// deadline a test checks. It wakes when the earliest lease it saw is due,
// at most revokerNap later: listing the leases sorts them all, which on a
// store of 10,000 tickets every 10ms would take half a core from what a
// benchmark measures. A lease granted or renewed meanwhile expires no
// sooner than the server's shortest TTL (2s here), longer than the nap.
func (s *Server) revoker(e *embed.Etcd, stop, done chan struct{}) {
	defer close(done)
	l := lessor(e)
	nap := time.NewTimer(revokerTick)
	defer nap.Stop()
	for {
		select {
		case <-stop:
			return
		case <-nap.C:
		}
		next := revokerNap
		for _, ls := range l.Leases() {
			if r := ls.Remaining(); r > 0 {
				next = min(next, max(r, revokerTick)) // sorted by expiry
				break
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if _, err := e.Server.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: int64(ls.ID)}); err != nil {
				next = revokerTick // try again soon
			}
			cancel()
		}
		nap.Reset(next)
	}
}

// revokerTick is the revoker's shortest nap, revokerNap its longest: it
// must be shorter than the shortest lease the server grants.
const revokerTick, revokerNap = 10 * time.Millisecond, time.Second

// Stop stops the server (the data stays). Idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		close(s.stop)
		<-s.done
		s.e.Close()
		s.e = nil
	}
}

// Restart starts a stopped server again on the same ports and data.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.start(); err != nil {
		s.tb.Fatalf("etcdtest: %v", err)
	}
}

// Expire waits until the server has revoked every lease whose time is up
// (the test server does within 10ms; a production one within 500ms).
func (s *Server) Expire() {
	s.mu.Lock()
	e := s.e
	s.mu.Unlock()
	if e == nil {
		return
	}
	l := lessor(e)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		ls := l.Leases()
		if len(ls) == 0 || ls[0].Remaining() > 0 {
			return
		}
	}
}

// Advance sleeps d, then waits for the server to revoke what expired.
func (s *Server) Advance(d time.Duration) {
	time.Sleep(d)
	s.Expire()
}

// AdvanceWarm is Advance for tests that look at a lease within a few
// milliseconds of its deadline: while it sleeps it calls ping every few
// milliseconds (ping should make a request to the server through the
// client under test). On a virtual machine the first request after a
// second of idleness takes tens of milliseconds (sleeping threads of the
// server and of the client waking), which would eat such a margin; a busy
// cluster does not sleep.
func (s *Server) AdvanceWarm(d time.Duration, ping func()) {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			break
		}
		time.Sleep(min(left, 5*time.Millisecond))
		ping()
	}
	s.Expire()
}

// LeaseRemaining is the server's own reading of a lease's time left; ok
// is false if it has no such lease.
func (s *Server) LeaseRemaining(id int64) (time.Duration, bool) {
	s.mu.Lock()
	e := s.e
	s.mu.Unlock()
	if e == nil {
		return 0, false
	}
	l := lessor(e).Lookup(lease.LeaseID(id))
	if l == nil {
		return 0, false
	}
	return l.Remaining(), true
}

// lessor digs out the server's lessor, which etcd does not export. Tests
// only: if a new etcd renames the field, this fails loudly.
func lessor(e *embed.Etcd) lease.Lessor {
	v := reflect.ValueOf(e.Server).Elem().FieldByName("lessor")
	if !v.IsValid() {
		panic("etcdtest: etcdserver.EtcdServer has no field lessor (etcd changed): update etcdtest.lessor")
	}
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem().Interface().(lease.Lessor)
}

// EnableAuth turns authentication on: a root user, and user with password
// and read-write access to the keys under prefix (and nothing else).
func (s *Server) EnableAuth(user, password, prefix string, tlsConfig *tls.Config) {
	s.tb.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, TLS: tlsConfig, Logger: zap.NewNop()})
	if err != nil {
		s.tb.Fatalf("etcdtest: %v", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := c.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.RoleAdd(ctx, "slotctl"); return err },
		func() error {
			_, err := c.RoleGrantPermission(ctx, "slotctl", prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := c.UserAdd(ctx, user, password); return err },
		func() error { _, err := c.UserGrantRole(ctx, user, "slotctl"); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			s.tb.Fatalf("etcdtest: enable auth, step %d: %v", i+1, err)
		}
	}
}

// Certs are the PEM files of a test CA, a server certificate for 127.0.0.1
// and localhost, and a client certificate, all signed by the CA.
type Certs struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	ClientCertAuth        bool
}

// WriteCerts makes a new CA and certificates in dir.
func WriteCerts(tb TB, dir string) *Certs {
	tb.Helper()
	c := &Certs{CA: filepath.Join(dir, "ca.pem"), ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem")}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "slotctl test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	writePEM(tb, c.CA, "CERTIFICATE", caDER)
	for i, leaf := range []struct {
		cert, key string
		usage     x509.ExtKeyUsage
		name      string
	}{{c.ServerCert, c.ServerKey, x509.ExtKeyUsageServerAuth, "127.0.0.1"}, {c.ClientCert, c.ClientKey, x509.ExtKeyUsageClientAuth, "slotctl"}} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			tb.Fatalf("etcdtest: %v", err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: leaf.name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{leaf.usage}, DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatalf("etcdtest: %v", err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			tb.Fatalf("etcdtest: %v", err)
		}
		writePEM(tb, leaf.cert, "CERTIFICATE", der)
		writePEM(tb, leaf.key, "EC PRIVATE KEY", kb)
	}
	return c
}

// ClientConfig is a client's TLS configuration for these certificates:
// the test CA, and the client certificate.
func (c *Certs) ClientConfig(tb TB) *tls.Config {
	tb.Helper()
	ca, err := os.ReadFile(c.CA)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(c.ClientCert, c.ClientKey)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}
}

func writePEM(tb TB, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
}
