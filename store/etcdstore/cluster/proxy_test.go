package cluster

import (
	"net"
	"sync"
	"testing"
)

// proxy is a loopback TCP proxy to one member that the test can cut: while
// cut it forwards nothing and accepts nothing, but closes no connection, as
// a network partition behaves (the client learns nothing; its requests time
// out, its keepalive pings go unanswered). (cmd/internal/cli's blackhole,
// for a cluster.)
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	healed *sync.Cond
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target}
	p.healed = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go func() {
			p.wait()
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(s, c)
			go p.pipe(c, s)
		}()
	}
}

// wait blocks while the proxy is cut.
func (p *proxy) wait() {
	p.mu.Lock()
	for p.cut {
		p.healed.Wait()
	}
	p.mu.Unlock()
}

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait() // held, not lost: delivered if the partition heals
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.mu.Unlock()
	p.healed.Broadcast()
}

func (p *proxy) close() {
	p.setCut(false)
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}
