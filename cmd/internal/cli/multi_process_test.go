package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSeveralLimitsNeverExceedAny: real runs on three limits with weights
// (docs/leases.md §2.1 item 9), started 60 ms apart, each holding ~300 ms so
// that queues build up in every limit. Their children record start and end
// times and SLOTCTL_SLOTS. In every limit the weights of the children that
// run at once never exceed its size and no slot index is held by two of
// them; every run holds exactly its weight of indexes in each of its limits;
// and admissions follow ticket order wherever two tickets share a limit
// (strict FIFO across limits: from the store's own event log).
func TestSeveralLimitsNeverExceedAny(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	sizes := map[string]int{"cpu": 3, "db": 2, "net": 4}
	for name, n := range sizes {
		out, err := e.output("limit", "set", name, strconv.Itoa(n))
		if err != nil {
			t.Fatalf("limit set %s %d: %v\n%s", name, n, err, out)
		}
	}
	// Each run: its limits (in the order given) and its weight.
	type job struct {
		limits []string
		weight int
	}
	jobs := []job{
		{[]string{"cpu"}, 2}, {[]string{"db", "cpu"}, 1}, {[]string{"net"}, 3}, {[]string{"cpu", "db", "net"}, 1},
		{[]string{"db"}, 2}, {[]string{"net", "cpu"}, 2}, {[]string{"cpu"}, 1}, {[]string{"db", "net"}, 1},
		{[]string{"net"}, 4}, {[]string{"cpu", "net"}, 1}, {[]string{"db"}, 1}, {[]string{"cpu", "db"}, 2},
		{[]string{"net", "db", "cpu"}, 1}, {[]string{"cpu"}, 3}, {[]string{"net"}, 1}, {[]string{"db", "cpu", "net"}, 2},
	}
	script := `echo "start $(date +%s%N) $SLOTCTL_FENCE $SLOTCTL_TICKET $SLOTCTL_SLOT $SLOTCTL_LIMIT" > "out.$1.tmp"; ` +
		`echo "slots $SLOTCTL_SLOTS" >> "out.$1.tmp"; sleep 0.3; ` +
		`echo "end $(date +%s%N)" >> "out.$1.tmp"; mv "out.$1.tmp" "out.$1"`
	procs := make([]*ptProc, len(jobs))
	for i, j := range jobs {
		if i > 0 {
			time.Sleep(60 * time.Millisecond)
		}
		args := []string{"run"}
		for _, l := range j.limits {
			args = append(args, "--limit", l)
		}
		args = append(args, "--weight", strconv.Itoa(j.weight), "--", "sh", "-c", script, "sh", strconv.Itoa(i))
		procs[i] = e.start(ctx, fmt.Sprintf("run%d", i), args...)
	}
	for i, p := range procs {
		if code := p.wait(t, 50*time.Second); code != 0 {
			t.Errorf("run %d exited %d, want 0; stderr:\n%s", i, code, p.stderr())
		}
	}
	if t.Failed() {
		return
	}

	type run struct {
		i          int
		start, end int64
		fence      uint64
		ticket     string
		slot       int
		limitVar   string
		slots      map[string][]int
	}
	runs := make([]run, len(jobs))
	for i, j := range jobs {
		b, err := os.ReadFile(e.path(fmt.Sprintf("out.%d", i)))
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 3 {
			t.Fatalf("run %d wrote %q", i, b)
		}
		r := run{i: i, slots: map[string][]int{}}
		if _, err := fmt.Sscanf(lines[0], "start %d %d %s %d %s", &r.start, &r.fence, &r.ticket, &r.slot, &r.limitVar); err != nil {
			t.Fatalf("run %d: %q: %v", i, lines[0], err)
		}
		if _, err := fmt.Sscanf(lines[2], "end %d", &r.end); err != nil {
			t.Fatalf("run %d: %q: %v", i, lines[2], err)
		}
		if want := strings.Join(j.limits, ","); r.limitVar != want {
			t.Errorf("run %d: SLOTCTL_LIMIT=%q, want %q", i, r.limitVar, want)
		}
		// SLOTCTL_SLOTS: NAME=I[,I...] in the order of the limits.
		pairs := strings.Fields(strings.TrimPrefix(lines[1], "slots "))
		if len(pairs) != len(j.limits) {
			t.Fatalf("run %d: SLOTCTL_SLOTS %q, want one pair for each of %v", i, lines[1], j.limits)
		}
		for k, p := range pairs {
			name, list, ok := strings.Cut(p, "=")
			if !ok || name != j.limits[k] {
				t.Fatalf("run %d: SLOTCTL_SLOTS pair %q, want %s=...", i, p, j.limits[k])
			}
			for _, s := range strings.Split(list, ",") {
				ix, err := strconv.Atoi(s)
				if err != nil || ix < 0 || ix >= sizes[name] {
					t.Fatalf("run %d: index %q of %s, want 0..%d", i, s, name, sizes[name]-1)
				}
				r.slots[name] = append(r.slots[name], ix)
			}
			if got := r.slots[name]; len(got) != j.weight || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != j.weight {
				t.Errorf("run %d: holds %v in %s, want %d distinct indexes, ascending", i, got, name, j.weight)
			}
		}
		if r.slot != r.slots[j.limits[0]][0] {
			t.Errorf("run %d: SLOTCTL_SLOT=%d, want the lowest index of %s (%v)", i, r.slot, j.limits[0], r.slots[j.limits[0]])
		}
		runs[i] = r
	}

	// In each limit: the weights running at once, and the indexes they hold.
	for name, size := range sizes {
		type ev struct {
			at    int64
			delta int
		}
		var evs []ev
		peak := 0
		for _, a := range runs {
			if !slices.Contains(jobs[a.i].limits, name) {
				continue
			}
			evs = append(evs, ev{a.start, jobs[a.i].weight}, ev{a.end, -jobs[a.i].weight})
			for _, b := range runs[a.i+1:] {
				if !slices.Contains(jobs[b.i].limits, name) || !(a.start < b.end && b.start < a.end) {
					continue
				}
				for _, x := range a.slots[name] {
					if slices.Contains(b.slots[name], x) {
						t.Errorf("limit %s: runs %d and %d ran at once on slot %d", name, a.i, b.i, x)
					}
				}
			}
		}
		sort.Slice(evs, func(x, y int) bool {
			if evs[x].at != evs[y].at {
				return evs[x].at < evs[y].at
			}
			return evs[x].delta < evs[y].delta // an end before a start at the same instant
		})
		cur := 0
		for _, x := range evs {
			cur += x.delta
			peak = max(peak, cur)
			if cur > size {
				t.Errorf("limit %s: %d slots in use at once, size %d", name, cur, size)
			}
		}
		t.Logf("limit %s (size %d): peak %d slots in use", name, size, peak)
	}

	// Strict FIFO across limits, from the admissions the store logged.
	admitted := ptAdmissions(t, e)
	for _, a := range runs {
		for _, b := range runs {
			if a.fence >= b.fence {
				continue
			}
			shared := slices.ContainsFunc(jobs[a.i].limits, func(l string) bool { return slices.Contains(jobs[b.i].limits, l) })
			sa, oka := admitted[a.fence]
			sb, okb := admitted[b.fence]
			if !oka || !okb {
				t.Fatalf("no admitted event for run %d or %d in the log", a.i, b.i)
			}
			if shared && sb < sa {
				t.Errorf("run %d (fence %d) admitted before the older run %d (fence %d) of a shared limit", b.i, b.fence, a.i, a.fence)
			}
		}
	}
	// Nothing is left held or waiting.
	out, err := e.output("ls", "-o", "json")
	if err != nil {
		t.Fatalf("ls: %v\n%s", err, out)
	}
	var left struct {
		Tickets []json.RawMessage `json:"tickets"`
	}
	if err := json.Unmarshal([]byte(out), &left); err != nil || len(left.Tickets) != 0 {
		t.Errorf("tickets left after every run exited (%v):\n%s", err, out)
	}
}
