package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/pgtest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/pgstore"
)

func open(t *testing.T, url string, o pgstore.Options) store.Store {
	t.Helper()
	st, err := pgstore.Open(context.Background(), url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func req(id, limit string) store.EnqueueRequest {
	return store.EnqueueRequest{ID: id, Limit: limit, Slots: 1, TTL: 10 * time.Second,
		Holder: store.Holder{Host: "pgstore.invalid", Pid: 1, Label: "test"}}
}

// A client paused in the middle of a step, holding the lock (stopped,
// swapped out, a paused VM), holds the others up for at most half the lock
// timeout: the server ends its transaction (the session's
// idle_in_transaction_session_timeout, which the store sets), and the next
// step goes through. Without it the other step waits out its whole lock
// timeout and fails.
func TestPausedStepIsCutOff(t *testing.T) {
	url := testURL(t)
	ctx := context.Background()
	o := pgstore.Options{Timeout: 4 * time.Second}
	paused := open(t, url, o)
	if _, err := paused.SetLimit(ctx, "p", 1); err != nil {
		t.Fatal(err)
	}
	resume := make(chan struct{})
	defer close(resume)
	held := make(chan struct{})
	pgstore.PauseAfterLock(paused, func() {
		close(held)
		<-resume
	})
	failed := make(chan error, 1)
	go func() {
		_, err := paused.Enqueue(ctx, req("paused", "p"))
		failed <- err
	}()
	<-held
	st := open(t, url, o)
	tk, err := st.Enqueue(ctx, req("after-pause", "p"))
	if err != nil {
		t.Fatalf("Enqueue behind a paused step: %v, want it admitted once the pause is cut off", err)
	}
	if tk.State != store.Held {
		t.Fatalf("Enqueue behind a paused step: %s, want held", tk.State)
	}
	resume <- struct{}{}
	if err := <-failed; err == nil {
		t.Fatal("the paused step committed after it was cut off")
	}
	if _, err := st.Get(ctx, "paused"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of the paused step's ticket: %v, want not found (rolled back)", err)
	}
}

// A step that cannot take the lock within Options.Timeout fails with a
// *store.LockTimeoutError naming the store, and writes nothing.
func TestLockTimeout(t *testing.T) {
	url := testURL(t)
	ctx := context.Background()
	st := open(t, url, pgstore.Options{Timeout: 500 * time.Millisecond})
	if _, err := st.SetLimit(ctx, "p", 1); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, url)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT v FROM slotctl_meta WHERE k = 'lock' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	_, err = st.Enqueue(ctx, req("locked-out", "p"))
	var lt *store.LockTimeoutError
	if !errors.As(err, &lt) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Enqueue on a locked store: %v (%T), want a *store.LockTimeoutError", err, err)
	}
	if strings.Contains(err.Error(), "@") && strings.Contains(url, ":") && strings.Contains(err.Error(), "password") {
		t.Fatalf("error names a password: %v", err)
	}
	tx.Rollback(ctx)
	if _, err := st.Get(ctx, "locked-out"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after a refused enqueue: %v, want not found", err)
	}
}

// The server's clock judges leases, not the client's: a store opened
// without a test clock reads the server's clock_timestamp(), and a lease
// runs out by it.
func TestServerClockJudges(t *testing.T) {
	url := testURL(t)
	ctx := context.Background()
	st := open(t, url, pgstore.Options{})
	conn := connect(t, url)
	var before, after time.Time
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if snap.Now.Before(before) || snap.Now.After(after) {
		t.Fatalf("the store's clock read %v, outside the server's %v .. %v", snap.Now, before, after)
	}
	r := req("short", "c")
	r.TTL = time.Second
	tk, err := st.Enqueue(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if tk.State != store.Held || tk.Remaining <= 0 || tk.Remaining > time.Second {
		t.Fatalf("Enqueue: %s with %v left, want held with at most 1s", tk.State, tk.Remaining)
	}
	// Wait until the server's clock is past the deadline, by its own reading.
	for {
		var now time.Time
		if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		if now.After(after.Add(1100 * time.Millisecond)) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rm, err := st.Reap(ctx, store.ReapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rm) != 1 || rm[0].Ticket.ID != "short" {
		t.Fatalf("Reap after the lease ran out by the server's clock: %v, want ticket short removed", rm)
	}
}

// Whoever shares the store may delete the lock row: no step may then go
// ahead unexcluded. Every write is refused as a corrupt store, naming it.
func TestMissingLockRowRefusesWrites(t *testing.T) {
	url := testURL(t)
	ctx := context.Background()
	st := open(t, url, pgstore.Options{})
	if _, err := st.SetLimit(ctx, "p", 1); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, url)
	if _, err := conn.Exec(ctx, `DELETE FROM slotctl_meta WHERE k = 'lock'`); err != nil {
		t.Fatal(err)
	}
	_, err := st.Enqueue(ctx, req("unlocked", "p"))
	if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), "lock row") {
		t.Fatalf("Enqueue without the lock row: %v, want ErrCorrupt naming the lock row", err)
	}
}

