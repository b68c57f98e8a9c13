package jobserver

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
	"golang.org/x/sys/unix"
)

// The tests run real servers on a real bbolt store with its real clock,
// and clients that read and write the real FIFO.

func newStore(t *testing.T) *boltstore.Store {
	t.Helper()
	s, err := boltstore.New(filepath.Join(t.TempDir(), "slots.db"), boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func enqueue(t *testing.T, s store.Store, slots, weight int) store.Ticket {
	t.Helper()
	tk, err := s.Enqueue(context.Background(), store.EnqueueRequest{ID: gate.NewID(), Limit: "cpu", Slots: slots, Weight: weight,
		TTL: time.Minute, Holder: store.Holder{Host: "h", Pid: os.Getpid(), Argv: []string{"make"}}})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// fast are the test's cadences: a look every 20 ms.
func fast(cfg Config) Config {
	cfg.Tick, cfg.LookEvery, cfg.Grace = 5*time.Millisecond, 20*time.Millisecond, 40*time.Millisecond
	return cfg
}

func open(t *testing.T, cfg Config) *Server {
	t.Helper()
	srv, err := Open(context.Background(), fast(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// weight is the ticket's weight as the store has it.
func weight(t *testing.T, s store.Store, id string) int {
	t.Helper()
	tk, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return tk.Weighs()
}

// eventually polls cond for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client holds the FIFO open as a make 4.4 would (its own read and write
// ends) and takes tokens on request.
type client struct {
	t    *testing.T
	r, w *os.File
	held []byte
}

func newClient(t *testing.T, path string) *client {
	t.Helper()
	r, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, r: r, w: w}
	t.Cleanup(c.close)
	return c
}

// take reads one token, waiting for it up to 5 s.
func (c *client) take() {
	c.t.Helper()
	_ = c.r.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 1)
	if _, err := c.r.Read(b); err != nil {
		c.t.Fatalf("client: read a token: %v", err)
	}
	c.held = append(c.held, b[0])
}

// give writes back one token it holds.
func (c *client) give() {
	c.t.Helper()
	b := c.held[len(c.held)-1:]
	c.held = c.held[:len(c.held)-1]
	if _, err := c.w.Write(b); err != nil {
		c.t.Fatalf("client: give back a token: %v", err)
	}
}

// close closes its ends without giving anything back: a client that dies.
func (c *client) close() {
	c.r.Close()
	c.w.Close()
}

// Two tokens in a client's hands are never taken back: a waiter that needs
// them waits until the client gives them back, and gets its slots then.
func TestTakesBackOnlyUnreadTokens(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 4, 1)
	srv := open(t, Config{Store: s, Ticket: a, Style: FIFO})
	c := newClient(t, srv.Path())
	srv.Start(context.Background())
	c.take()
	c.take()
	// Every token is in use: it grows once more, and that token stays unread.
	eventually(t, 2*time.Second, "a third extra slot", func() bool { return weight(t, s, a.ID) == 4 })
	eventually(t, time.Second, "one unread token", func() bool { return srv.Unread() == 1 })
	if got := srv.InUse(); got != 2 {
		t.Fatalf("tokens in use: %d, want 2", got)
	}

	b := enqueue(t, s, 4, 3) // needs 3 slots: one unread token can be given back, the two in use cannot
	if b.State != store.Waiting {
		t.Fatalf("b: %s, want waiting", b.State)
	}
	eventually(t, 2*time.Second, "the unread token given back", func() bool { return weight(t, s, a.ID) <= 3 })
	if w := weight(t, s, a.ID); w < 3 {
		t.Fatalf("weight %d with 2 tokens in use: a token in use was taken back", w)
	}
	for range 20 { // the server tries all along: it must not take the client's two
		time.Sleep(10 * time.Millisecond)
		if w := weight(t, s, a.ID); w < 3 {
			t.Fatalf("weight %d with 2 tokens in use: a token in use was taken back", w)
		}
	}
	if got, _ := s.Get(context.Background(), b.ID); got.State != store.Waiting {
		t.Fatalf("b: %s, want still waiting", got.State)
	}
	c.give()
	eventually(t, 2*time.Second, "a returned token taken back", func() bool { return weight(t, s, a.ID) == 2 })
	c.give()
	eventually(t, 2*time.Second, "b admitted", func() bool {
		got, err := s.Get(context.Background(), b.ID)
		return err == nil && got.State == store.Held
	})
	if w := weight(t, s, a.ID); w != 1 {
		t.Fatalf("a weighs %d, want 1 (it gave back all three)", w)
	}
	// The server counts a resize once the store's answer is back: the store
	// can show the weight a moment before the stats do.
	eventually(t, 2*time.Second, "stats of 3 grown, 3 given back", func() bool {
		st := srv.Stats()
		return st.Shrunk == 3 && st.Grown == 3
	})
}

// A client that dies holding a token: that slot stays taken (the server
// cannot tell it from one in use) until the ticket is released.
func TestDeadClientKeepsItsSlotUntilRelease(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 2, 1)
	srv := open(t, Config{Store: s, Ticket: a, Style: FIFO})
	c := newClient(t, srv.Path())
	srv.Start(context.Background())
	c.take()
	c.close() // dies with it
	eventually(t, 2*time.Second, "weight 2", func() bool { return weight(t, s, a.ID) == 2 })
	b := enqueue(t, s, 2, 1)
	time.Sleep(200 * time.Millisecond)
	if w := weight(t, s, a.ID); w != 2 {
		t.Fatalf("weight %d: the dead client's token was taken back", w)
	}
	if got, _ := s.Get(context.Background(), b.ID); got.State != store.Waiting {
		t.Fatalf("b: %s, want waiting", got.State)
	}
	srv.Close()
	if _, err := s.Release(context.Background(), srv.Ticket(), store.Released); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(context.Background(), b.ID); got.State != store.Held {
		t.Fatalf("b: %s after the release, want held", got.State)
	}
}

// With no client at all it takes one slot more than it uses, never more.
func TestGrowsOnlyWhileEveryTokenIsInUse(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 6, 1)
	srv := open(t, Config{Store: s, Ticket: a, Style: FIFO})
	srv.Start(context.Background())
	eventually(t, 2*time.Second, "weight 2", func() bool { return weight(t, s, a.ID) == 2 })
	time.Sleep(200 * time.Millisecond)
	if w := weight(t, s, a.ID); w != 2 {
		t.Fatalf("weight %d with one token unread: grew past what it uses", w)
	}
}

// --jobserver-max bounds the weight.
func TestMaxBoundsTheWeight(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 6, 1)
	srv := open(t, Config{Store: s, Ticket: a, Style: FIFO, Max: 3})
	c := newClient(t, srv.Path())
	srv.Start(context.Background())
	c.take()
	c.take()
	time.Sleep(200 * time.Millisecond)
	if w := weight(t, s, a.ID); w != 3 {
		t.Fatalf("weight %d, want the max 3", w)
	}
	if srv.MakeFlags("") != "-j3 --jobserver-auth=fifo:"+srv.Path() {
		t.Fatalf("MAKEFLAGS %q", srv.MakeFlags(""))
	}
}

