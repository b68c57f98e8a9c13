package jobserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/store"
)

// Style is how a client finds the jobserver.
type Style string

// The styles.
const (
	// FIFO: --jobserver-auth=fifo:PATH, a named pipe in a private
	// directory (GNU make 4.4 and later, cargo's jobserver crate 0.1.26 and
	// later, ninja 1.13 and later).
	FIFO Style = "fifo"
	// Pipe: --jobserver-auth=R,W, two descriptors the child inherits
	// (GNU make 4.2 and later, cargo's jobserver crate).
	Pipe Style = "pipe"
)

// Defaults of Config.
const (
	// DefaultTick is how often the server reads how many tokens are
	// unread while the ticket could grow, and how long one attempt to read
	// back a returned token waits.
	DefaultTick = 20 * time.Millisecond
	// DefaultLookEvery is how often the server reads the store (one
	// Snapshot of the ticket's limits): who waits, what is free. A build
	// that arrives later is seen within it.
	DefaultLookEvery = 250 * time.Millisecond
	// DefaultGrace: at or above its fair share, a build takes a free slot
	// only once it has been free this long, so that a build below its
	// share (which looks every DefaultLookEvery) gets it first.
	DefaultGrace = 2 * DefaultLookEvery
)

// Rebalancing backoff: giving back slots above the fair share to a holder
// that then does not take them (it is no build) is tried again only after
// this, doubled each time, up to the maximum; a new holder resets it.
const (
	minRebalanceBackoff = time.Second
	maxRebalanceBackoff = 30 * time.Second
)

// maxIdleTick is the longest a server that could grow waits between two
// reads of FIONREAD: a build that needs another token after leaving one
// unread for a while gets it within this.
const maxIdleTick = 100 * time.Millisecond

// token is the byte the server writes; clients give back the byte they read.
const token = '+'

// Store is the part of store.Store a Server uses.
type Store interface {
	Resize(ctx context.Context, t store.Ticket, weight int) (store.Ticket, error)
	Snapshot(ctx context.Context, limits ...string) (store.Snapshot, error)
}

// Config is one jobserver.
type Config struct {
	Store Store
	// Ticket is the job's held ticket; its weight is where the server starts.
	Ticket store.Ticket
	// Max is the most slots the ticket may reach, its first included;
	// 0 means the smallest size of its limits (read at Open), bounded by Cap.
	Max int
	// Cap, when above 0, bounds the default Max: any member can resize a
	// shared limit, and a limit of thousands must not make a build run
	// thousands of jobs on one host (the caller passes the host's CPUs).
	Cap int
	// Style: "" means Pipe.
	Style Style
	// Dir is where the private directory of the FIFO is made; "" means
	// os.TempDir().
	Dir string
	// FirstFD is the descriptor the child sees ChildFiles()[0] as (Pipe
	// style): 0 means 3, the first of exec.Cmd.ExtraFiles.
	FirstFD int
	// Tick, LookEvery and Grace: 0 means the defaults.
	Tick, LookEvery, Grace time.Duration
	// Logf, if not nil, is told when the ticket grows or shrinks.
	Logf func(format string, args ...any)
}

// Stats counts what a Server did.
type Stats struct {
	Grown, Shrunk int // slots taken, and given back, through Resize
	MaxWeight     int // the most the ticket weighed
	Looks         int // Snapshots read
	Resizes       int // Resize calls
	Dropped       int // bytes a client wrote beyond the tokens it took, discarded
}

// A Server is one job's jobserver. Its methods are safe to call from
// several goroutines.
type Server struct {
	cfg  Config
	max  int
	dir  string // the private directory ("" once removed)
	path string // the FIFO (FIFO style)
	own  *os.File
	raw  rawConn
	// The child's ends (Pipe style), until CloseChildFiles.
	childR, childW *os.File

	mu     sync.Mutex
	t      store.Ticket // the ticket as the last Resize returned it
	inHand int          // tokens read back and not yet given back to the store
	lost   error        // a Resize said the ticket is gone: the server stops
	stats  Stats

	cancel context.CancelFunc
	done   chan struct{}
}

type rawConn interface {
	Control(f func(fd uintptr)) error
	Read(f func(fd uintptr) bool) error
}

