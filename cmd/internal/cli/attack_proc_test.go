//go:build linux

package cli

// Attack tests of docs/leases.md §4.5 for the job a reaper may kill:
// real slotctl processes run as throwaway members of a shared store's group
// (internal/testkit/attacktest), the attacker's part done by a process of the
// attacker's own uid.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/internal/proc/proctest"
	"github.com/slotctl/slotctl/internal/testkit/attacktest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

const forgeVar = "SLOTCTLTEST_FORGE"

// TestAttackHelperForge is not a test: run as the attacker by
// TestAttackForgedHolderPid, it rewrites ticket ID's holder pid and start
// time in the bbolt file PATH (SLOTCTLTEST_FORGE="PATH ID PID START"), as any
// member of the store's group can: the file is group-writable.
func TestAttackHelperForge(t *testing.T) {
	spec := os.Getenv(forgeVar)
	if spec == "" {
		t.Skip("helper for TestAttackForgedHolderPid")
	}
	f := strings.Fields(spec)
	if len(f) != 4 {
		t.Fatalf("%s=%q", forgeVar, spec)
	}
	path, id := f[0], f[1]
	pid, _ := strconv.Atoi(f[2])
	start, _ := strconv.ParseUint(f[3], 10, 64)
	lock, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	forged := 0
	err = db.Update(func(tx *bolt.Tx) error {
		q := tx.Bucket([]byte("queue"))
		if q == nil {
			return errors.New("no queue bucket")
		}
		return q.ForEachBucket(func(limit []byte) error {
			b := q.Bucket(limit)
			return b.ForEach(func(k, v []byte) error {
				var rec map[string]any
				if err := json.Unmarshal(v, &rec); err != nil || rec["id"] != id {
					return err
				}
				h := rec["holder"].(map[string]any)
				h["pid"], h["pid_start"] = pid, start
				nv, err := json.Marshal(rec)
				if err != nil {
					return err
				}
				forged++
				return b.Put(k, nv)
			})
		})
	})
	if err != nil || forged != 1 {
		t.Fatalf("forge ticket %s: %d records, %v", id, forged, err)
	}
	fmt.Println("FORGED")
}

// A member (Alice) edits the ticket of a job that another member (Bob), or
// root, runs under slotctl, so that its supervisor pid names a pid not in
// use. Root's reap must not call the running job orphaned, nor signal it.
func TestAttackForgedHolderPid(t *testing.T) {
	e := attacktest.New(t)
	self := slotctlPath(t)
	bin := e.Install(self, "slotctl")
	helper := e.Install(testBinary(t), "slotctl.test")
	for _, victim := range []attacktest.User{e.Bob, e.Root} {
		t.Run(victim.Name, func(t *testing.T) {
			dir := e.SharedDir("shared-"+victim.Name, attacktest.Mode(0o2770))
			path := filepath.Join(dir, "slots.db")
			env := []string{"SLOTCTL_STORE=" + path}
			out := filepath.Join(victim.Home, "ticket")
			sig := filepath.Join(victim.Home, "signalled")
			run := victim.Command(dir, env, bin, "run", "--limit", "build", "--", "sh", "-c",
				`trap 'echo signalled >> "$HOME/signalled"' TERM INT HUP USR1 USR2; echo "$SLOTCTL_TICKET" > "$HOME/ticket.tmp"; mv "$HOME/ticket.tmp" "$HOME/ticket"; sleep 60 & wait`)
			run.SysProcAttr.Setpgid = true // off a terminal, as cron runs it
			if err := run.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- run.Wait() }()
			defer func() {
				_ = syscall.Kill(run.Process.Pid, syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(15 * time.Second):
					_ = syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
					<-exited
				}
			}()
			id := attackWaitTicket(t, out)
			st, err := boltstore.New(path, boltstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			var tk store.Ticket
			for deadline := time.Now().Add(10 * time.Second); tk.Holder.Pgid == 0; time.Sleep(20 * time.Millisecond) {
				if tk, err = st.Get(context.Background(), id); err != nil || time.Now().After(deadline) {
					t.Fatalf("ticket %s: %+v, %v; want its child's group recorded", id, tk, err)
				}
			}
			pgid := tk.Holder.Pgid
			members := proctest.Members(pgid)
			if len(members) != 2 {
				t.Fatalf("victim's job group %d: members %v, want sh and sleep", pgid, members)
			}

			// Alice, a member, forges the holder: a pid that is not in use.
			gone, goneStart := proctest.GonePid(t)
			forge := e.Alice.Command(dir, []string{fmt.Sprintf("%s=%s %s %d %d", forgeVar, path, id, gone, goneStart)},
				helper, "-test.run=^TestAttackHelperForge$", "-test.count=1")
			if r := attacktest.Run(t, forge, 30*time.Second); r.Code != 0 || !strings.Contains(r.Stdout, "FORGED") {
				t.Fatalf("Alice's forgery failed: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			if tk, err = st.Get(context.Background(), id); err != nil || tk.Holder.Pid != gone {
				t.Fatalf("forged ticket: %+v, %v", tk.Holder, err)
			}

			// Root's reap, as the packaged timer ran it.
			r := attacktest.Run(t, e.Root.Command(dir, env, bin, "reap"), 30*time.Second)
			t.Logf("reap: exit %d: %s%s", r.Code, r.Stdout, r.Stderr)
			if strings.Contains(r.Stdout+r.Stderr, "reaped") || strings.Contains(r.Stdout+r.Stderr, "killed") {
				t.Errorf("root's reap acted on the forged ticket: %s%s", r.Stdout, r.Stderr)
			}
			time.Sleep(50 * time.Millisecond)
			if got := proctest.Members(pgid); len(got) != len(members) {
				t.Errorf("the victim's running job was signalled: group %d members %v, were %v", pgid, got, members)
			}
			select {
			case err := <-exited:
				exited <- err
				t.Errorf("the victim's slotctl run ended: %v", err)
			default:
			}
			if _, err := os.Stat(sig); err == nil {
				t.Errorf("a signal reached the victim's job")
			}
			if got, err := st.Get(context.Background(), id); err != nil || got.State != store.Held {
				t.Errorf("victim's ticket after reap: %+v, %v; want still held", got, err)
			}
			if proc.Identify(run.Process.Pid, 0) != proc.Alive {
				t.Errorf("the victim's supervisor is gone")
			}
		})
	}
}

// attackWaitTicket waits for the job to write its ticket id to path.
func attackWaitTicket(t *testing.T, path string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) == 32 {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the victim's job did not write %s", path)
		}
	}
}