// Cap bounds the default Max (the limit's size): a limit of 5000 slots
// gives a build Cap jobs, not 5000; an explicit Max is not capped.
func TestCapBoundsTheDefaultMax(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 5000, 1)
	if srv := open(t, Config{Store: s, Ticket: a, Style: FIFO, Cap: 4}); srv.Max() != 4 {
		t.Errorf("limit of 5000, cap 4: max %d, want 4", srv.Max())
	}
	if srv := open(t, Config{Store: s, Ticket: a, Style: FIFO, Cap: 4, Max: 5000}); srv.Max() != 5000 {
		t.Errorf("max 5000, cap 4: max %d, want the explicit 5000", srv.Max())
	}
	s2 := newStore(t)
	b := enqueue(t, s2, 2, 1)
	if srv := open(t, Config{Store: s2, Ticket: b, Style: FIFO, Cap: 4}); srv.Max() != 2 {
		t.Errorf("limit of 2, cap 4: max %d, want the limit's 2", srv.Max())
	}
}

// A make-like client: it takes every token it can and gives each back
// after hold, running at most jobs at once (its implicit slot included).
type greedy struct {
	r, w    *os.File
	running atomic.Int32
	peak    atomic.Int32
	wg      sync.WaitGroup
}

func startGreedy(t *testing.T, path string, hold time.Duration) *greedy {
	t.Helper()
	r, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	g := &greedy{r: r, w: w}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			b := make([]byte, 1)
			if _, err := r.Read(b); err != nil {
				return
			}
			n := g.running.Add(1)
			if n > g.peak.Load() {
				g.peak.Store(n)
			}
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				time.Sleep(hold)
				g.running.Add(-1)
				_, _ = w.Write(b)
			}()
		}
	}()
	t.Cleanup(g.stop)
	return g
}