// Open makes the jobserver's FIFO and puts one token in it for each slot
// cfg.Ticket holds beyond the first. With cfg.Max 0 it reads the sizes of
// the ticket's limits. Call Start once the child runs, and Close after it
// (and its process group) is gone.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Ticket.State != store.Held {
		return nil, fmt.Errorf("%w: a jobserver needs a store and a held ticket", store.ErrInvalid)
	}
	switch cfg.Style {
	case "":
		cfg.Style = Pipe
	case FIFO, Pipe:
	default:
		return nil, fmt.Errorf("%w: jobserver style %q: want fifo or pipe", store.ErrInvalid, cfg.Style)
	}
	if cfg.Max < 0 || cfg.Max > store.MaxSlots {
		return nil, fmt.Errorf("%w: jobserver max %d: want 1..%d", store.ErrInvalid, cfg.Max, store.MaxSlots)
	}
	if cfg.FirstFD == 0 {
		cfg.FirstFD = 3
	}
	cfg.Tick = orDefault(cfg.Tick, DefaultTick)
	cfg.LookEvery = orDefault(cfg.LookEvery, DefaultLookEvery)
	cfg.Grace = orDefault(cfg.Grace, DefaultGrace)
	s := &Server{cfg: cfg, max: cfg.Max, t: cfg.Ticket, done: make(chan struct{})}
	if s.max == 0 {
		snap, err := cfg.Store.Snapshot(ctx, cfg.Ticket.Names()...)
		if err != nil {
			return nil, fmt.Errorf("read the sizes of the limits of ticket %s: %w", cfg.Ticket.ID, err)
		}
		s.max = look(snap, cfg.Ticket).size
		if cfg.Cap > 0 {
			s.max = min(s.max, cfg.Cap)
		}
	}
	s.max = max(s.max, 1)
	if err := s.makeFIFO(); err != nil {
		s.removeDir()
		return nil, err
	}
	if extra := s.t.Weighs() - 1; extra > 0 {
		if err := s.put(extra); err != nil {
			s.Close()
			return nil, err
		}
	}
	s.stats.MaxWeight = s.t.Weighs()
	return s, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// makeFIFO makes the FIFO in a new directory only this user can enter, and
// opens the server's own end (read and write, non-blocking, in Go's poller:
// a read of a returned token waits without a thread). The pipe style also
// opens the child's ends and unlinks the FIFO at once: the child inherits
// descriptors and no path is left.
func (s *Server) makeFIFO() error {
	dir, err := os.MkdirTemp(s.cfg.Dir, "slotctl-jobserver-") // 0700
	if err != nil {
		return fmt.Errorf("make the jobserver's directory: %w", err)
	}
	s.dir = dir
	s.path = filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(s.path, 0o600); err != nil {
		return fmt.Errorf("make the jobserver's fifo %s: %w", s.path, err)
	}
	// O_RDWR: the server is a reader and a writer, so clients' opens never
	// block and a client that closes never makes it see end of file.
	fd, err := unix.Open(s.path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open the jobserver's fifo %s: %w", s.path, err)
	}
	s.own = os.NewFile(uintptr(fd), s.path)
	raw, err := s.own.SyscallConn()
	if err != nil {
		return err
	}
	s.raw = raw
	if s.cfg.Style == Pipe {
		// Their own open file descriptions, blocking: make sets O_NONBLOCK
		// on its read end, and that must not change the server's, nor the
		// server's a client's that reads without poll.
		r, err := unix.Open(s.path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("open the jobserver's fifo %s: %w", s.path, err)
		}
		if err := unix.SetNonblock(r, false); err != nil {
			unix.Close(r)
			return err
		}
		w, err := unix.Open(s.path, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			unix.Close(r)
			return fmt.Errorf("open the jobserver's fifo %s: %w", s.path, err)
		}
		s.childR, s.childW = os.NewFile(uintptr(r), "jobserver-r"), os.NewFile(uintptr(w), "jobserver-w")
		s.removeDir()
	}
	return nil
}

func (s *Server) removeDir() {
	if s.dir != "" {
		_ = os.Remove(s.path)
		_ = os.Remove(s.dir)
		s.dir = ""
	}
}

// Path is the FIFO's path (FIFO style), "" in the pipe style.
func (s *Server) Path() string {
	if s.cfg.Style == Pipe {
		return ""
	}
	return s.path
}

// Max is the most slots the ticket may reach.
func (s *Server) Max() int { return s.max }

