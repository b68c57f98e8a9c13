//go:build linux

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/internal/testkit/attacktest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

const replayVar = "SLOTCTLTEST_REPLAY"

// TestAttackHelperReplay is not a test: run as the attacker by
// TestAttackReplayedTicketKillsNobody, it writes ticket ID back into the
// bbolt file PATH as a held ticket of LIMIT whose supervisor is PID START,
// with no process group (SLOTCTLTEST_REPLAY="PATH LIMIT ID PID START"), as
// any member of the store's group can: it enqueues a ticket of its own and
// renames it in the file.
func TestAttackHelperReplay(t *testing.T) {
	spec := os.Getenv(replayVar)
	if spec == "" {
		t.Skip("helper for TestAttackReplayedTicketKillsNobody")
	}
	f := strings.Fields(spec)
	if len(f) != 5 {
		t.Fatalf("%s=%q", replayVar, spec)
	}
	path, limit, id := f[0], f[1], f[2]
	pid, _ := strconv.Atoi(f[3])
	start, _ := strconv.ParseUint(f[4], 10, 64)
	st, err := boltstore.New(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const tmp = "replayreplayreplayreplayreplay00"
	host, _ := os.Hostname()
	tk, err := st.Enqueue(context.Background(), store.EnqueueRequest{ID: tmp, Limit: limit, Slots: 1, TTL: time.Hour,
		Holder: store.Holder{Host: host, BootID: proc.BootID(), PidNS: proc.PidNS(), Pid: pid, PidStart: start, Argv: []string{"sh"}}})
	st.Close()
	if err != nil || tk.State != store.Held {
		t.Fatalf("enqueue: %+v, %v; want held", tk, err)
	}
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
	err = db.Update(func(tx *bolt.Tx) error {
		ids := tx.Bucket([]byte("ids"))
		v := ids.Get([]byte(tmp))
		if v == nil {
			return errors.New("no ids entry")
		}
		if err := ids.Put([]byte(id), append([]byte(nil), v...)); err != nil {
			return err
		}
		if err := ids.Delete([]byte(tmp)); err != nil {
			return err
		}
		b := tx.Bucket([]byte("queue")).Bucket([]byte(limit))
		n := 0
		err := b.ForEach(func(k, v []byte) error {
			var rec map[string]any
			if err := json.Unmarshal(v, &rec); err != nil || rec["id"] != tmp {
				return err
			}
			rec["id"] = id
			nv, err := json.Marshal(rec)
			if err != nil {
				return err
			}
			n++
			return b.Put(k, nv)
		})
		if err == nil && n != 1 {
			err = fmt.Errorf("%d records of %s", n, tmp)
		}
		return err
	})
	if err != nil {
		t.Fatalf("replay ticket %s: %v", id, err)
	}
	fmt.Println("REPLAYED")
}

// Case 6: the authority to kill is the owner's, never the store's. A job
// (Bob's, or root's) ends normally and leaves a daemon behind that carries
// its ticket and supervisor (started here with the job's environment, as a
// `setsid sleep 1000 &` that escaped the drain would be). Alice, a member,
// writes the job's ticket back into the bbolt file with its dead
// supervisor's pid and no group. Neither root's run settling the full
// limit nor root's reap may kill the daemon: the job was released and its
// marker removed, so nothing but a replayable record calls it an orphan.
// (Before, both SIGKILLed it as an "orphaned job".)
func TestAttackReplayedTicketKillsNobody(t *testing.T) {
	e := attacktest.New(t)
	bin := e.Install(slotctlPath(t), "slotctl")
	helper := e.Install(testBinary(t), "slotctl.test")
	for _, victim := range []attacktest.User{e.Bob, e.Root} {
		t.Run(victim.Name, func(t *testing.T) {
			dir := e.SharedDir("shared-replay-"+victim.Name, attacktest.Mode(0o3770))
			path := filepath.Join(dir, "slots.db")
			env := []string{"SLOTCTL_STORE=" + path}
			jobFile := filepath.Join(victim.Home, "job-"+victim.Name)
			r := attacktest.Run(t, victim.Command(dir, env, bin, "run", "--limit", "build", "--slots", "1", "--", "sh", "-c",
				`echo "$SLOTCTL_TICKET $SLOTCTL_SUPERVISOR" > "$1.tmp"; mv "$1.tmp" "$1"`, "sh", jobFile), 30*time.Second)
			if r.Code != 0 {
				t.Fatalf("the victim's job: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			b, err := os.ReadFile(jobFile)
			f := strings.Fields(string(b))
			if err != nil || len(f) != 2 {
				t.Fatalf("the job's ticket and supervisor: %q, %v", b, err)
			}
			id, sup := f[0], f[1]
			m, err := proc.ParseMarker(sup)
			if err != nil {
				t.Fatal(err)
			}
			marker := filepath.Join(path+".bells", strconv.Itoa(int(victim.Uid)), id+".job")
			if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the job's marker %s after its release: %v; want removed", marker, err)
			}

			// The daemon the job left running, with the job's environment.
			d := victim.Command(dir, []string{proc.TicketVar + "=" + id, proc.SupervisorVar + "=" + sup}, "sleep", "1000")
			d.SysProcAttr.Setsid = true
			if err := d.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Process.Kill(); _ = d.Wait() })
			dStart, err := proc.StartTime(d.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			alive := func(when string) {
				t.Helper()
				if proc.Identify(d.Process.Pid, dStart) != proc.Alive {
					t.Fatalf("%s: the daemon the released job left (pid %d) was killed", when, d.Process.Pid)
				}
			}

			replay := e.Alice.Command(dir, []string{fmt.Sprintf("%s=%s build %s %d %d", replayVar, path, id, m.Pid, m.Start)},
				helper, "-test.run=^TestAttackHelperReplay$", "-test.count=1")
			if r := attacktest.Run(t, replay, 30*time.Second); r.Code != 0 || !strings.Contains(r.Stdout, "REPLAYED") {
				t.Fatalf("Alice's replay failed: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}

			r = attacktest.Run(t, e.Root.Command(dir, env, bin, "run", "--limit", "build", "--wait", "0", "--", "true"), 30*time.Second)
			t.Logf("root's run: exit %d: %s%s", r.Code, r.Stdout, r.Stderr)
			if r.Code != exitBusy {
				t.Errorf("root's run into the limit the replayed ticket fills: exit %d, want %d (busy: the TTL decides)\n%s", r.Code, exitBusy, r.Stderr)
			}
			alive("after root's run settled the full limit")
			r = attacktest.Run(t, e.Root.Command(dir, env, bin, "reap"), 30*time.Second)
			t.Logf("root's reap: exit %d: %s%s", r.Code, r.Stdout, r.Stderr)
			if r.Code != 0 || strings.Contains(r.Stdout+r.Stderr, "killed") {
				t.Errorf("root's reap on the replayed ticket: exit %d: %s%s", r.Code, r.Stdout, r.Stderr)
			}
			alive("after root's reap")

		})
	}
}
