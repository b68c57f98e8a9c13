package cli

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestRestoredStoreStopsTheJobItAdmittedSince: the store's file is replaced
// by a copy taken while a run still waited. That run has been admitted
// since, and its job runs; in the copy its ticket waits again, and the
// store would admit others beside it. Its next renewal is lost: the job is
// stopped and slotctl exits 76, within a few TTLs, not when the job ends.
func TestRestoredStoreStopsTheJobItAdmittedSince(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const ttl = 3 * time.Second
	a := e.start(ctx, "a", "run", "--limit", "r", "--ttl", ttl.String(), "--",
		"sh", "-c", `echo $$ > a-pid; while [ ! -e a-done ]; do sleep 0.05; done`)
	e.notePid(int(ptWaitInt(t, e.path("a-pid"), 20*time.Second)))
	b := e.start(ctx, "b", "run", "--limit", "r", "--ttl", ttl.String(), "--",
		"sh", "-c", `echo $$ > b-pid; exec sleep 1000`)
	ptWaitFor(t, "b queued", 20*time.Second, func() bool { return strings.Contains(b.stderr(), "waiting for limit") })

	db := e.path("slots.db")
	unlock := ptLockStore(t, db, 10*time.Second)
	backup, err := os.ReadFile(db)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.path("a-done"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("a exited %d; stderr:\n%s", code, a.stderr())
	}
	bPid := int(ptWaitInt(t, e.path("b-pid"), 30*time.Second))
	e.notePid(bPid)

	// The restore: the copy renamed over the file, under the store's lock.
	unlock = ptLockStore(t, db, 10*time.Second)
	if err := os.WriteFile(db+".restore", backup, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(db+".restore", db); err != nil {
		t.Fatal(err)
	}
	unlock()
	restored := time.Now()
	if code := b.wait(t, 10*ttl); code != exitLost {
		t.Fatalf("b exited %d, want %d (lease lost); stderr:\n%s", code, exitLost, b.stderr())
	}
	if !ptGone(bPid) {
		t.Errorf("b's job (%d) still runs after b exited", bPid)
	}
	t.Logf("b stopped %v after the restore", time.Since(restored).Round(time.Millisecond))
}
