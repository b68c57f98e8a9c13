package etcdtest

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Proxy forwards TCP connections to an address (an etcd member's client
// or peer port) and can stall: then it accepts connections and reads a
// little, but passes no byte on
// in either direction, as a SIGSTOPped member does (its kernel still
// completes TCP handshakes and buffers what is sent).
type Proxy struct {
	Addr   string
	target string
	l      net.Listener

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	conns   []net.Conn
	// Down counts the bytes passed from the target back to the clients.
	Down atomic.Int64
}

// NewProxy starts a proxy to target on a loopback port; it closes when
// the test ends.
func NewProxy(tb TB, target string) *Proxy {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	tb.Cleanup(p.Close)
	return p
}

func (p *Proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go p.pipe(u, c, nil)
		go p.pipe(c, u, &p.Down)
	}
}

func (p *Proxy) pipe(dst, src net.Conn, count *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.stalled {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if count != nil {
				count.Add(int64(n))
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
			}
			return
		}
	}
}

// Stall stops (on) or resumes passing bytes on.
func (p *Proxy) Stall(on bool) {
	p.mu.Lock()
	p.stalled = on
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut closes the connections passing through now (resuming a stall), as a
// network that drops them does; new ones are still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.stalled = false
	p.cond.Broadcast()
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Close closes the proxy and its connections.
func (p *Proxy) Close() {
	p.l.Close()
	p.Stall(false)
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}
