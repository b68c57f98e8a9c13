package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// The stores' errors carry no command-line words; the command adds them in
// the one line it prints: a lock timeout names the flag and variable that
// set the wait, wrapped or not.
func TestErrorLineLockTimeout(t *testing.T) {
	lt := &store.LockTimeoutError{Path: "/s/slots.db", Waited: 200 * time.Millisecond}
	for _, err := range []error{lt, fmt.Errorf("run: %w", lt)} {
		line := errorLine(err)
		want := "slotctl: " + err.Error() + "; try again, or wait longer with --store-timeout (SLOTCTL_STORE_TIMEOUT)\n"
		if line != want {
			t.Errorf("errorLine(%v) = %q, want %q", err, line, want)
		}
		if exitCode(err) != exitUnavailable {
			t.Errorf("exitCode(%v) = %d, want %d", err, exitCode(err), exitUnavailable)
		}
	}
	if strings.Contains(lt.Error(), "--") {
		t.Errorf("the store's own message %q names a flag", lt.Error())
	}
}

// A store directory on a network filesystem: the store says why, the
// command says which flag names an etcd store instead.
func TestErrorLineNetworkFS(t *testing.T) {
	err := error(&boltstore.NetworkFSError{Dir: "/nfs/slots", FS: "nfs"})
	want := "slotctl: store unavailable: store directory /nfs/slots is on nfs: bbolt's file lock is not reliable there; " +
		"use a local path, or an etcd store for limits shared across hosts; e.g. --store etcd://HOST:2379\n"
	if line := errorLine(err); line != want {
		t.Errorf("errorLine = %q, want %q", line, want)
	}
	if exitCode(err) != exitUnavailable {
		t.Errorf("exitCode = %d, want %d", exitCode(err), exitUnavailable)
	}
}

// A waiter stopped by a signal says it left the queue only when its
// ticket was removed; when the removal failed (said on the line before),
// its last line says the ticket stays until its lease expires.
func TestSignalledWaiterLine(t *testing.T) {
	o := &RunOptions{Argv: []string{"make"}}
	out := holder.Outcome{Result: holder.Signalled, Signal: syscall.SIGTERM, Ticket: store.Ticket{ID: "75342074abcdef"}}
	for _, tc := range []struct {
		leaveErr error
		want     string
	}{
		{nil, `terminated while waiting for limit "scale": left the queue`},
		{errors.New("context deadline exceeded"), `terminated while waiting for limit "scale": its ticket 75342074 stays in the queue until its lease expires`},
	} {
		out.LeaveErr = tc.leaveErr
		err := outcomeErr(context.Background(), nil, o, []string{"scale"}, out)
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != 128+15 || ee.Err == nil || ee.Err.Error() != tc.want {
			t.Errorf("leave error %v: %v; want exit 143 saying %q", tc.leaveErr, err, tc.want)
		}
	}
}