func (g *greedy) stop() {
	g.r.Close()
	g.wg.Wait()
	g.w.Close()
}

// A second build that arrives while the first holds the whole limit gets
// its fair share: it waits, the first gives back a token for it, and then
// more until they split the limit. How soon is logged, not asserted
// (0.1-0.5 s on an idle machine): the bounds are what a loaded machine
// needs, far beyond a server that never gives back.
func TestSecondBuildGetsItsShare(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 6, 1)
	sa := open(t, Config{Store: s, Ticket: a, Style: FIFO})
	startGreedy(t, sa.Path(), 30*time.Millisecond)
	sa.Start(context.Background())
	eventually(t, 3*time.Second, "a takes the whole limit", func() bool { return weight(t, s, a.ID) == 6 })

	start := time.Now()
	id := gate.NewID()
	b, err := s.Enqueue(context.Background(), store.EnqueueRequest{ID: id, Limit: "cpu", Slots: 6, TTL: time.Minute, Holder: store.Holder{Host: "h", Pid: os.Getpid()}})
	if err != nil || b.State != store.Waiting {
		t.Fatalf("b: %v %v, want waiting", b.State, err)
	}
	eventually(t, 15*time.Second, "b admitted", func() bool {
		got, err := s.Get(context.Background(), id)
		b = got
		return err == nil && got.State == store.Held
	})
	sb := open(t, Config{Store: s, Ticket: b, Style: FIFO})
	startGreedy(t, sb.Path(), 30*time.Millisecond)
	sb.Start(context.Background())
	eventually(t, 15*time.Second, "b takes 3 slots", func() bool { return weight(t, s, id) >= 3 })
	t.Logf("b had 3 slots %s after it arrived", time.Since(start).Round(time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	if wa, wb := weight(t, s, a.ID), weight(t, s, id); wa+wb > 6 || wa < 2 || wb < 2 {
		t.Fatalf("weights %d and %d: want a fair split of 6", wa, wb)
	}
}

// A server whose ticket is gone stops on its own.
func TestStopsWhenTheTicketIsGone(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 6, 1)
	srv := open(t, Config{Store: s, Ticket: a, Style: FIFO})
	c := newClient(t, srv.Path())
	srv.Start(context.Background())
	c.take()
	eventually(t, 2*time.Second, "weight 2", func() bool { return weight(t, s, a.ID) == 2 })
	if _, err := s.Release(context.Background(), a, store.ForceReleased); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.done:
	case <-time.After(2 * time.Second):
		t.Fatal("the server still runs after its ticket was removed")
	}
}

// The pipe style: the child's descriptors work, no path is left, and the
// server's own end stays non-blocking whatever the child does to its own.
func TestPipeStyle(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 6, 2)
	srv := open(t, Config{Store: s, Ticket: a, Style: Pipe, FirstFD: 3})
	if srv.Path() != "" || srv.dir != "" {
		t.Fatalf("pipe style left a path: %q %q", srv.Path(), srv.dir)
	}
	if got := srv.MakeFlags("k"); got != "k -j6 --jobserver-auth=3,4" {
		t.Fatalf("MAKEFLAGS %q", got)
	}
	files := srv.ChildFiles()
	if len(files) != 2 {
		t.Fatalf("%d child files", len(files))
	}
	if srv.Unread() != 1 {
		t.Fatalf("unread %d: want the one token of weight 2", srv.Unread())
	}
	b := make([]byte, 1)
	if _, err := files[0].Read(b); err != nil || b[0] != token {
		t.Fatalf("read %q %v", b, err)
	}
	if srv.Unread() != 0 || srv.InUse() != 1 {
		t.Fatalf("unread %d, in use %d: want 0 and 1", srv.Unread(), srv.InUse())
	}
	if _, err := files[1].Write(b); err != nil {
		t.Fatal(err)
	}
	if got := srv.take(1, 0); got != 1 {
		t.Fatalf("took back %d, want the returned token", got)
	}
	if got := srv.take(1, 0); got != 0 {
		t.Fatalf("took back %d from an empty pipe without waiting, want 0", got)
	}
}