// ChildFiles are the descriptors the child must inherit (Pipe style: the
// read and the write end, at Config.FirstFD and the one after); nil in the
// FIFO style.
func (s *Server) ChildFiles() []*os.File {
	if s.childR == nil {
		return nil
	}
	return []*os.File{s.childR, s.childW}
}

// CloseChildFiles closes the server's copies of the child's descriptors,
// once the child has inherited them.
func (s *Server) CloseChildFiles() {
	if s.childR != nil {
		s.childR.Close()
		s.childW.Close()
		s.childR, s.childW = nil, nil
	}
}

// Auth is the value of --jobserver-auth for the child.
func (s *Server) Auth() string {
	if s.cfg.Style == Pipe {
		return strconv.Itoa(s.cfg.FirstFD) + "," + strconv.Itoa(s.cfg.FirstFD+1)
	}
	return "fifo:" + s.path
}

// MakeFlags is the child's MAKEFLAGS: old without its -j, --jobs and
// --jobserver-* words, with -jMax and this server's --jobserver-auth.
func (s *Server) MakeFlags(old string) string {
	return MakeFlags(old, s.max, s.Auth())
}

// Ticket is the ticket as the store last returned it (its weight).
func (s *Server) Ticket() store.Ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t
}

// Stats are what the server did so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Start runs the server until ctx is done or Close.
func (s *Server) Start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	go s.run(ctx)
}

// Close stops the server and waits for it, closes its descriptors and
// removes its directory. The ticket keeps its weight: the release that
// follows frees it all. Close is idempotent.
func (s *Server) Close() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
		s.cancel = nil
	}
	s.CloseChildFiles()
	if s.own != nil {
		s.own.Close()
		s.own = nil
	}
	s.removeDir()
}

// Unread is how many tokens wait in the FIFO, unread (FIONREAD).
func (s *Server) Unread() int {
	n := 0
	_ = s.raw.Control(func(fd uintptr) {
		v, err := unix.IoctlGetInt(int(fd), fionread)
		if err == nil {
			n = v
		}
	})
	return n
}

// InUse is how many tokens clients hold: the extra slots less the unread
// tokens and those read back.
func (s *Server) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return inUse(s.t.Weighs(), s.inHand, s.Unread())
}

// inUse: a ticket of weight w has w-1 tokens out, unread in the FIFO, in
// clients' hands, or read back by the server (inHand).
func inUse(weight, inHand, unread int) int {
	return max(weight-1-inHand-unread, 0)
}

// put writes n tokens.
func (s *Server) put(n int) error {
	b := make([]byte, n)
	for i := range b {
		b[i] = token
	}
	_, err := s.own.Write(b)
	return err
}

// take reads back at most n unread tokens. wait bounds how long it waits
// for one to come back (0: not at all). It never blocks a thread: the
// descriptor is non-blocking and waits in Go's poller.
func (s *Server) take(n int, wait time.Duration) int {
	if n <= 0 {
		return 0
	}
	buf := make([]byte, n)
	got := 0
	var deadline time.Time
	if wait > 0 {
		deadline = time.Now().Add(wait)
	}
	_ = s.own.SetReadDeadline(deadline)
	_ = s.raw.Read(func(fd uintptr) bool {
		m, err := unix.Read(int(fd), buf)
		if m > 0 {
			got = m
			return true
		}
		return wait == 0 || !errors.Is(err, unix.EAGAIN)
	})
	_ = s.own.SetReadDeadline(time.Time{})
	return got
}

// loop is the state of the server's loop between rounds.
type loop struct {
	v         view      // the last look
	seen      bool      // v is set
	started   time.Time // when the server started
	nextLook  time.Time // when to read the store next (zero: now)
	freeSince time.Time // since when a free slot has been seen (zero: none)
	holders   map[string]bool
	// Rebalancing (giving back above the fair share): not before noRebal;
	// backoff is the next wait, doubled each time it did not help.
	noRebal time.Time
	backoff time.Duration
	// rebalanced: slots were given back for a fairer split since the
	// last grace growth.
	rebalanced bool
	tick       time.Duration // the next wait between two FIONREAD reads while it could grow
	step       int           // the next growth below the share
}

