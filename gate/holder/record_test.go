package holder_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
)

// stubbornChild ignores SIGTERM: only SIGKILL ends it.
type stubbornChild struct {
	fakeChild
	termed, killed chan struct{}
	term, kill     sync.Once
}

func newStubbornChild() *stubbornChild {
	return &stubbornChild{fakeChild: fakeChild{exited: make(chan struct{})}, termed: make(chan struct{}), killed: make(chan struct{})}
}

func (c *stubbornChild) Signal(s syscall.Signal) {
	c.mu.Lock()
	c.sigs = append(c.sigs, s)
	c.mu.Unlock()
	if s == syscall.SIGTERM {
		c.term.Do(func() { close(c.termed) })
	}
	if s == syscall.SIGKILL {
		c.kill.Do(func() { close(c.killed); c.once.Do(func() { close(c.exited) }) })
	}
}
func (c *stubbornChild) Group() (int, uint64, bool) { return 4242, 99, true }
func (c *stubbornChild) Exit() (holder.Exit, error) { return holder.Exit{Signal: syscall.SIGKILL}, nil }

// stuckRecord's SetChild waits, as behind a store lock that a stalled
// process holds, until the test lets it go or its context ends.
type stuckRecord struct {
	holder.Store
	called chan struct{}
	free   chan struct{}
	once   sync.Once
}

func (s *stuckRecord) SetChild(ctx context.Context, t store.Ticket, pgid int, start uint64) (store.Ticket, error) {
	s.once.Do(func() { close(s.called) })
	select {
	case <-s.free:
	case <-ctx.Done():
		return t, ctx.Err()
	}
	return s.Store.SetChild(ctx, t, pgid, start)
}

// termedAtStart runs cfg with a job that ignores SIGTERM, on a holder's
// clock that moves (the kill grace runs on it), and sends the run SIGTERM
// as the job starts.
func (e *env) termedAtStart(cfg holder.Config) (*stubbornChild, <-chan holder.Outcome) {
	start := time.Now()
	cfg.Now = func() time.Duration { return e.now() + time.Since(start) }
	c := newStubbornChild()
	cfg.Start = func(context.Context, store.Ticket) (holder.Child, error) { return c, nil }
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.Started {
			e.sigs <- syscall.SIGTERM
		}
	}
	done := make(chan holder.Outcome, 1)
	go func() { done <- holder.Run(context.Background(), cfg) }()
	return c, done
}

// TestKillGraceNotHeldUpByRecord: a job stopped (SIGTERM) before its group
// is recorded gets SIGKILL at its kill grace, not once a store call that
// waits on a held-up store returns: a job being stopped needs no record
// (its guard kills it if the supervisor dies), so none is made.
func TestKillGraceNotHeldUpByRecord(t *testing.T) {
	e := newEnv(t)
	st := &stuckRecord{Store: e.st, called: make(chan struct{}), free: make(chan struct{})}
	defer close(st.free)
	cfg := e.config(st, "k")
	cfg.KillAfter = 3 * time.Second
	cfg.RecordDelay = time.Second  // due within the kill grace, well after the SIGTERM is handled
	cfg.ReleaseTimeout = time.Hour // only the lease would bound the record
	c, done := e.termedAtStart(cfg)
	select {
	case <-c.killed:
	case <-st.called:
		t.Fatal("the job's group was recorded while the job was being stopped: the store call holds up its SIGKILL")
	case <-time.After(20 * time.Second):
		t.Fatal("no SIGKILL within 20s of a SIGTERM with a kill grace of 3s")
	}
	select {
	case out := <-done:
		if out.Result != holder.Ran || out.Exit.Signal != syscall.SIGKILL {
			t.Errorf("run ended %v (%+v), want Ran, its job killed", out.Result, out.Exit)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the run did not end within 20s of its job's SIGKILL")
	}
}

// TestStopRequestWhileStopping: a newer run of the key asks the job to stop
// while it is already being stopped (a SIGTERM it ignores): the request is
// not read then (nothing may hold up the SIGKILL), but once the job is gone,
// so that the outcome still names the run that replaced it.
func TestStopRequestWhileStopping(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := e.config(e.st, "r")
	cfg.Request.Key = "prod"
	cfg.KillAfter = 2 * time.Second
	c, done := e.termedAtStart(cfg)
	select {
	case <-c.termed:
	case <-time.After(20 * time.Second):
		t.Fatal("the SIGTERM was not passed on to the job within 20s")
	}
	newer := store.EnqueueRequest{ID: gate.NewID(), Limit: "r", Slots: 1, TTL: time.Hour, Key: "prod", Replace: true,
		Holder: store.Holder{Host: "h3", Pid: 88}}
	if _, err := e.st.Enqueue(ctx, newer); err != nil {
		t.Fatal(err)
	}
	var out holder.Outcome
	select {
	case out = <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("Run did not return within 20s of its job's SIGTERM (signals %v)", c.signals())
	}
	if out.Replaced == nil || out.Replaced.Ticket != newer.ID {
		t.Errorf("outcome %+v, want Replaced by %s", out, newer.ID)
	}
	if sigs := c.signals(); len(sigs) < 2 || sigs[0] != syscall.SIGTERM || sigs[len(sigs)-1] != syscall.SIGKILL {
		t.Errorf("the job got %v, want SIGTERM, then SIGKILL at its kill grace", sigs)
	}
}
