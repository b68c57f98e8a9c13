//go:build linux

package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/testkit/attacktest"
)

// TestAttackHostileCommandLine, as a member does it: in a
// shared 2770 store, Alice runs a job whose command line clears the screen,
// sets the terminal's title and carries a line of forged reaper output; her
// slotctl dies. Root's reaper (its stdout is the journal) and root's ls and
// log then show that command line escaped, one line per ticket.
func TestAttackHostileCommandLine(t *testing.T) {
	env := attacktest.New(t)
	bin := env.Install(lsBin(t), "slotctl")
	dir := env.SharedDir("shared", attacktest.Mode(0o2770))
	st := filepath.Join(dir, "slots.db")
	held := filepath.Join(dir, "held")

	forged := "reaped 00000000 (limit build, held slot 0, make, pid 1 on host): expired 1s ago"
	script := "touch " + attacktest.Quote(held) + "; exec sleep 60 # \x1b]0;owned\x07\x1b[2J\r\n" + forged + "\n\u202e"
	holder := env.Alice.Command(dir, nil, bin, "run", "--store", st, "--limit", "build", "--", "sh", "-c", script)
	holder.SysProcAttr.Setpgid = true
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); _ = holder.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(held); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alice's job did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}

	root := func(args ...string) attacktest.Result {
		t.Helper()
		var vars []string
		if len(args) == 3 && args[1] == "--env" {
			args, vars = args[:1:1], args[2:] // :1:1, or the append below writes over vars
		}
		r := attacktest.Run(t, env.Root.Command(env.Base, vars, bin, append(args, "--store", st)...), 20*time.Second)
		if r.Code != 0 {
			t.Fatalf("root: slotctl %s: exit %d\n%s%s", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
		}
		assertPrintable(t, "root: slotctl "+strings.Join(args, " "), r.Stdout+r.Stderr, false)
		return r
	}
	ls := root("ls")
	if n := len(lines(ls.Stdout)); n != 5 {
		t.Errorf("root's ls: %d lines, want 5 (limits, build, blank, tickets, alice's):\n%s", n, ls.Stdout)
	}
	root("ls", "-o", "json")

	// Alice's slotctl dies; an hour later (by the reaper's clock) the lease
	// has expired, whether or not the death was provable.
	_ = syscall.Kill(holder.Process.Pid, syscall.SIGKILL)
	_ = holder.Wait()
	reap := root("reap", "--env", "SLOTCTLTEST_CLOCK_OFFSET=1h")
	got := lines(reap.Stdout)
	if len(got) != 1 || !strings.HasPrefix(got[0], "reaped ") || strings.Contains(reap.Stdout, "\n"+forged) {
		t.Errorf("root's reap: want one line of its own for alice's ticket, got %d:\n%s", len(got), reap.Stdout)
	}
	log := root("log")
	if n := len(lines(log.Stdout)); n != 3 { // header, admitted, reaped
		t.Errorf("root's log: %d lines, want 3:\n%s", n, log.Stdout)
	}
	// The record itself is intact: JSON gives back alice's command line.
	j := root("log", "-o", "json")
	var ev eventJSON
	if err := json.Unmarshal([]byte(lines(j.Stdout)[0]), &ev); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ev.Command, "\x1b]0;owned\x07") || !strings.Contains(ev.Command, "\n"+forged) {
		t.Errorf("log -o json: command %q is not alice's", ev.Command)
	}
}
