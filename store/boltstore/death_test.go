//go:build linux

package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/internal/proc/proctest"
	"github.com/slotctl/slotctl/store"
)

// Proof of death through the store (docs/leases.md §4.3, rule 9, E1
// and C8), with real processes and the real judge. The TTL is an hour, so
// only a proof of death can free a slot here.

const deathTTL = time.Hour

// The processes are proctest's: each is killed and reaped in t.Cleanup.
var (
	deathEmptyGroup = proctest.EmptyGroup
	deathJob        = proctest.Job
)

// deathSpawn starts name args, a real child of the test.
func deathSpawn(t *testing.T, group bool, name string, args ...string) *proctest.Kid {
	t.Helper()
	return proctest.Spawn(t, group, nil, name, args...)
}

// deathMembers counts the running (non-zombie) members of group pgid.
func deathMembers(pgid int) int { return len(proctest.Members(pgid)) }

func deathHolder(pid int, start uint64, pgid int, pgidStart uint64) store.Holder {
	host, _ := os.Hostname()
	return store.Holder{Host: host, BootID: proc.BootID(), PidNS: proc.PidNS(), Pid: pid, PidStart: start,
		Pgid: pgid, PgidStart: pgidStart, Argv: []string{"sleep", "30"}}
}

// deathStore is a store on a real file with the real judge. clock nil: the
// system clock (boot-time clock and boot id).
func deathStore(t *testing.T, clock Clock) *Store {
	t.Helper()
	var jd proc.Judge
	dead := func(t store.Ticket, act bool) (string, bool) { return jd.Dead(t, act) }
	s, err := New(filepath.Join(t.TempDir(), "slots.db"), Options{Dead: dead, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	jd.Authority = s.JobAuthority // a reaper's judge: it may kill with the owner's marker
	return s
}

// deathMark leaves the owner's marker of ticket id's job, whose process
// pid carries it (as slotctl run does at admission).
func deathMark(t *testing.T, s *Store, id string, pid int) func() {
	t.Helper()
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	var m proc.Marker
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, proc.SupervisorVar+"="); ok {
			if m, err = proc.ParseMarker(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	unmark, err := s.MarkJob(id, m)
	if err != nil {
		t.Fatalf("MarkJob(%s): %v", id, err)
	}
	t.Cleanup(unmark)
	return unmark
}

func deathEnqueue(t *testing.T, s *Store, id, limit string, slots int, h store.Holder) store.Ticket {
	t.Helper()
	tk, err := s.Enqueue(context.Background(), store.EnqueueRequest{ID: id, Limit: limit, Slots: slots, TTL: deathTTL, Holder: h})
	if err != nil {
		t.Fatalf("Enqueue(%s): %v", id, err)
	}
	return tk
}

func deathState(t *testing.T, s *Store, id string) store.State {
	t.Helper()
	tk, err := s.Get(context.Background(), id)
	if errors.Is(err, store.ErrNotFound) {
		return "gone"
	}
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return tk.State
}

// deathEvidence returns the evidence of the reaped event of ticket id.
func deathEvidence(t *testing.T, s *Store, id string) (string, bool) {
	t.Helper()
	evs, err := s.Events(context.Background(), "", store.MaxEvents)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Ticket == id && e.Kind == string(store.Reaped) {
			return e.Evidence, true
		}
	}
	return "", false
}

// selfHolder is the test process itself: a holder that is alive.
func selfHolder(t *testing.T, pgid int, pgidStart uint64) store.Holder {
	t.Helper()
	start, err := proc.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return deathHolder(os.Getpid(), start, pgid, pgidStart)
}

// A holder whose supervisor was SIGKILLed and whose job's group is empty is
// swept by the admission that needs its slot: the new ticket is held at
// once, an hour before the TTL. A live holder stays.
func TestDeathFreesSlotInAdmission(t *testing.T) {
	ctx := context.Background()
	s := deathStore(t, nil)
	sup := deathSpawn(t, false, "sleep", "30")
	pgid, pgidStart := deathEmptyGroup(t)
	liveSup := deathSpawn(t, false, "sleep", "30")

	live := deathEnqueue(t, s, "live", "x", 2, deathHolder(liveSup.Pid, liveSup.Start, pgid, pgidStart))
	dead := deathEnqueue(t, s, "dead", "x", 2, deathHolder(sup.Pid, sup.Start, 0, 0))
	if live.State != store.Held || dead.State != store.Held {
		t.Fatalf("live %s, dead %s: want both held", live.State, dead.State)
	}
	if _, err := s.SetChild(ctx, dead, pgid, pgidStart); err != nil {
		t.Fatal(err)
	}
	// Both alive: a contended admission probes them and removes nobody.
	if w := deathEnqueue(t, s, "early", "x", 2, selfHolder(t, 0, 0)); w.State != store.Waiting {
		t.Fatalf("early: %s while both holders live, want waiting", w.State)
	}
	if _, err := s.Release(ctx, store.Ticket{ID: "early"}, store.Cancelled); err != nil {
		t.Fatal(err)
	}

	sup.Kill() // the supervisor is SIGKILLed and gone
	n := deathEnqueue(t, s, "new", "x", 2, selfHolder(t, 0, 0))
	if n.State != store.Held {
		t.Fatalf("new: %s, want held at once (the dead holder's slot freed in the admission)", n.State)
	}
	if got := deathState(t, s, "dead"); got != "gone" {
		t.Errorf("dead holder: %s, want removed", got)
	}
	if got := deathState(t, s, "live"); got != store.Held {
		t.Errorf("live holder: %s, want held", got)
	}
	want := fmt.Sprintf("supervisor %d gone, process group %d empty", sup.Pid, pgid)
	if ev, ok := deathEvidence(t, s, "dead"); !ok || ev != want {
		t.Errorf("reaped event of dead: %q (found %v), want %q", ev, ok, want)
	}
	// Reap finds nothing more to do: the live holders stay.
	if rs, err := s.Reap(ctx, store.ReapOptions{}); err != nil || len(rs) != 0 {
		t.Errorf("Reap after the sweep = %+v, %v; want nothing", rs, err)
	}
	if deathState(t, s, "live") != store.Held || deathState(t, s, "new") != store.Held {
		t.Errorf("Reap removed a live holder")
	}
}

// Reap (dry run, then real) reports the proof of death; live holders stay,
// and the waiter next in line is promoted.
func TestDeathReapReportsEvidence(t *testing.T) {
	ctx := context.Background()
	s := deathStore(t, nil)
	held := deathSpawn(t, false, "sleep", "30")
	waiting := deathSpawn(t, false, "sleep", "30")
	pgid, pgidStart := deathEmptyGroup(t)

	deathEnqueue(t, s, "live", "x", 2, selfHolder(t, 0, 0))
	d := deathEnqueue(t, s, "dead", "x", 2, deathHolder(held.Pid, held.Start, 0, 0))
	if _, err := s.SetChild(ctx, d, pgid, pgidStart); err != nil {
		t.Fatal(err)
	}
	deathEnqueue(t, s, "deadw", "x", 2, deathHolder(waiting.Pid, waiting.Start, 0, 0)) // waiting, no child yet
	deathEnqueue(t, s, "next", "x", 2, selfHolder(t, 0, 0))
	if rs, err := s.Reap(ctx, store.ReapOptions{}); err != nil || len(rs) != 0 {
		t.Fatalf("Reap with every supervisor alive = %+v, %v; want nothing", rs, err)
	}

	held.Kill()
	waiting.Kill()
	want := map[string]string{
		"dead":  fmt.Sprintf("supervisor %d gone, process group %d empty", held.Pid, pgid),
		"deadw": fmt.Sprintf("supervisor %d gone, no child started", waiting.Pid),
	}
	check := func(what string, rs []store.Removal, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := map[string]string{}
		for _, r := range rs {
			got[r.Ticket.ID] = r.Evidence
			if r.Reason != store.Reaped {
				t.Errorf("%s: %s removed as %s, want reaped", what, r.Ticket.ID, r.Reason)
			}
		}
		if len(got) != len(want) || got["dead"] != want["dead"] || got["deadw"] != want["deadw"] {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	rs, err := s.Reap(ctx, store.ReapOptions{DryRun: true})
	check("Reap(dry run)", rs, err)
	if deathState(t, s, "dead") != store.Held || deathState(t, s, "deadw") != store.Waiting {
		t.Errorf("a dry run removed tickets")
	}
	rs, err = s.Reap(ctx, store.ReapOptions{})
	check("Reap", rs, err)
	for id, want := range map[string]store.State{"live": store.Held, "next": store.Held, "dead": "gone", "deadw": "gone"} {
		if got := deathState(t, s, id); got != want {
			t.Errorf("after Reap, %s: %s, want %s", id, got, want)
		}
	}
	if ev, _ := deathEvidence(t, s, "dead"); ev != want["dead"] {
		t.Errorf("reaped event of dead: %q, want %q", ev, want["dead"])
	}
}

// E1: the recorded supervisor pid names a live, unrelated process (another
// start time). The holder is dead; the unrelated process is not signalled.
func TestDeathE1PidReused(t *testing.T) {
	ctx := context.Background()
	s := deathStore(t, nil)
	other := deathSpawn(t, false, "sleep", "30")
	pgid, pgidStart := deathEmptyGroup(t)
	want := fmt.Sprintf("supervisor %d gone (pid reused by another process), process group %d empty", other.Pid, pgid)

	// Through Reap.
	deathEnqueue(t, s, "h", "x", 1, deathHolder(other.Pid, other.Start+1, pgid, pgidStart))
	rs, err := s.Reap(ctx, store.ReapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Ticket.ID != "h" || rs[0].Evidence != want {
		t.Fatalf("Reap = %+v, want h reaped with %q", rs, want)
	}
	// Through a contended admission: the newcomer is held at once.
	deathEnqueue(t, s, "h1", "z", 1, deathHolder(other.Pid, other.Start+1, pgid, pgidStart))
	if w := deathEnqueue(t, s, "w", "z", 1, selfHolder(t, 0, 0)); w.State != store.Held {
		t.Errorf("w behind a holder whose pid was reused: %s, want held", w.State)
	}
	if ev, ok := deathEvidence(t, s, "h1"); !ok || ev != want {
		t.Errorf("reaped event of h1: %q (found %v), want %q", ev, ok, want)
	}
	if got := proc.Identify(other.Pid, other.Start); got != proc.Alive {
		t.Errorf("the process that holds the reused pid: %v, want alive (never signalled)", got)
	}

	// The same ticket with the right start time is a live holder: kept.
	deathEnqueue(t, s, "h2", "y", 1, deathHolder(other.Pid, other.Start, pgid, pgidStart))
	if rs, err := s.Reap(ctx, store.ReapOptions{Limits: []string{"y"}}); err != nil || len(rs) != 0 {
		t.Errorf("Reap of a live holder = %+v, %v; want nothing", rs, err)
	}
}

// C8: the supervisor died, its job's process group runs on. A dry run says
// it would kill it and kills nothing; Reap kills the group, frees the slot
// and promotes the waiter.
func TestOrphanReapKillsGroupAndPromotes(t *testing.T) {
	ctx := context.Background()
	s := deathStore(t, nil)
	sup := deathSpawn(t, false, "sleep", "30")
	job := deathJob(t, "h")
	deathMark(t, s, "h", job.Pid)
	h := deathEnqueue(t, s, "h", "x", 1, deathHolder(sup.Pid, sup.Start, 0, 0))
	if _, err := s.SetChild(ctx, h, job.Pid, job.Start); err != nil {
		t.Fatal(err)
	}
	if w := deathEnqueue(t, s, "w", "x", 1, selfHolder(t, 0, 0)); w.State != store.Waiting {
		t.Fatalf("w: %s while h's supervisor lives, want waiting", w.State)
	}
	sup.Kill() // SIGKILL: the job keeps running, orphaned

	rs, err := s.Reap(ctx, store.ReapOptions{DryRun: true})
	want := fmt.Sprintf("supervisor %d gone, orphaned process group %d still running: would be killed", sup.Pid, job.Pid)
	if err != nil || len(rs) != 1 || rs[0].Ticket.ID != "h" || rs[0].Evidence != want {
		t.Fatalf("Reap(dry run) = %+v, %v; want h with %q", rs, err, want)
	}
	if deathMembers(job.Pid) != 2 || proc.GroupEmpty(job.Pid) {
		t.Fatalf("a dry run signalled the group: %d running members", deathMembers(job.Pid))
	}
	if deathState(t, s, "h") != store.Held || deathState(t, s, "w") != store.Waiting {
		t.Fatalf("a dry run changed the tickets")
	}

	rs, err = s.Reap(ctx, store.ReapOptions{})
	want = fmt.Sprintf("supervisor %d gone, orphaned process group %d killed", sup.Pid, job.Pid)
	if err != nil || len(rs) != 1 || rs[0].Ticket.ID != "h" || rs[0].Evidence != want {
		t.Fatalf("Reap = %+v, %v; want h with %q", rs, err, want)
	}
	if !proc.GroupEmpty(job.Pid) {
		t.Errorf("orphaned group %d still has %d running members", job.Pid, deathMembers(job.Pid))
	}
	if got := deathState(t, s, "w"); got != store.Held {
		t.Errorf("waiter after the orphan was reaped: %s, want held", got)
	}
	if ev, _ := deathEvidence(t, s, "h"); ev != want {
		t.Errorf("reaped event: %q, want %q", ev, want)
	}
}

// C8 in an admission: the contended Enqueue kills the orphaned job before it
// hands out the slot.
func TestOrphanKilledByAdmission(t *testing.T) {
	ctx := context.Background()
	s := deathStore(t, nil)
	sup := deathSpawn(t, false, "sleep", "30")
	job := deathJob(t, "h")
	deathMark(t, s, "h", job.Pid)
	h := deathEnqueue(t, s, "h", "x", 1, deathHolder(sup.Pid, sup.Start, 0, 0))
	if _, err := s.SetChild(ctx, h, job.Pid, job.Start); err != nil {
		t.Fatal(err)
	}
	sup.Kill()
	n := deathEnqueue(t, s, "n", "x", 1, selfHolder(t, 0, 0))
	if n.State != store.Held {
		t.Fatalf("n: %s, want held once the orphan is killed", n.State)
	}
	if !proc.GroupEmpty(job.Pid) {
		t.Errorf("slot handed out while the orphaned group %d runs (%d members)", job.Pid, deathMembers(job.Pid))
	}
	want := fmt.Sprintf("supervisor %d gone, orphaned process group %d killed", sup.Pid, job.Pid)
	if ev, ok := deathEvidence(t, s, "h"); !ok || ev != want {
		t.Errorf("reaped event: %q, want %q", ev, want)
	}
}

// An orphaned job whose group id now names another group (its leader's start
// time differs) is not signalled and not proven dead: the TTL decides.
func TestOrphanOtherGroupNotKilled(t *testing.T) {
	ctx := context.Background()
	s := deathStore(t, nil)
	pid, start := deathEmptyGroup(t) // a gone supervisor
	job := deathJob(t, "h")
	deathEnqueue(t, s, "h", "x", 1, deathHolder(pid, start, job.Pid, job.Start+1))
	if w := deathEnqueue(t, s, "w", "x", 1, selfHolder(t, 0, 0)); w.State != store.Waiting {
		t.Errorf("w: %s, want waiting", w.State)
	}
	if rs, err := s.Reap(ctx, store.ReapOptions{}); err != nil || len(rs) != 0 {
		t.Errorf("Reap = %+v, %v; want nothing", rs, err)
	}
	if deathMembers(job.Pid) != 2 {
		t.Errorf("a group that is not the job's was signalled: %d running members", deathMembers(job.Pid))
	}
}

// An expired ticket is shown to the judge even where death is not probed
// (an uncontended sweep): a job left running by a dead supervisor is killed
// before its slot is freed.
func TestOrphanKilledOnExpiry(t *testing.T) {
	ctx := context.Background()
	clock := NewFakeClock(Instant{Boot: proc.BootID(), Mono: proc.Boottime(), Wall: time.Now()})
	s := deathStore(t, clock)
	sup := deathSpawn(t, false, "sleep", "30")
	job := deathJob(t, "h")
	deathMark(t, s, "h", job.Pid)
	h := deathEnqueue(t, s, "h", "x", 2, deathHolder(sup.Pid, sup.Start, 0, 0))
	if _, err := s.SetChild(ctx, h, job.Pid, job.Start); err != nil {
		t.Fatal(err)
	}
	other := deathEnqueue(t, s, "o", "x", 2, selfHolder(t, 0, 0))
	sup.Kill()
	clock.Advance(deathTTL + time.Minute)
	// Releasing o sweeps x without contention: only expiry brings h to the judge.
	if ok, err := s.Release(ctx, other, store.Released); err != nil || !ok {
		t.Fatalf("Release(o) = %v, %v", ok, err)
	}
	if got := deathState(t, s, "h"); got != "gone" {
		t.Errorf("expired h: %s, want reaped", got)
	}
	if !proc.GroupEmpty(job.Pid) {
		t.Errorf("expired ticket's orphaned group %d still runs (%d members)", job.Pid, deathMembers(job.Pid))
	}
	ev, _ := deathEvidence(t, s, "h")
	if !strings.HasPrefix(ev, "expired ") || !strings.Contains(ev, fmt.Sprintf("orphaned process group %d killed", job.Pid)) {
		t.Errorf("reaped event: %q, want expiry and the kill", ev)
	}
}

// An enqueue does not judge the ticket it writes: a late duplicate of a
// request whose sender has died since is not proof that the ticket's holder
// is gone, and the step must answer with the ticket it wrote, not remove it
// in the same breath and answer with nothing.
func TestEnqueueDoesNotJudgeItsOwnTicket(t *testing.T) {
	s := deathStore(t, nil)
	liveSup := deathSpawn(t, false, "sleep", "30")
	pgid, pgidStart := deathEmptyGroup(t)
	if h := deathEnqueue(t, s, "live", "x", 1, deathHolder(liveSup.Pid, liveSup.Start, pgid, pgidStart)); h.State != store.Held {
		t.Fatalf("live: %s, want held", h.State)
	}
	sup := deathSpawn(t, false, "sleep", "30")
	sup.Kill() // the sender of the late request is gone
	w := deathEnqueue(t, s, "late", "x", 1, deathHolder(sup.Pid, sup.Start, 0, 0))
	if w.ID != "late" || w.Fence == 0 || w.State != store.Waiting {
		t.Fatalf("late enqueue answered %+v, want its own ticket, waiting", w)
	}
	if got := deathState(t, s, "late"); got != store.Waiting {
		t.Errorf("late: %s, want waiting (left to its TTL or a reap)", got)
	}
}
