package cli

import (
	"context"
	"testing"
	"time"
)

// TestStoreStopsAnsweringKillsStubbornChild: a child that ignores SIGTERM
// is still gone before its lost lease could expire in the store: on a
// lost lease SIGKILL comes within the margin, whatever --kill-after says
// (here the default, 10s, five times the TTL).
func TestStoreStopsAnsweringKillsStubbornChild(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const ttl = 2 * time.Second
	p := e.start(ctx, "s", "run", "--limit", "s", "--ttl", ttl.String(), "--store-timeout", "200ms", "--",
		"sh", "-c", `trap "" TERM; echo $$ > pid; touch started; sleep 30; sleep 30`)
	ptWaitFor(t, "child started", 5*time.Second, func() bool { return ptExists(e.path("started")) })
	pid := int(ptWaitInt(t, e.path("pid"), 5*time.Second))
	e.notePid(pid)
	gone := ptWatchGone(ctx, pid)
	time.Sleep(900 * time.Millisecond)

	unlock := ptLockStore(t, e.path("slots.db"), 20*time.Second)
	lockAt := time.Now()
	code := p.wait(t, 20*time.Second)
	unlock()
	if code != exitLost {
		t.Errorf("slotctl exited %d, want %d; stderr:\n%s", code, exitLost, p.stderr())
	}
	select {
	case at := <-gone:
		// The last acknowledged renewal was sent before lockAt: the store
		// may expire the lease from lockAt + TTL on.
		if after := at.Sub(lockAt); after >= ttl {
			t.Errorf("child that ignores SIGTERM gone %s after the store stopped answering: its %s lease may have expired in the store before", ptMS(after), ttl)
		} else {
			t.Logf("store stopped answering -> child (ignoring SIGTERM) gone %s later (ttl %s)", ptMS(after), ttl)
		}
	case <-time.After(time.Second):
		t.Errorf("child %d still running after slotctl exited", pid)
	}
}