// run is the server's loop: read the store every LookEvery, give slots
// back when others need them, grow while every token is in use.
func (s *Server) run(ctx context.Context) {
	defer close(s.done)
	l := &loop{started: time.Now(), backoff: minRebalanceBackoff, tick: s.cfg.Tick, step: 1}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ctx.Err() == nil {
		now := time.Now()
		if !now.Before(l.nextLook) && !s.observe(ctx, l, now) {
			return // the ticket is gone
		}
		if s.lostErr() != nil {
			return
		}
		w := s.Ticket().Weighs()
		if give, rebalance := l.toGive(w, now); give > 0 || s.inHandNow() > 0 {
			if s.giveRound(ctx, l, give) && rebalance {
				l.rebalanced = true
			}
			continue
		}
		canGrow := l.seen && !l.v.waiting && l.v.free > 0 && w < s.max
		if canGrow {
			s.growRound(ctx, l, w, now)
		}
		sleep := time.Until(l.nextLook)
		if canGrow {
			// While the build leaves a token unread, look less often: it
			// has what it uses. A grant starts again from Tick.
			sleep = min(sleep, l.tick)
			l.tick = min(2*l.tick, maxIdleTick)
		}
		timer.Reset(max(sleep, time.Millisecond))
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}
}

// observe reads the store into l, and schedules the next look. It reports
// false when the ticket is gone (the server stops).
func (s *Server) observe(ctx context.Context, l *loop, now time.Time) bool {
	every := s.cfg.LookEvery
	switch {
	case now.Sub(l.started) < time.Second:
		// A build that just started is where a split is made: the running
		// builds give back for it, it takes what they free.
		every /= 5
	case l.seen && l.v.free <= 0 && s.Ticket().Weighs() > 1:
		// A full limit and slots to give: a run that arrives now waits
		// for this server to see it.
		every /= 2
	}
	l.nextLook = now.Add(every)
	v, err := s.look(ctx)
	if err != nil {
		return true // the store fails: decide on the last look
	}
	if v.gone {
		s.mu.Lock()
		s.lost = fmt.Errorf("%w: ticket %s is gone", store.ErrLost, s.t.ID)
		s.mu.Unlock()
		return false
	}
	l.v, l.seen = v, true
	s.dropSurplus()
	for id := range v.holders {
		if !l.holders[id] {
			l.backoff, l.noRebal = minRebalanceBackoff, time.Time{} // a new holder may be a build
		}
	}
	l.holders = v.holders
	switch {
	case v.free <= 0 || v.waiting:
		l.freeSince = time.Time{}
	case l.freeSince.IsZero():
		l.freeSince = now
	}
	return true
}

// toGive is how many slots a ticket of weight w gives back now: for a
// waiter that lacks room, or above the fair share to a build below it (at
// most once per backoff: rebalance); never its first.
func (l *loop) toGive(w int, now time.Time) (give int, rebalance bool) {
	if !l.seen || w <= 1 {
		return 0, false
	}
	switch v := l.v; {
	case v.waiting && v.need > 0:
		// What the head waiter lacks, and down to the share it will be
		// admitted into (the live tickets counted with it): the split a
		// rebalance would make after its admission, at once.
		return min(max(v.need, w-v.share), w-1), false
	case !v.waiting && v.excess > 0 && !now.Before(l.noRebal):
		return min(v.excess, w-1), true
	}
	return 0, false
}

// giveRound reads back up to give unread tokens, less those in hand (it
// waits up to Tick for one to come back), and gives all in hand back to the
// store. It reports whether the store took any.
func (s *Server) giveRound(ctx context.Context, l *loop, give int) bool {
	want := give - s.inHandNow()
	got := s.take(want, s.cfg.Tick)
	freed, err := s.giveBack(ctx, got)
	switch {
	case err != nil:
		s.sleep(ctx, s.cfg.LookEvery) // the store fails: the tokens stay in hand until it answers
	case freed > 0:
		l.nextLook = time.Time{} // see at once whether more is needed
	case want <= 0:
		s.sleep(ctx, s.cfg.Tick)
	}
	return freed > 0
}