// A row whose columns and record disagree (a ticket listed under a limit
// its record does not name) is refused as corrupt, never acted on.
func TestForgedTicketRowRefused(t *testing.T) {
	url := testURL(t)
	ctx := context.Background()
	st := open(t, url, pgstore.Options{})
	if _, err := st.Enqueue(ctx, req("real", "p")); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, url)
	if _, err := conn.Exec(ctx, `UPDATE slotctl_tickets SET limits = ARRAY['p', 'q'] WHERE id = 'real'`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Snapshot(ctx, "p"); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Snapshot with a forged row: %v, want ErrCorrupt", err)
	}
	if _, err := conn.Exec(ctx, `UPDATE slotctl_tickets SET limits = ARRAY['p'], rec = jsonb_set(rec, '{holder,pid}', '-5') WHERE id = 'real'`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "real"); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Get of a ticket with a negative pid: %v, want ErrCorrupt", err)
	}
}

// pausedRenewal is a limit p of 3 slots holding tickets a and b, and a's
// renewal paused in the middle of its step, holding the lock shared.
type pausedRenewal struct {
	b         store.Ticket
	renewedA  chan error // a's renewal's outcome, once resumed
	resumeFn  func()
	resumedMu sync.Once
}

func (p *pausedRenewal) resume() { p.resumedMu.Do(p.resumeFn) }