// The packaged reaper, an unprivileged member of the group with only
// CAP_KILL, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, reaps another member's
// orphaned job: Bob's slotctl is SIGKILLed, its child dies with it
// (parent-death signal), the grandchild runs on in the job's group.
// `slotctl reap` as that reaper kills it and frees the slot; without the
// capabilities it cannot, and leaves the ticket to its TTL.
func TestAttackCapReaperKillsOrphan(t *testing.T) {
	e := attacktest.New(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs util-linux setpriv")
	}
	self := slotctlPath(t)
	bin := e.Install(self, "slotctl")
	helper := e.Install(testBinary(t), "slotctl.test")
	// Not a subreaper: this test binary also runs scripts whose orphans
	// must go to init, which reaps them. Killed orphans are init's to reap.
	dir := e.SharedDir("shared", attacktest.Mode(0o2770))
	path := filepath.Join(dir, "slots.db")
	env := []string{"SLOTCTL_STORE=" + path}
	run := e.Bob.Command(dir, env, bin, "run", "--limit", "build", "--ttl", "1h", "--", "sh", "-c",
		`sleep 60 & echo "$SLOTCTL_TICKET" > "$HOME/ticket.tmp"; mv "$HOME/ticket.tmp" "$HOME/ticket"; wait`)
	run.SysProcAttr.Setpgid = true
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	id := attackWaitTicket(t, filepath.Join(e.Bob.Home, "ticket"))
	st, err := boltstore.New(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var tk store.Ticket
	for deadline := time.Now().Add(10 * time.Second); tk.Holder.Pgid == 0; time.Sleep(20 * time.Millisecond) {
		if tk, err = st.Get(context.Background(), id); err != nil || time.Now().After(deadline) {
			t.Fatalf("ticket %s: %+v, %v; want its child's group recorded", id, tk, err)
		}
	}
	pgid := tk.Holder.Pgid
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		for _, m := range proctest.Members(pgid) {
			proctest.ReapOrphan(m)
		}
	})
	reap := func(caps string) attacktest.Result {
		args := []string{"--reuid=" + fmt.Sprint(e.Reaper.Uid), "--regid=" + fmt.Sprint(e.Reaper.Gid), "--groups=" + fmt.Sprint(e.Group)}
		if caps == "" {
			args = append(args, "--inh-caps=-all", "--bounding-set=-all")
		} else {
			args = append(args, "--inh-caps=-all,"+caps, "--ambient-caps="+caps, "--bounding-set=-all,"+caps)
		}
		cmd := exec.Command(setpriv, append(args, "--", bin, "reap")...)
		cmd.Dir = e.Reaper.Home
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + e.Reaper.Home, "SLOTCTL_STORE=" + path}
		r := attacktest.Run(t, cmd, 30*time.Second)
		t.Logf("reap (caps %q): exit %d: %s%s", caps, r.Code, r.Stdout, r.Stderr)
		return r
	}
	const packaged = "+kill,+sys_ptrace,+dac_read_search"
	// While Bob's slotctl lives, Alice forges its ticket's supervisor pid:
	// the packaged reaper can read and kill Bob's processes, and must not.
	members := proctest.Members(pgid)
	gone, goneStart := proctest.GonePid(t)
	forge := e.Alice.Command(dir, []string{fmt.Sprintf("%s=%s %s %d %d", forgeVar, path, id, gone, goneStart)},
		helper, "-test.run=^TestAttackHelperForge$", "-test.count=1")
	if r := attacktest.Run(t, forge, 30*time.Second); r.Code != 0 || !strings.Contains(r.Stdout, "FORGED") {
		t.Fatalf("Alice's forgery failed: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := reap(packaged); r.Code != 0 || strings.Contains(r.Stdout+r.Stderr, "reaped") {
		t.Errorf("packaged reaper on a forged ticket: exit %d, %s%s; want nothing reaped", r.Code, r.Stdout, r.Stderr)
	}
	if got := proctest.Members(pgid); len(got) != len(members) {
		t.Fatalf("the packaged reaper signalled Bob's running job on a forged ticket: members %v, were %v", got, members)
	}
	// The supervisor and its guard die (stopped first, so that slotctl
	// cannot see its guard die and kill the job itself); the child dies
	// with the guard, the grandchild runs on.
	g := crashChildNamed(t, run.Process.Pid, "slotctl-guard", 5*time.Second)
	_ = run.Process.Signal(syscall.SIGSTOP)
	_ = syscall.Kill(g, syscall.SIGKILL)
	_ = run.Process.Kill()
	_ = run.Wait()
	var orphans []int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if orphans = proctest.Members(pgid); len(orphans) == 1 && orphans[0] != pgid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job group %d after its supervisor's death: %v, want the orphaned sleep alone", pgid, orphans)
		}
	}
	// Without the capabilities: not provable, nothing killed, nothing freed.
	if r := reap(""); r.Code != 0 || strings.Contains(r.Stdout+r.Stderr, "reaped") {
		t.Errorf("reaper without capabilities: exit %d, %s%s; want nothing reaped", r.Code, r.Stdout, r.Stderr)
	}
	if got := proctest.Members(pgid); len(got) != 1 {
		t.Fatalf("reaper without capabilities touched the job: members %v, were %v", got, orphans)
	}
	if got, err := st.Get(context.Background(), id); err != nil || got.State != store.Held {
		t.Errorf("ticket after a reap without capabilities: %s, %v; want held (the TTL decides)", got.State, err)
	}
	// Bob's slotctl died without releasing: its marker, the evidence that
	// the job is Bob's and was never released, is still in Bob's own bells
	// directory, and is what lets the reaper kill.
	marker := filepath.Join(path+".bells", strconv.Itoa(int(e.Bob.Uid)), id+".job")
	if st, err := os.Lstat(marker); err != nil || !st.Mode().IsRegular() || st.Sys().(*syscall.Stat_t).Uid != e.Bob.Uid {
		t.Fatalf("Bob's job marker %s: %v, %v; want a regular file of Bob's", marker, st, err)
	}
	// With the packaged capabilities: killed and freed.
	r := reap(packaged)
	if want := fmt.Sprintf("orphaned process group %d killed", pgid); r.Code != 0 || !strings.Contains(r.Stdout, "reaped "+id[:8]) || !strings.Contains(r.Stdout, want) {
		t.Errorf("packaged reaper: exit %d, %s%s; want %s reaped: %q", r.Code, r.Stdout, r.Stderr, id[:8], want)
	}
	for _, m := range orphans {
		proctest.ReapOrphan(m)
	}
	if got := proctest.Members(pgid); len(got) != 0 {
		t.Errorf("orphaned job after the packaged reaper: members %v", got)
	}
	if _, err := st.Get(context.Background(), id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ticket after the packaged reaper: %v, want reaped", err)
	}
}

// testBinary is this test binary, which runs the attack's helper tests.
func testBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return self
}
