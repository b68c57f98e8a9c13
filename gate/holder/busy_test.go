package holder_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
)

// TestWaitRunOutLeavesBusy: a run not admitted within its --wait (or at
// once, with --wait 0) leaves the queue as busy, not cancelled: the event
// and the limit's counters tell "gave up" from "full" (docs/leases.md §2.8).
func TestWaitRunOutLeavesBusy(t *testing.T) {
	for name, wait := range map[string]time.Duration{"no wait": 0, "wait runs out": 5 * time.Second} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			if _, err := e.st.Enqueue(ctx, store.EnqueueRequest{ID: gate.NewID(), Limit: "b", Slots: 1, TTL: time.Hour, Holder: store.Holder{Host: "h", Pid: 1}}); err != nil {
				t.Fatal(err)
			}
			cfg := e.config(e.st, "b")
			cfg.Wait = wait
			cfg.Waiter = skipWaiter{e, holder.RealWaiter{Now: e.now, Signals: e.sigs}, 2 * wait}
			done := make(chan holder.Outcome)
			go func() { done <- holder.Run(ctx, cfg) }()
			var out holder.Outcome
			select {
			case out = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after its wait ran out")
			}
			if out.Result != holder.Busy {
				t.Fatalf("result %v (%v), want Busy", out.Result, out.Err)
			}
			if k := e.event(t, "b", cfg.Request.ID); k != string(store.Busy) {
				t.Errorf("last event of the ticket %q, want %q", k, store.Busy)
			}
			if _, err := e.st.Get(ctx, cfg.Request.ID); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Get of the ticket after the wait ran out: %v, want ErrNotFound", err)
			}
			cs, err := e.st.Counts(ctx, "b")
			if err != nil {
				t.Fatal(err)
			}
			if c := cs[0]; c.Busy != 1 || c.Cancelled != 0 {
				t.Errorf("counts %+v, want 1 busy, none cancelled", c)
			}
		})
	}
}

// skipWaiter's every wait moves the holder's clock by skip first: the time
// it waits passes at once (less than the lease, so the lease is kept).
type skipWaiter struct {
	e    *env
	w    holder.RealWaiter
	skip time.Duration
}

func (s skipWaiter) Wait(w holder.Wake) holder.Event {
	s.e.skew.Add(int64(s.skip))
	return s.w.Wait(w)
}
