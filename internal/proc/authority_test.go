//go:build linux

package proc

import (
	"os"
	"strings"
	"testing"

	"github.com/slotctl/slotctl/internal/proc/proctest"
	"github.com/slotctl/slotctl/store"
)

// The authority to kill an orphaned job is its owner's evidence, never the
// ticket: the table's rows are what a reaper may find beside a job that
// outlived its supervisor. Only the owner's marker naming the supervisor
// the job's processes name, asked for under the uid they run as, lets the
// judge kill it; otherwise the job is left running and the ticket to the
// TTL. (Before, any ticket naming a gone supervisor was enough.)
func TestDeadKillNeedsTheOwnersMarker(t *testing.T) {
	gone, goneStart := gonePid(t)
	other, otherStart := gonePid(t)
	for _, tc := range []struct {
		name   string
		marker func(job Marker) (Marker, bool) // what the owner's directory holds; nil: no authority at all
		kill   bool
	}{
		{"no authority (a run settling)", nil, false},
		{"no marker (released, ticket replayed)", func(Marker) (Marker, bool) { return Marker{}, false }, false},
		{"marker of another supervisor", func(m Marker) (Marker, bool) { m.Pid, m.Start = other, otherStart; return m, true }, false},
		{"marker of another pid namespace", func(m Marker) (Marker, bool) { m.PidNS++; return m, true }, false},
		{"the owner's marker", func(m Marker) (Marker, bool) { return m, true }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := proctest.JobOf(t, ticketID, proctest.SupervisorVar(gone, goneStart))
			jm := Marker{Pid: gone, Start: goneStart, PidNS: PidNS()}
			var asked []int
			var jd Judge
			if tc.marker != nil {
				jd.Authority = func(uid int, id string) (Marker, bool) {
					asked = append(asked, uid)
					if id != ticketID {
						t.Errorf("authority asked for ticket %q, want %q", id, ticketID)
					}
					return tc.marker(jm)
				}
			}
			// A replayed ticket: a dead supervisor pid, and no group.
			for _, tk := range []store.Ticket{ticket(store.Held, gone, goneStart, 0, 0), ticket(store.Held, gone, goneStart, job.Pid, job.Start)} {
				dry, dryDead := jd.Dead(tk, false)
				if dryDead != tc.kill || tc.kill != strings.Contains(dry, "would be killed") {
					t.Errorf("Dead(%+v, dry run) = %q, %v; want would be killed: %v", tk.Holder, dry, dryDead, tc.kill)
				}
			}
			if len(groupMembers(job.Pid)) != 2 {
				t.Fatalf("a dry run signalled the job: members %v", groupMembers(job.Pid))
			}
			ev, dead := jd.Dead(ticket(store.Held, gone, goneStart, 0, 0), true)
			if dead != tc.kill || tc.kill != strings.Contains(ev, "killed") {
				t.Errorf("Dead(replayed ticket, act) = %q, %v; want killed: %v", ev, dead, tc.kill)
			}
			if running := len(groupMembers(job.Pid)) > 0; running == tc.kill {
				t.Errorf("job members after Dead: %v; want killed: %v", groupMembers(job.Pid), tc.kill)
			}
			for _, uid := range asked {
				if uid != os.Getuid() {
					t.Errorf("authority asked under uid %d, want the job's uid %d", uid, os.Getuid())
				}
			}
		})
	}
}

// procUID is the one uid a process runs as.
func TestProcUID(t *testing.T) {
	if got := procUID(os.Getpid()); got != os.Getuid() {
		t.Errorf("procUID(self) = %d, want %d", got, os.Getuid())
	}
	if got := procUID(1 << 30); got != -1 {
		t.Errorf("procUID(no such process) = %d, want -1", got)
	}
}
