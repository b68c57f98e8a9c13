package cli

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestEarlyGuardOfTheOtherForeground: a guard prepared for the terminal's
// foreground is of no use to a run that is no longer there when admitted
// (moved to the background while it waited): it is ended, and the command
// runs under a new guard started for where the run is now.
func TestEarlyGuardOfTheOtherForeground(t *testing.T) {
	var out, errOut bytes.Buffer
	f := &Factory{IO: &IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}} // no terminal
	pj, err := prepareJob(f.IO, os.Environ(), nil, true)                                 // as if in the foreground
	if err != nil {
		t.Fatal(err)
	}
	early := pj.p.Pid()
	// Starting a job under a guard makes this process a subreaper; the
	// scripts' own orphans (sh -c '... &') must go to init, not here, where
	// nobody reaps them.
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	log := &logger{w: &errOut}
	c, err := startPrepared(f, pj, "/bin/sh", []string{"sh", "-c", "echo ran"}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Gone():
	case <-time.After(30 * time.Second):
		t.Fatal("the command did not end")
	}
	c.Close()
	if c.Foreground() || c.pgid == 0 {
		t.Errorf("the command runs as a terminal's foreground job (fg %v, pgid %d); the run is not in the foreground", c.Foreground(), c.pgid)
	}
	if err := syscall.Kill(early, 0); err == nil {
		t.Errorf("the guard prepared for the foreground still runs (pid %d)", early)
	}
	if !strings.Contains(out.String(), "ran") {
		t.Errorf("the command's output %q, want ran", out.String())
	}
}
