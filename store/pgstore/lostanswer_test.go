package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/pgtest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/pgstore"
)

// TestLostCommitAnswersAreRetried: a step whose COMMIT the server ran but
// whose answer was lost (the connection cut right after) is run again,
// and finds its own effect: the caller gets the answer, not "unavailable",
// and nothing is done twice.
func TestLostCommitAnswersAreRetried(t *testing.T) {
	p := pgtest.NewProxy(t, testURL(t))
	ctx := context.Background()
	var skew atomic.Int64
	st := open(t, p.URL, pgstore.Options{Skew: func() time.Duration { return time.Duration(skew.Load()) }})
	step := func(what string, do func() error) {
		t.Helper()
		lost := p.Lost()
		p.LoseNextCommit()
		if err := do(); err != nil {
			t.Fatalf("%s with its answer lost: %v", what, err)
		}
		if p.Lost() != lost+1 {
			t.Fatalf("%s: the proxy lost %d answers, want 1", what, p.Lost()-lost)
		}
	}
	step("the tables' creation, by the first step", func() error {
		_, err := st.Snapshot(ctx)
		return err
	})
	var a, b store.Ticket
	step("Enqueue", func() (err error) {
		a, err = st.Enqueue(ctx, req("a", "l"))
		if err == nil && a.State != store.Held {
			t.Errorf("Enqueue answered %s, want held", a.State)
		}
		return err
	})
	step("an Enqueue that waits", func() (err error) {
		b, err = st.Enqueue(ctx, req("b", "l"))
		if err == nil && b.State != store.Waiting {
			t.Errorf("Enqueue answered %s, want waiting", b.State)
		}
		return err
	})
	step("SetLimit", func() error {
		lim, err := st.SetLimit(ctx, "l", 3)
		if err == nil && (lim.Slots != 3 || lim.Held != 2) {
			t.Errorf("SetLimit answered %+v, want 3 slots, 2 held", lim)
		}
		return err
	})
	step("SetPolicy", func() error {
		lim, err := st.SetPolicy(ctx, "l", store.PolicyChange{Rate: &store.Rate{N: 5, Per: time.Hour}})
		if err == nil && lim.Policy.Rate.N != 5 {
			t.Errorf("SetPolicy answered %+v, want a rate of 5 an hour", lim.Policy)
		}
		return err
	})
	step("SetChild", func() error {
		got, err := st.SetChild(ctx, a, 4242, 77)
		if err == nil && got.Holder.Pgid != 4242 {
			t.Errorf("SetChild answered pgid %d, want 4242", got.Holder.Pgid)
		}
		return err
	})
	step("Renew", func() (err error) {
		a, err = st.Renew(ctx, a, 10*time.Second)
		return err
	})
	step("Resize", func() error {
		got, err := st.Resize(ctx, a, 2)
		if err == nil && got.Weighs() != 2 {
			t.Errorf("Resize answered weight %d, want 2", got.Weighs())
		}
		return err
	})
	step("Release", func() error {
		removed, err := st.Release(ctx, b, store.Released)
		if err == nil && !removed {
			t.Error("Release answered not removed, want removed")
		}
		return err
	})
	// A late duplicate of that release finds b gone, removes nothing, and
	// says so, though its retry finds the tombstone of the release.
	step("a late duplicate of the release", func() error {
		removed, err := st.Release(ctx, b, store.Released)
		if err == nil && removed {
			t.Error("the late duplicate answered removed, want not removed")
		}
		return err
	})
	sn, err := st.Snapshot(ctx, "l")
	if err != nil {
		t.Fatal(err)
	}
	if len(sn.Tickets) != 1 || sn.Limits[0].Held != 2 || sn.Limits[0].Slots != 3 {
		t.Fatalf("after the retried steps: limits %+v, tickets %+v; want one ticket of weight 2 in 3 slots", sn.Limits, sn.Tickets)
	}
	// A holder's "lost" release of a ticket already gone logs that it
	// noticed, once, though its retry finds the tombstone the first left.
	step("a lost release of a ticket gone", func() error {
		_, err := st.Release(ctx, store.Ticket{ID: "ghost", Limit: "l", Fence: 99}, store.Lost)
		return err
	})
	cs, err := st.Counts(ctx, "l")
	if err != nil {
		t.Fatal(err)
	}
	if cs[0].Lost != 1 || cs[0].Admitted != 2 || cs[0].Released != 1 {
		t.Fatalf("counts %+v, want 2 admitted, 1 released, 1 lost", cs[0])
	}
	step("the tombstone of a cancel before its create", func() error {
		_, err := st.Cancel(ctx, store.Ticket{ID: "never", Limit: "l"})
		return err
	})
	if _, err := st.Enqueue(ctx, req("never", "l")); !errors.Is(err, store.ErrRemoved) {
		t.Fatalf("the create after its cancel: %v, want ErrRemoved", err)
	}
	if _, err := st.Release(ctx, a, store.Released); err != nil {
		t.Fatal(err)
	}
	step("RemoveLimit", func() error { return st.RemoveLimit(ctx, "l", false) })
	if err := st.RemoveLimit(ctx, "l", false); !errors.Is(err, store.ErrLimitNotFound) {
		t.Fatalf("RemoveLimit again: %v, want ErrLimitNotFound", err)
	}

	x := req("x", "r")
	x.TTL = time.Second
	if _, err := st.Enqueue(ctx, x); err != nil {
		t.Fatal(err)
	}
	skew.Store(int64(time.Hour)) // x's lease is over by the store's clock
	step("Reap", func() error {
		rm, err := st.Reap(ctx, store.ReapOptions{})
		if err == nil && (len(rm) != 1 || rm[0].Ticket.ID != "x") {
			t.Errorf("Reap reported %+v, want x removed once", rm)
		}
		return err
	})
	if _, err := st.Get(ctx, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("x after the reap: %v, want not found", err)
	}
}

// TestLostLimitRemovalSparesTheNextLimit: a forced limit rm whose answer
// was lost, after which another client made the limit again, is done: its
// retry does not remove the new limit and its tickets.
func TestLostLimitRemovalSparesTheNextLimit(t *testing.T) {
	p := pgtest.NewProxy(t, testURL(t))
	ctx := context.Background()
	st := open(t, p.URL, pgstore.Options{})
	other := open(t, p.URL, pgstore.Options{})
	if _, err := st.Enqueue(ctx, req("old", "l")); err != nil {
		t.Fatal(err)
	}
	made := make(chan error, 1) // the proxy's goroutine runs it
	p.LoseNextCommitThen(func() { _, err := other.Enqueue(ctx, req("new", "l")); made <- err })
	if err := st.RemoveLimit(ctx, "l", true); err != nil {
		t.Fatalf("RemoveLimit with its answer lost: %v", err)
	}
	if err := <-made; err != nil || p.Lost() != 1 {
		t.Fatalf("the enqueue in between: %v; %d answers lost, want 1", err, p.Lost())
	}
	if _, err := st.Get(ctx, "new"); err != nil {
		t.Fatalf("the ticket of the limit made again: %v, want it kept", err)
	}
	if _, err := st.Get(ctx, "old"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the removed limit's ticket: %v, want not found", err)
	}
}