// The FIFO is in a private directory, which Close removes.
func TestFIFODirectory(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 6, 1)
	srv, err := Open(context.Background(), Config{Store: s, Ticket: a, Style: FIFO, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(srv.Path())
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("directory %s: %v %v, want 0700", dir, st.Mode(), err)
	}
	if fi, err := os.Lstat(srv.Path()); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("fifo %s: %v", srv.Path(), err)
	}
	if srv.Max() != 6 {
		t.Fatalf("max %d, want the limit's size 6", srv.Max())
	}
	srv.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s after Close: %v", dir, err)
	}
}

func TestMakeFlags(t *testing.T) {
	for _, tc := range []struct{ old, want string }{
		{"", "-j4 --jobserver-auth=fifo:/p"},
		{"k", "k -j4 --jobserver-auth=fifo:/p"},
		{"ks -j3 --jobserver-auth=3,4 -- FOO=1", "ks -j4 --jobserver-auth=fifo:/p -- FOO=1"},
		{" -j --jobserver-fds=5,6 --jobs=9", "-j4 --jobserver-auth=fifo:/p"},
		{"s -- X=a\\ b -j9", "s -j4 --jobserver-auth=fifo:/p -- X=a\\ b -j9"},
		{"-jx --jobserver-style=pipe", "-jx -j4 --jobserver-auth=fifo:/p"},
	} {
		if got := MakeFlags(tc.old, 4, "fifo:/p"); got != tc.want {
			t.Errorf("MakeFlags(%q) = %q, want %q", tc.old, got, tc.want)
		}
	}
}

// cpuTime is the CPU time this process has used (user and system).
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A server with nothing to do (a build that runs one job at a time: one
// unread token, a limit with free slots, nobody waiting) costs little: it
// reads FIONREAD every tick and the store every look. Measured by this
// process's CPU time over 2 s with the default cadences; the bound is loose
// (a loaded machine), the figure is logged.
func TestIdleCost(t *testing.T) {
	longtest.Skip(t, "measures CPU time, 3 s a case")
	for _, tc := range []struct {
		name   string
		slots  int
		others int // weight of another holder
	}{{"free slots", 6, 0}, {"full limit", 6, 5}, {"the whole limit, a token unread", 2, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := boltstore.New(filepath.Join(t.TempDir(), "slots.db"), boltstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			a := enqueue(t, s, tc.slots, 1)
			if tc.others > 0 {
				enqueue(t, s, tc.slots, tc.others)
			}
			srv, err := Open(context.Background(), Config{Store: s, Ticket: a, Style: FIFO})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			srv.Start(context.Background())
			if tc.others == 0 {
				eventually(t, 2*time.Second, "one unread token", func() bool { return srv.Unread() == 1 })
			}
			time.Sleep(1200 * time.Millisecond) // past the first second's quicker looks
			const d = 2 * time.Second
			c0, l0 := cpuTime(t), srv.Stats().Looks
			time.Sleep(d)
			used, looks := cpuTime(t)-c0, srv.Stats().Looks-l0
			share := float64(used) / float64(d) * 100
			t.Logf("idle jobserver (%s): %s of CPU in %s (%.2f%% of one core), %d store reads", tc.name, used.Round(time.Microsecond), d, share, looks)
			if share > 2 {
				t.Errorf("idle jobserver used %.2f%% of one core, want well under 1%%", share)
			}
			if st := srv.Stats(); st.Resizes > 1 {
				t.Errorf("idle jobserver resized %d times", st.Resizes)
			}
		})
	}
}

// A plain job (weight 1, no jobserver) beside a build: the build gives back
// above its share once, takes the slots again when nobody wants them within
// the grace, and tries again only after a doubling backoff, not every look.
func TestRebalanceBacksOffForAPlainHolder(t *testing.T) {
	s := newStore(t)
	enqueue(t, s, 6, 1) // the plain job
	a := enqueue(t, s, 6, 1)
	srv := open(t, Config{Store: s, Ticket: a, Style: FIFO})
	startGreedy(t, srv.Path(), 20*time.Millisecond)
	srv.Start(context.Background())
	eventually(t, 3*time.Second, "the build takes the rest", func() bool { return weight(t, s, a.ID) == 5 })
	time.Sleep(2 * time.Second)
	st := srv.Stats()
	t.Logf("in about 2 s: %+v", st)
	// At the 1 s backoff, then 2 s: at most three rounds of 2 slots.
	if st.Shrunk > 6 {
		t.Errorf("gave back %d slots in about 2 s to a holder that takes none: no backoff", st.Shrunk)
	}
	eventually(t, time.Second, "the build holds the rest again", func() bool { return weight(t, s, a.ID) == 5 })
}

// A client that writes back more than it took cannot make tokens: the
// surplus is discarded, and the tokens out never exceed the extra slots.
func TestSurplusTokensDiscarded(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 6, 1)
	srv := open(t, Config{Store: s, Ticket: a, Style: FIFO, Max: 2})
	c := newClient(t, srv.Path())
	srv.Start(context.Background())
	eventually(t, 2*time.Second, "weight 2, its token unread", func() bool { return weight(t, s, a.ID) == 2 && srv.Unread() == 1 })
	if _, err := c.w.Write([]byte("+++")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the surplus discarded", func() bool { return srv.Unread() == 1 })
	if st := srv.Stats(); st.Dropped != 3 {
		t.Fatalf("dropped %d bytes, want 3", st.Dropped)
	}
	if w := weight(t, s, a.ID); w != 2 {
		t.Fatalf("weight %d, want 2", w)
	}
}

// blockingClient is a client as Rust's jobserver crate is (cargo, rustc):
// workers blocked in read(2) on a blocking descriptor, each of which holds
// the token it reads for hold, writes it back and reads again at once. A
// returned token wakes one worker blocked in read(2), and the worker that
// returned it reads again within microseconds: the server, which waits in
// Go's poller, competes with both.
type blockingClient struct {
	r, w int
	stop atomic.Bool
	wg   sync.WaitGroup
}

func startBlockingClient(t *testing.T, path string, workers int, hold time.Duration) *blockingClient {
	t.Helper()
	r, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(r, false); err != nil {
		t.Fatal(err)
	}
	w, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &blockingClient{r: r, w: w}
	for range workers {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			b := make([]byte, 1)
			for {
				if n, err := unix.Read(r, b); n != 1 || err != nil || c.stop.Load() {
					return
				}
				time.Sleep(hold)
				_, _ = unix.Write(w, b)
			}
		}()
	}
	t.Cleanup(c.close)
	return c
}