// growRound grows a ticket of weight w that could grow when the build has
// read every token: below its share at once, doubling while the build
// takes each grant; at or above it, into a slot nobody took within Grace.
func (s *Server) growRound(ctx context.Context, l *loop, w int, now time.Time) {
	unread := s.Unread()
	if unread > 0 {
		l.step = 1
		return
	}
	below := w < l.v.share
	if !below && (l.freeSince.IsZero() || now.Sub(l.freeSince) < s.cfg.Grace) {
		return
	}
	want := w + 1
	if below {
		want = min(w+l.step, l.v.share, s.max)
		l.step = min(2*l.step, store.MaxSlots)
	}
	granted := s.grow(ctx, want)
	if granted == 0 {
		l.v.free = 0 // refused: wait for the next look
		return
	}
	l.v.free -= granted
	l.tick = s.cfg.Tick
	if !below && l.rebalanced {
		// Nobody took this free slot within the grace, given back for a
		// fairer split: that holder is no build, so the next rebalance
		// waits (doubling backoff).
		l.rebalanced = false
		l.noRebal = time.Now().Add(l.backoff)
		l.backoff = min(2*l.backoff, maxRebalanceBackoff)
	}
}

func (s *Server) inHandNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inHand
}

func (s *Server) lostErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

func (s *Server) look(ctx context.Context) (view, error) {
	snap, err := s.cfg.Store.Snapshot(ctx, s.cfg.Ticket.Names()...)
	s.mu.Lock()
	s.stats.Looks++
	me := s.t
	s.mu.Unlock()
	if err != nil {
		return view{}, err
	}
	return look(snap, me), nil
}

// dropSurplus reads and discards the bytes in the FIFO beyond the tokens
// the server handed out (a client that wrote back more than it took):
// they would let the build run more jobs than its slots.
func (s *Server) dropSurplus() {
	s.mu.Lock()
	out := s.t.Weighs() - 1 - s.inHand
	s.mu.Unlock()
	if surplus := s.Unread() - out; surplus > 0 {
		n := s.take(surplus, 0)
		s.mu.Lock()
		s.stats.Dropped += n
		s.mu.Unlock()
	}
}

// giveBack counts got more tokens as read back and shrinks the ticket by
// all the tokens in hand. It returns how many slots the store took back. A
// store that fails keeps them in hand, for the next round; one that says
// the ticket is gone stops the server.
func (s *Server) giveBack(ctx context.Context, got int) (int, error) {
	s.mu.Lock()
	s.inHand += got
	n := s.inHand
	t := s.t
	s.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	w := max(t.Weighs()-n, 1)
	nt, err := s.cfg.Store.Resize(ctx, t, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Resizes++
	if err != nil {
		if errors.Is(err, store.ErrLost) {
			s.lost = err
		}
		return 0, err
	}
	freed := t.Weighs() - nt.Weighs()
	s.inHand -= freed
	s.stats.Shrunk += freed
	s.t = nt
	if s.cfg.Logf != nil {
		s.cfg.Logf("jobserver: gave back %s: ticket %s now takes %d", plural(freed), short(nt.ID), nt.Weighs())
	}
	return freed, nil
}

// sleep waits d or until ctx is done.
func (s *Server) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// grow asks for weight w and puts a token in the FIFO for each slot
// granted; it returns how many.
func (s *Server) grow(ctx context.Context, w int) int {
	s.mu.Lock()
	t := s.t
	s.mu.Unlock()
	nt, err := s.cfg.Store.Resize(ctx, t, w)
	s.mu.Lock()
	s.stats.Resizes++
	if err != nil {
		if errors.Is(err, store.ErrLost) {
			s.lost = err
		}
		s.mu.Unlock()
		return 0
	}
	granted := nt.Weighs() - t.Weighs()
	s.t = nt
	s.stats.Grown += max(granted, 0)
	s.stats.MaxWeight = max(s.stats.MaxWeight, nt.Weighs())
	s.mu.Unlock()
	if granted <= 0 {
		return 0
	}
	if err := s.put(granted); err != nil {
		// Not written: those slots are held but not handed out; give
		// them back rather than keep them idle.
		s.mu.Lock()
		s.inHand += granted
		s.mu.Unlock()
		_, _ = s.giveBack(ctx, 0)
		return 0
	}
	if s.cfg.Logf != nil {
		s.cfg.Logf("jobserver: took %s: ticket %s now takes %d", plural(granted), short(nt.ID), nt.Weighs())
	}
	return granted
}

func plural(n int) string {
	if n == 1 {
		return "1 slot"
	}
	return strconv.Itoa(n) + " slots"
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