func pauseRenewal(t *testing.T, url string, o pgstore.Options) *pausedRenewal {
	t.Helper()
	ctx := context.Background()
	st := open(t, url, o)
	if _, err := st.SetLimit(ctx, "p", 3); err != nil {
		t.Fatal(err)
	}
	a, err := st.Enqueue(ctx, req("a", "p"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.Enqueue(ctx, req("b", "p"))
	if err != nil {
		t.Fatal(err)
	}
	paused := open(t, url, o)
	resume := make(chan struct{})
	held := make(chan struct{})
	pgstore.PauseAfterLock(paused, func() {
		close(held)
		<-resume
	})
	p := &pausedRenewal{b: b, renewedA: make(chan error, 1), resumeFn: func() { close(resume) }}
	t.Cleanup(p.resume)
	go func() {
		_, err := paused.Renew(ctx, a, 10*time.Second)
		p.renewedA <- err
	}()
	<-held
	return p
}

// A held ticket's renewal takes the lock shared: another holder's renewal
// goes through while the first is paused in the middle of its step (a slow
// client does not make every other lease wait for it), while a whole step,
// which may remove tickets, waits for the paused renewal to end. Were
// renewals whole steps, the second renewal would wait until the server
// cut the paused one off, and the paused one would then fail.
func TestRenewalsShareTheLock(t *testing.T) {
	url, o := testURL(t), pgstore.Options{Timeout: 20 * time.Second}
	ctx := context.Background()
	p := pauseRenewal(t, url, o)
	b := p.b

	if _, err := open(t, url, o).Renew(ctx, b, 10*time.Second); err != nil {
		t.Fatalf("a renewal beside a paused one: %v", err)
	}

	whole := make(chan error, 1)
	go func() {
		_, err := open(t, url, o).Enqueue(ctx, req("c", "p"))
		whole <- err
	}()
	conn := connect(t, url)
	for waiting := false; !waiting; {
		select {
		case err := <-whole:
			t.Fatalf("an enqueue ran beside a paused renewal (err %v): it must wait for the lock", err)
		case <-time.After(20 * time.Millisecond):
		}
		err := conn.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
	}

	p.resume()
	if err := <-p.renewedA; err != nil {
		t.Fatalf("the paused renewal: %v, want it to commit", err)
	}
	if err := <-whole; err != nil {
		t.Fatalf("the enqueue behind the paused renewal: %v", err)
	}
}

// A renewal that comes while an enqueue waits for the lock waits behind
// it: shared steps that keep overlapping would otherwise hold every
// enqueue, release and reap off for as long as they kept coming.
func TestRenewalsQueueBehindAWaitingStep(t *testing.T) {
	url, o := testURL(t), pgstore.Options{Timeout: 20 * time.Second}
	ctx := context.Background()
	p := pauseRenewal(t, url, o)
	b := p.b

	conn := connect(t, url)
	waitingForLock := func(n int) bool {
		var waiting int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting >= n
	}
	enqueued := make(chan error, 1)
	go func() {
		_, err := open(t, url, o).Enqueue(ctx, req("c", "p"))
		enqueued <- err
	}()
	for !waitingForLock(1) {
		select {
		case err := <-enqueued:
			t.Fatalf("an enqueue ran beside a paused renewal (err %v): it must wait for the lock", err)
		case <-time.After(20 * time.Millisecond):
		}
	}

	renewedB := make(chan error, 1)
	go func() {
		_, err := open(t, url, o).Renew(ctx, b, 10*time.Second)
		renewedB <- err
	}()
	for !waitingForLock(2) {
		select {
		case err := <-renewedB:
			t.Fatalf("a renewal went ahead of the enqueue waiting for the lock (err %v): it must wait behind it", err)
		case <-time.After(20 * time.Millisecond):
		}
	}

	p.resume()
	for what, c := range map[string]chan error{"the paused renewal": p.renewedA, "the enqueue": enqueued, "the renewal behind it": renewedB} {
		if err := <-c; err != nil {
			t.Fatalf("%s: %v, want it to commit", what, err)
		}
	}
}

// A waiter's bell rings once its handle listens, even though the step that
// concerned it committed before: its notification went to no one, and a
// waiter that slept on would wait for a ring that never comes.
func TestBellRingsOnceListening(t *testing.T) {
	url := testURL(t)
	ctx := context.Background()
	o := pgstore.Options{Timeout: 20 * time.Second}
	st := open(t, url, o)
	holder, err := st.Enqueue(ctx, req("holder", "p"))
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := st.Enqueue(ctx, req("waiter", "p"))
	if err != nil {
		t.Fatal(err)
	}

	w := open(t, url, o)
	release := make(chan struct{})
	pgstore.HoldListener(w, func() { <-release })
	bell, err := w.Watch(ctx, waiter.ID)
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	defer bell.Close()
	// The holder leaves while the waiter's handle does not listen yet: the
	// waiter is admitted, and the notification of it is lost.
	if _, err := st.Release(ctx, holder, store.Released); err != nil {
		close(release)
		t.Fatal(err)
	}
	select {
	case <-bell.C():
		close(release)
		t.Fatal("the bell rang before its handle listened")
	default:
	}
	close(release)
	select {
	case <-bell.C():
	case <-time.After(20 * time.Second):
		t.Fatal("the bell did not ring once its handle listened: the admission committed before then is missed")
	}
}

// A handle that closes hangs up its listening connection cleanly, even with
// a notification of its own last step on the way: the server would
// otherwise fail to write it and log a lost client, a FATAL line in the
// server's log for every job.
func TestCloseHangsUpCleanly(t *testing.T) {
	url := testURL(t)
	ctx := context.Background()
	const lost = "could not send data to client"
	before := strings.Count(pgtest.ServerLog(t), lost)
	for i := range 20 {
		st, err := pgstore.Open(ctx, url, pgstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("close%02d", i)
		bell, err := st.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		tk, err := st.Enqueue(ctx, req(id, "p"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Release(ctx, tk, store.Released); err != nil {
			t.Fatal(err)
		}
		bell.Close()
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The server writes its complaint once it notices: give it a moment.
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(pgtest.ServerLog(t), lost) - before; n > 0 {
		t.Fatalf("the server lost %d of 20 clients as they closed (%q in its log)", n, lost)
	}
}
