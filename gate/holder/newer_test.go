package holder_test

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
)

// TestSupersededWaiterEnds: a waiting run whose ticket a newer run of its
// key supersedes (docs/leases.md §2.1 item 10) ends at once as Superseded,
// naming the newer run; its job never starts and nothing is cancelled.
func TestSupersededWaiterEnds(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.st.Enqueue(ctx, store.EnqueueRequest{ID: gate.NewID(), Limit: "s", Slots: 1, TTL: time.Hour, Holder: store.Holder{Host: "h", Pid: 1}}); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(e.st, "s")
	cfg.Request.Key = "main"
	waiting := make(chan struct{})
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.WaitStart {
			close(waiting)
		}
	}
	done := make(chan holder.Outcome)
	go func() { done <- holder.Run(ctx, cfg) }()
	<-waiting
	newer := store.EnqueueRequest{ID: gate.NewID(), Limit: "s", Slots: 1, TTL: time.Hour, Key: "main", Supersede: true,
		Holder: store.Holder{Host: "h2", Pid: 77, URL: "https://ci.example/2"}}
	if _, err := e.st.Enqueue(ctx, newer); err != nil {
		t.Fatal(err)
	}
	var out holder.Outcome
	select {
	case out = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its ticket was superseded (the poll is an hour: its bell must ring)")
	}
	want := store.Successor{Ticket: newer.ID, Host: "h2", Pid: 77, URL: "https://ci.example/2"}
	if out.Result != holder.Superseded || out.By != want {
		t.Fatalf("result %v, by %+v (%v), want Superseded by %+v", out.Result, out.By, out.Err, want)
	}
	if k := e.event(t, "s", cfg.Request.ID); k != string(store.Superseded) {
		t.Errorf("last event of the superseded ticket %q, want %q", k, store.Superseded)
	}
}

// fakeChild is a job that ends when it gets SIGTERM.
type fakeChild struct {
	mu     sync.Mutex
	sigs   []syscall.Signal
	exited chan struct{}
	once   sync.Once
}

func newFakeChild() *fakeChild { return &fakeChild{exited: make(chan struct{})} }

func (c *fakeChild) Exited() <-chan struct{} { return c.exited }
func (c *fakeChild) Signal(s syscall.Signal) {
	c.mu.Lock()
	c.sigs = append(c.sigs, s)
	c.mu.Unlock()
	if s == syscall.SIGTERM {
		c.once.Do(func() { close(c.exited) })
	}
}
func (c *fakeChild) Foreground() bool                   { return false }
func (c *fakeChild) Group() (int, uint64, bool)         { return 0, 0, false }
func (c *fakeChild) Gone() <-chan struct{}              { return c.Exited() }
func (c *fakeChild) Close()                             {}
func (c *fakeChild) Lease(time.Duration, time.Duration) {}
func (c *fakeChild) Exit() (holder.Exit, error)         { return holder.Exit{Signal: syscall.SIGTERM}, nil }
func (c *fakeChild) signals() []syscall.Signal {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sigs)
}

// deafBell is the store with a bell that never rings: a holder on it hears
// a stop request only from its renewals.
type deafBell struct{ holder.Store }

type silent struct{ c chan struct{} }

func (s silent) C() <-chan struct{} { return s.c }
func (s silent) Close() error       { return nil }

func (d deafBell) Watch(context.Context, string) (store.Bell, error) {
	return silent{make(chan struct{})}, nil
}

