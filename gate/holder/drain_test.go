package holder_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
)

// drainChild is a job whose command has exited at once but which leaves a
// process that ignores SIGTERM: it is gone only on SIGKILL.
type drainChild struct {
	mu     sync.Mutex
	sigs   []syscall.Signal
	leases [][2]time.Duration
	exited chan struct{}
	gone   chan struct{}
	once   sync.Once
}

func newDrainChild(exited bool) *drainChild {
	c := &drainChild{exited: make(chan struct{}), gone: make(chan struct{})}
	if exited {
		close(c.exited)
	}
	return c
}

func (c *drainChild) Exited() <-chan struct{} { return c.exited }
func (c *drainChild) Gone() <-chan struct{}   { return c.gone }
func (c *drainChild) Signal(s syscall.Signal) {
	c.mu.Lock()
	c.sigs = append(c.sigs, s)
	c.mu.Unlock()
	if s == syscall.SIGKILL {
		c.once.Do(func() { close(c.gone) })
	}
}
func (c *drainChild) Lease(stop, kill time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leases = append(c.leases, [2]time.Duration{stop, kill})
}
func (c *drainChild) Foreground() bool           { return false }
func (c *drainChild) Group() (int, uint64, bool) { return 0, 0, false }
func (c *drainChild) Exit() (holder.Exit, error) { return holder.Exit{}, nil }
func (c *drainChild) Close()                     {}

func (c *drainChild) signals() []syscall.Signal {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]syscall.Signal(nil), c.sigs...)
}

// runWith starts Run with child as the job, and returns once it started.
func runWith(t *testing.T, e *env, cfg holder.Config, c holder.Child) <-chan holder.Outcome {
	t.Helper()
	started := make(chan struct{})
	cfg.Start = func(context.Context, store.Ticket) (holder.Child, error) { return c, nil }
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.Started {
			close(started)
		}
	}
	done := make(chan holder.Outcome, 1)
	go func() { done <- holder.Run(context.Background(), cfg) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not start")
	}
	return done
}

func outcome(t *testing.T, done <-chan holder.Outcome) holder.Outcome {
	t.Helper()
	select {
	case out := <-done:
		return out
	case <-time.After(10 * time.Second): // far below KillAfter's hour
		t.Fatal("Run did not return")
	}
	return holder.Outcome{}
}

// TestDrainStopsAtALostLease: the command has exited, what it left ignores
// SIGTERM, and --kill-after is an hour. The lease is lost during the drain:
// SIGKILL comes half a margin later, not at --kill-after, and the run is
// lost.
func TestDrainStopsAtALostLease(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.st, "d")
	cfg.KillAfter = time.Hour
	c := newDrainChild(true)
	done := runWith(t, e, cfg, c)
	time.Sleep(50 * time.Millisecond) // the drain has begun: SIGTERM sent
	e.skew.Add(int64(ttl))            // the holder's clock (which only the test moves) passes its deadline
	e.sigs <- syscall.SIGCONT         // which it checks at once
	// The clock moves a margin at a time: the SIGKILL that the loss brought
	// forward comes due; --kill-after's hour never does within the bound.
	var out holder.Outcome
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case out = <-done:
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatalf("Run did not return; signals %v", c.signals())
			}
			e.skew.Add(int64(ttl / 10))
			continue
		}
		break
	}
	if !out.Lost {
		t.Errorf("outcome %+v, want the lease lost", out)
	}
	if got := c.signals(); len(got) < 2 || got[0] != syscall.SIGTERM || got[len(got)-1] != syscall.SIGKILL {
		t.Errorf("signals %v, want SIGTERM, then SIGKILL", got)
	}
}

// TestExitPastTheLeaseIsLost: the job ended while the holder's clock went
// past its lease (its guard stopped it while the supervisor was stopped):
// the run is lost, whatever the job's status.
func TestExitPastTheLeaseIsLost(t *testing.T) {
	e := newEnv(t)
	c := newDrainChild(false)
	done := runWith(t, e, e.config(e.st, "x"), c)
	e.skew.Add(int64(ttl))
	close(c.exited)
	c.Signal(syscall.SIGKILL) // gone with it
	if out := outcome(t, done); !out.Lost {
		t.Errorf("outcome %+v, want the lease lost", out)
	}
}

// TestJobToldTheLease: the job learns its lease's end at the start (SIGTERM
// at the local deadline, SIGKILL half a margin later); with --on-lost
// continue it is never told, so nothing stops it on its own.
func TestJobToldTheLease(t *testing.T) {
	for _, cont := range []bool{false, true} {
		e := newEnv(t)
		cfg := e.config(e.st, "l")
		cfg.Continue = cont
		c := newDrainChild(false)
		done := runWith(t, e, cfg, c)
		told := func() [][2]time.Duration {
			c.mu.Lock()
			defer c.mu.Unlock()
			return append([][2]time.Duration(nil), c.leases...)
		}
		// The job is told as its supervision begins, just after Started.
		for deadline := time.Now().Add(10 * time.Second); !cont && len(told()) == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		close(c.exited)
		c.Signal(syscall.SIGKILL)
		outcome(t, done)
		leases := told() // all it was told, the run over
		switch {
		case cont && len(leases) > 0:
			t.Errorf("--on-lost continue: told %v, want nothing", leases)
		case !cont && len(leases) == 0:
			t.Error("the job was not told its lease")
		case !cont:
			margin := ttl / 10
			stop, kill := leases[0][0], leases[0][1]
			if stop <= 0 || stop > ttl-margin || kill-stop != margin/2 {
				t.Errorf("told stop in %s, kill in %s; want the local deadline (at most %s) and half a margin (%s) later", stop, kill, ttl-margin, margin/2)
			}
		}
	}
}
