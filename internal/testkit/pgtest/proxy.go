package pgtest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A Proxy relays connections to a test database and can lose the answer
// of a COMMIT after the server ran it, as a connection cut at that moment
// would: the client's commit has an unknown outcome.
type Proxy struct {
	// URL is the database's URL through the proxy.
	URL string

	netw   string // "unix" or "tcp"
	target string // the server's address on netw
	ln     net.Listener
	armed  atomic.Pointer[func()] // set: the next COMMIT loses its answer, and this runs before the cut
	lost   atomic.Int32
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

// NewProxy starts a proxy in front of the database of rawURL (as URL or
// NewDB give it), on a Unix socket, stopped when t ends.
func NewProxy(t testing.TB, rawURL string) *Proxy {
	t.Helper()
	cfg, err := pgconn.ParseConfig(rawURL)
	if err != nil {
		t.Fatalf("pgtest: proxy of %s: %v", rawURL, err)
	}
	p := &Proxy{netw: "tcp", target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), conns: map[net.Conn]bool{}}
	if filepath.IsAbs(cfg.Host) {
		p.netw, p.target = "unix", filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	}
	dir, err := os.MkdirTemp("", "pgproxy") // short: a socket's path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	p.ln, err = net.Listen("unix", filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", cfg.Port)))
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("pgtest: proxy: %v", err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("host", dir)
	q.Set("port", strconv.Itoa(int(cfg.Port)))
	q.Set("sslmode", "disable")
	u.Host, u.RawQuery = "", q.Encode()
	p.URL = u.String()
	accepting := make(chan struct{})
	go func() { defer close(accepting); p.accept() }()
	t.Cleanup(func() {
		p.ln.Close()
		<-accepting // then no pair is tracked after the ones closed here
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
		os.RemoveAll(dir)
	})
	return p
}

// LoseNextCommit makes the next COMMIT through the proxy lose its answer:
// the server runs it and answers, and the proxy then cuts the connection
// instead of passing the answer on.
func (p *Proxy) LoseNextCommit() { p.LoseNextCommitThen(func() {}) }

// LoseNextCommitThen is LoseNextCommit, with then run after the server
// answered the COMMIT and before the connection is cut: what another
// client does while the store does not know how its step ended.
func (p *Proxy) LoseNextCommitThen(then func()) { p.armed.Store(&then) }

// Lost is how many answers the proxy has lost.
func (p *Proxy) Lost() int { return int(p.lost.Load()) }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial(p.netw, p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c, s)
		var dropping atomic.Pointer[func()]
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.toServer(c, s, &dropping) }()
		go func() { defer p.wg.Done(); p.toClient(s, c, &dropping) }()
	}
}

// track remembers a relayed pair, for Cleanup to close.
func (p *Proxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = true
	}
}

// toServer relays the client's messages, marking the connection to drop
// the answers once it passes on an armed COMMIT.
func (p *Proxy) toServer(c, s net.Conn, dropping *atomic.Pointer[func()]) {
	defer s.Close()
	r, w := bufio.NewReader(c), bufio.NewWriter(s)
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil { // the startup message has no type byte
		return
	}
	n := int(binary.BigEndian.Uint32(head[:]))
	if n < 4 || n > 1<<20 {
		return
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return
	}
	if _, err := w.Write(append(head[:], body...)); err != nil || w.Flush() != nil {
		return
	}
	for {
		typ, msg, err := readMessage(r)
		if err != nil {
			return
		}
		if typ == 'Q' && bytes.EqualFold(bytes.TrimRight(msg[5:], "\x00; "), []byte("commit")) {
			if then := p.armed.Swap(nil); then != nil {
				dropping.Store(then)
			}
		}
		if !relay(w, msg, r) {
			return
		}
	}
}

// toClient relays the server's bytes as they come. Once dropping, it reads
// messages to the end of the commit's answer (ReadyForQuery) and then cuts
// both sides. The answer starts a read: the client sent the COMMIT only
// once it had every answer before it, and the mark is set before the
// COMMIT is passed on.
func (p *Proxy) toClient(s, c net.Conn, dropping *atomic.Pointer[func()]) {
	defer c.Close()
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if then := dropping.Load(); n > 0 && then != nil {
			p.dropAnswer(io.MultiReader(bytes.NewReader(buf[:n]), s), *then)
			return
		}
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// dropAnswer reads the server's messages up to ReadyForQuery, passing none
// on, and runs then.
func (p *Proxy) dropAnswer(r io.Reader, then func()) {
	for {
		typ, _, err := readMessage(r)
		if err != nil {
			return
		}
		if typ == 'Z' {
			then()
			p.lost.Add(1)
			return
		}
	}
}

// relay writes msg, and sends what it has written once nothing more has
// come in (a batch of messages goes on as one write, as it came).
func relay(w *bufio.Writer, msg []byte, r *bufio.Reader) bool {
	if _, err := w.Write(msg); err != nil {
		return false
	}
	return r.Buffered() > 0 || w.Flush() == nil
}

// readMessage reads one typed message of the protocol, whole.
func readMessage(r io.Reader) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n < 4 || n > 1<<30 {
		return 0, nil, errors.New("pgtest: proxy: a message of a bad length")
	}
	msg := make([]byte, 1+n)
	copy(msg, head[:])
	if _, err := io.ReadFull(r, msg[5:]); err != nil {
		return 0, nil, err
	}
	return head[0], msg, nil
}
