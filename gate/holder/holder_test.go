package holder_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

const ttl = 30 * time.Second

// env is a real bbolt store on a fake clock, and the holder's own clock:
// the store's plus skew, so a test can make the holder's lease run out
// (a suspend, a slow write) while the store still has it.
type env struct {
	st    *boltstore.Store
	clock *boltstore.FakeClock
	skew  atomic.Int64
	sigs  chan os.Signal
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{clock: boltstore.NewFakeClock(boltstore.Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()}), sigs: make(chan os.Signal, 4)}
	st, err := boltstore.New(filepath.Join(t.TempDir(), "slots.db"), boltstore.Options{Clock: e.clock, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	e.st = st
	return e
}

func (e *env) now() time.Duration { return e.clock.Now().Mono + time.Duration(e.skew.Load()) }

func (e *env) config(s holder.Store, limit string) holder.Config {
	return holder.Config{
		Store:   s,
		Gate:    gate.Gate{PollEvery: time.Hour},
		Request: store.EnqueueRequest{ID: gate.NewID(), Limit: limit, Slots: 1, TTL: ttl, Holder: store.Holder{Host: "h", Pid: os.Getpid()}},
		Wait:    -1, KillAfter: 10 * time.Second,
		Renew:   renew.Options{TTL: ttl},
		Now:     e.now,
		Signals: e.sigs,
		Start: func(context.Context, store.Ticket) (holder.Child, error) {
			return nil, errors.New("the job must not start")
		},
	}
}

// event is the newest event of ticket id, or "".
func (e *env) event(t *testing.T, limit, id string) string {
	t.Helper()
	evs, err := e.st.Events(context.Background(), limit, 100)
	if err != nil {
		t.Fatal(err)
	}
	kind := ""
	for _, ev := range evs {
		if ev.Ticket == id {
			kind = ev.Kind
		}
	}
	return kind
}

// slowEnqueue's enqueue takes longer than the lease on the holder's clock.
type slowEnqueue struct {
	*boltstore.Store
	e *env
}

func (s slowEnqueue) Enqueue(ctx context.Context, req store.EnqueueRequest) (store.Ticket, error) {
	t, err := s.Store.Enqueue(ctx, req)
	s.e.skew.Add(int64(ttl))
	return t, err
}

// TestLostBeforeStartReleases: admitted with a lease already used up, the
// holder does not start the job, and releases the ticket as lost (a `lost`
// event; the slot comes back now, not at expiry).
func TestLostBeforeStartReleases(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(slowEnqueue{e.st, e}, "a")
	out := holder.Run(context.Background(), cfg)
	if out.Result != holder.LostBeforeStart {
		t.Fatalf("result %v (%v), want LostBeforeStart", out.Result, out.Err)
	}
	if _, err := e.st.Get(context.Background(), cfg.Request.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ticket still in the store after a loss before start (Get: %v): the slot stays held until it expires", err)
	}
	if k := e.event(t, "a", cfg.Request.ID); k != string(store.Lost) {
		t.Errorf("last event of the ticket %q, want %q", k, store.Lost)
	}
}

// TestLostWhileWaitingLogsLost: a waiting ticket whose lease runs out
// leaves the queue as lost, not as cancelled.
func TestLostWhileWaitingLogsLost(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.st.Enqueue(ctx, store.EnqueueRequest{ID: gate.NewID(), Limit: "w", Slots: 1, TTL: time.Hour, Holder: store.Holder{Host: "h", Pid: 1}}); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(e.st, "w")
	waiting := make(chan struct{})
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.WaitStart {
			close(waiting)
		}
	}
	done := make(chan holder.Outcome)
	go func() { done <- holder.Run(ctx, cfg) }()
	<-waiting
	e.skew.Add(int64(ttl))    // suspended past the lease...
	e.sigs <- syscall.SIGCONT // ...and resumed: the holder checks its lease
	var out holder.Outcome
	select {
	case out = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its waiting lease ran out")
	}
	if out.Result != holder.LostWaiting || !errors.Is(out.Err, store.ErrLost) {
		t.Fatalf("result %v (%v), want LostWaiting wrapping ErrLost", out.Result, out.Err)
	}
	if k := e.event(t, "w", cfg.Request.ID); k != string(store.Lost) {
		t.Errorf("last event of the ticket %q, want %q", k, store.Lost)
	}
}