// close wakes the workers blocked in read(2), a byte at a time until all
// are gone (the server may read some of them), and waits for them.
func (c *blockingClient) close() {
	c.stop.Store(true)
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	for {
		_, _ = unix.Write(c.w, []byte{token})
		select {
		case <-done:
			unix.Close(c.r)
			unix.Close(c.w)
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// A build whose client returns each token and reads one again at once
// (Rust's jobserver crate, blocked in read(2)) still gives back for a
// waiter: the server wins returned tokens from the blocked readers often
// enough. How soon is logged, not asserted (0.03-0.4 s on an idle machine,
// about a second with every core busy): the bound is what a loaded
// machine needs, far beyond a server that never wins.
func TestGivesBackToAClientThatReadsAgainAtOnce(t *testing.T) {
	s := newStore(t)
	a := enqueue(t, s, 4, 1)
	srv, err := Open(context.Background(), Config{Store: s, Ticket: a, Style: FIFO})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	startBlockingClient(t, srv.Path(), 6, 50*time.Millisecond)
	srv.Start(context.Background())
	eventually(t, 5*time.Second, "a takes the whole limit", func() bool { return weight(t, s, a.ID) == 4 })

	start := time.Now()
	id := gate.NewID()
	b, err := s.Enqueue(context.Background(), store.EnqueueRequest{ID: id, Limit: "cpu", Slots: 4, TTL: time.Minute, Holder: store.Holder{Host: "h", Pid: os.Getpid()}})
	if err != nil || b.State != store.Waiting {
		t.Fatalf("b: %v %v, want waiting", b.State, err)
	}
	eventually(t, 15*time.Second, "b admitted", func() bool {
		got, err := s.Get(context.Background(), id)
		return err == nil && got.State == store.Held
	})
	t.Logf("b admitted %s after it arrived; %+v", time.Since(start).Round(time.Millisecond), srv.Stats())
}
