package etcdstore

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// listen serves each connection with serve, on a loopback port.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	return l.Addr().String()
}

// A server that takes the connection and answers nothing is no TLS
// problem: the probe says nothing (the timeout message stands), within
// its own bound.
func TestTLSProbeSilentServer(t *testing.T) {
	addr := listen(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	for _, cfg := range []*tls.Config{nil, {}} {
		start := time.Now()
		if got := tlsProbe(context.Background(), addr, cfg); got != "" {
			t.Errorf("TLS %v: %q, want nothing", cfg != nil, got)
		}
		if el := time.Since(start); el > probeTimeout+500*time.Millisecond {
			t.Errorf("probe took %s, want at most about %s", el, probeTimeout)
		}
	}
}

// A server that answers a ClientHello with plain text.
func TestTLSProbePlainTextServer(t *testing.T) {
	addr := listen(t, func(c net.Conn) { _, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) })
	got := tlsProbe(context.Background(), addr, &tls.Config{})
	if !strings.Contains(got, "TLS handshake failed: the server does not speak TLS") {
		t.Errorf("%q, want a TLS handshake failure naming plain text", got)
	}
	if got := tlsProbe(context.Background(), addr, nil); got != "" {
		t.Errorf("no TLS configured: %q, want nothing (the server does not speak TLS)", got)
	}
}

// Nobody listening: not a TLS problem.
func TestTLSProbeRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if got := tlsProbe(context.Background(), addr, &tls.Config{}); got != "" {
		t.Errorf("%q, want nothing", got)
	}
}