// TestReplacedHolderStops: a held job that a newer run of its key replaces
// (docs/leases.md §2.1 item 10) is stopped with SIGTERM, the ticket is
// released (so the newer one is admitted after it) and the outcome says by
// whom: heard from the bell, and with a bell that never rings, from the
// next renewal.
func TestReplacedHolderStops(t *testing.T) {
	for _, tc := range []string{"bell", "renewal"} {
		t.Run(tc, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			var s holder.Store = e.st
			if tc == "renewal" {
				s = deafBell{e.st}
			}
			cfg := e.config(s, "r")
			cfg.Request.Key = "prod"
			if tc == "renewal" {
				cfg.Renew.Every = 200 * time.Millisecond // the bell test has 10s: only its bell can be in time
			}
			c := newFakeChild()
			started := make(chan store.Ticket, 1)
			cfg.Start = func(_ context.Context, tk store.Ticket) (holder.Child, error) {
				started <- tk
				return c, nil
			}
			done := make(chan holder.Outcome)
			go func() { done <- holder.Run(ctx, cfg) }()
			<-started
			newer := store.EnqueueRequest{ID: gate.NewID(), Limit: "r", Slots: 1, TTL: time.Hour, Key: "prod", Replace: true,
				Holder: store.Holder{Host: "h3", Pid: 88}}
			nt, err := e.st.Enqueue(ctx, newer)
			if err != nil {
				t.Fatal(err)
			}
			if nt.State != store.Waiting {
				t.Fatalf("the replacing ticket is %s beside the held one, want waiting", nt.State)
			}
			var out holder.Outcome
			select {
			case out = <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("Run did not return after its ticket was asked to stop (signals %v)", c.signals())
			}
			if out.Replaced == nil || out.Replaced.Ticket != newer.ID || out.Replaced.Host != "h3" {
				t.Fatalf("outcome %+v, want Replaced by %s", out, newer.ID)
			}
			if sigs := c.signals(); len(sigs) == 0 || sigs[0] != syscall.SIGTERM {
				t.Errorf("the job got %v, want SIGTERM first", sigs)
			}
			if k := e.event(t, "r", cfg.Request.ID); k != string(store.Released) {
				t.Errorf("last event of the replaced ticket %q, want %q", k, store.Released)
			}
			got, err := e.st.Get(ctx, newer.ID)
			if err != nil || got.State != store.Held {
				t.Errorf("the replacing ticket after the release: %s (%v), want held", got.State, err)
			}
		})
	}
}

// unreadable is a store whose reads of one ticket find it gone once asked,
// while its renewals still go through: the ticket was removed just after
// a renewal's answer carried its stop request.
type unreadable struct {
	deafBell
	id   string
	gone chan struct{}
}

func (u unreadable) Get(ctx context.Context, id string) (store.Ticket, error) {
	select {
	case <-u.gone:
		if id == u.id {
			return store.Ticket{}, store.ErrNotFound
		}
	default:
	}
	return u.deafBell.Get(ctx, id)
}

// TestReplacedHolderStopsOnRenewalAnswer: a renewal's answer that carries a
// stop request is acted on as read; the job is stopped even if the ticket
// can no longer be read back.
func TestReplacedHolderStopsOnRenewalAnswer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := e.config(nil, "r")
	s := unreadable{deafBell{e.st}, cfg.Request.ID, make(chan struct{})}
	cfg.Store = s
	cfg.Request.Key = "prod"
	cfg.Renew.Every = 200 * time.Millisecond
	c := newFakeChild()
	started := make(chan struct{})
	cfg.Start = func(context.Context, store.Ticket) (holder.Child, error) {
		close(started)
		return c, nil
	}
	done := make(chan holder.Outcome)
	go func() { done <- holder.Run(ctx, cfg) }()
	<-started
	newer := store.EnqueueRequest{ID: gate.NewID(), Limit: "r", Slots: 1, TTL: time.Hour, Key: "prod", Replace: true,
		Holder: store.Holder{Host: "h3", Pid: 88}}
	close(s.gone)
	if _, err := e.st.Enqueue(ctx, newer); err != nil {
		t.Fatal(err)
	}
	var out holder.Outcome
	select {
	case out = <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("Run did not return within 20s of its ticket being asked to stop (signals %v)", c.signals())
	}
	if out.Replaced == nil || out.Replaced.Ticket != newer.ID {
		t.Fatalf("outcome %+v, want Replaced by %s", out, newer.ID)
	}
	if sigs := c.signals(); len(sigs) == 0 || sigs[0] != syscall.SIGTERM {
		t.Errorf("the job got %v, want SIGTERM first", sigs)
	}
}
