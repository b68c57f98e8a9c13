package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// probeTimeout bounds the TLS probe of one endpoint (connect, handshake,
// the server's first answer); it runs only after a dial has failed.
const probeTimeout = time.Second

// tlsProbe says what is wrong with TLS between this client and the server
// at addr, or "" when it finds nothing wrong (or cannot connect at all).
//
// It exists because grpc retries a failed handshake until the dial
// timeout, and then reports only the timeout: an unknown CA, a server that
// speaks plain text, a client certificate the server refuses all read as
// "did not answer". One handshake of its own, after the failure, names the
// cause. With cfg nil (no TLS configured) it asks whether the server
// speaks TLS: it sends a ClientHello and nothing else, no credentials.
func tlsProbe(ctx context.Context, addr string, cfg *tls.Config) string {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return ""
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if cfg == nil {
		// Only whether it answers a handshake at all: nothing is verified or sent after it.
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // a probe
		if err := tc.HandshakeContext(ctx); err == nil || isRemoteAlert(err) {
			return "it speaks TLS, and no TLS is configured: set etcd.cacert (--etcd-cacert) to the CA bundle that signed its certificate"
		}
		return ""
	}
	c := cfg.Clone()
	if c.ServerName == "" {
		c.ServerName, _, _ = net.SplitHostPort(addr)
	}
	c.NextProtos = []string{"h2"}
	tc := tls.Client(conn, c)
	if err := tc.HandshakeContext(ctx); err != nil {
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() || ctx.Err() != nil {
			return "" // a server that answers nothing: not a TLS problem, as far as anyone can tell
		}
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) || !isRemoteAlert(err) && speaksH2(ctx, addr) {
			return "TLS handshake failed: the server does not speak TLS (it answers in plain text): remove etcd.cacert, etcd.cert and etcd.key, or name its TLS port"
		}
		return "TLS handshake failed: " + err.Error()
	}
	// In TLS 1.3 the server judges the client's certificate after the
	// client's side of the handshake is done: its verdict is an alert on
	// the first read. Speak HTTP/2 (the preface) and read its first answer.
	if _, err := tc.Write(h2Preface); err != nil {
		return ""
	}
	var buf [64]byte
	if _, err := tc.Read(buf[:]); err != nil && isRemoteAlert(err) {
		what := "the server refused the client certificate"
		if len(c.Certificates) == 0 && c.GetClientCertificate == nil {
			what = "the server wants a client certificate and none is configured (etcd.cert, etcd.key)"
		}
		return fmt.Sprintf("TLS handshake failed: %s: %v", what, err)
	}
	return ""
}

// h2Preface is what an HTTP/2 (gRPC) client sends first: the preface and an empty SETTINGS frame.
var h2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

// speaksH2 reports whether the server at addr answers HTTP/2 in plain
// text: a server that hung up on a TLS handshake (etcd does) may be one.
func speaksH2(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write(h2Preface); err != nil {
		return false
	}
	var frame [9]byte // a frame header: length (3), type (1), flags, stream id
	_, err = io.ReadFull(conn, frame[:])
	return err == nil && frame[3] == 0x4 // SETTINGS
}

// isRemoteAlert reports whether err is a TLS alert sent by the peer.
func isRemoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// probeTLS runs tlsProbe on the endpoints (the first three, at once, so
// that it adds at most probeTimeout to a failure), once per Store, and
// returns the first cause found, naming the endpoint when there are several.
func (s *Store) probeTLS() string {
	s.probeOnce.Do(func() {
		eps := s.o.Endpoints[:min(len(s.o.Endpoints), 3)]
		causes := make([]string, len(eps))
		var wg sync.WaitGroup
		for i, ep := range eps {
			wg.Go(func() { causes[i] = tlsProbe(context.Background(), ep, s.o.TLS) })
		}
		wg.Wait()
		for i, c := range causes {
			if c != "" {
				if len(s.o.Endpoints) > 1 {
					c = "at " + eps[i] + ": " + c
				}
				s.probe = c
				return
			}
		}
	})
	return s.probe
}
