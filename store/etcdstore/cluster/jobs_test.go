package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// jobs is one scenario's slotctl-etcd processes on one limit.
type jobs struct {
	t      *testing.T
	dir    string
	env    []string
	prefix string // the store's key prefix
	limit  string
	slots  int

	obs *observer // if set, what a failed check shows

	mu   sync.Mutex
	list []*job
}

// job is one slotctl-etcd process and what its child recorded.
type job struct {
	name     string
	cmd      *exec.Cmd
	start    time.Time // just before the process started (invocation)
	exit     time.Time // just after it exited (response)
	code     int
	done     chan struct{}
	errPath  string
	childDir string

	// read by collect, from the child's files
	childStart, childEnd time.Time // zero: no child ran / no end recorded
	childPid             int
	ticket               string    // SLOTCTL_TICKET of the admitted ticket
	died                 time.Time // when the test saw the child die (pidfd), if it watched
}

func newJobs(t *testing.T, prefix, limit string, slots int) *jobs {
	t.Helper()
	dir := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SLOTCTL") || k == "HOME" || k == "XDG_CONFIG_HOME" || k == "XDG_STATE_HOME" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+filepath.Join(dir, "home"), "XDG_CONFIG_HOME="+filepath.Join(dir, "home", ".config"),
		"XDG_STATE_HOME="+filepath.Join(dir, "home", ".state"))
	js := &jobs{t: t, dir: dir, env: env, prefix: prefix, limit: limit, slots: slots}
	t.Cleanup(js.cleanup)
	return js
}

// childScript is a job's command: it records its pid, ticket, start and
// end (on a signal too, unless it ignores SIGTERM: then only its pid, and
// the test watches it die) and runs for d.
func childScript(dir, name string, d time.Duration, ignoreTerm bool) []string {
	p := filepath.Join(dir, name)
	secs := strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
	trap := fmt.Sprintf(`trap 'date +%%s%%N > %s.end; exit 143' TERM`, p)
	if ignoreTerm {
		trap = `trap '' TERM` // the sleep inherits the ignored SIGTERM: only SIGKILL stops it
	}
	return []string{"sh", "-c", fmt.Sprintf(`echo $$ > %[1]s.pid; echo "$SLOTCTL_TICKET" > %[1]s.ticket; date +%%s%%N > %[1]s.start; %[2]s; sleep %[3]s & echo $! > %[1]s.sleeppid; wait $!; date +%%s%%N > %[1]s.end`,
		p, trap, secs)}
}

// start runs "slotctl-etcd run --store URL --limit L --slots N ARGS... --
// child" where child runs for d.
func (js *jobs) start(name, store string, d time.Duration, ignoreTerm bool, args ...string) *job {
	js.t.Helper()
	argv := append([]string{"run", "--store", store, "--limit", js.limit, "--slots", strconv.Itoa(js.slots), "--label", name}, args...)
	argv = append(argv, "--")
	argv = append(argv, childScript(js.dir, name, d, ignoreTerm)...)
	return js.startArgv(name, argv...)
}

// startArgv runs slotctl-etcd with argv; stdin /dev/null, output to files.
func (js *jobs) startArgv(name string, argv ...string) *job {
	js.t.Helper()
	return js.startBin(name, slotctlEtcd, argv...)
}

// startBin is startArgv of another program (etcdctl, the yardstick).
func (js *jobs) startBin(name, bin string, argv ...string) *job {
	js.t.Helper()
	j := &job{name: name, done: make(chan struct{}), errPath: filepath.Join(js.dir, name+".stderr"), childDir: js.dir}
	errf, err := os.Create(j.errPath)
	if err != nil {
		js.t.Fatal(err)
	}
	defer errf.Close()
	j.cmd = exec.Command(bin, argv...)
	j.cmd.Dir, j.cmd.Env = js.dir, js.env
	j.cmd.Stdout, j.cmd.Stderr = errf, errf
	j.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	j.start = time.Now()
	if err := j.cmd.Start(); err != nil {
		// Errorf, not Fatalf: the soak's feeder starts jobs from its own
		// goroutine. The job counts as one that exited -1.
		js.t.Errorf("start %s: %v", name, err)
		j.exit, j.code = time.Now(), -1
		close(j.done)
		return j
	}
	js.mu.Lock()
	js.list = append(js.list, j)
	js.mu.Unlock()
	go func() {
		err := j.cmd.Wait()
		j.exit = time.Now()
		j.code = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			j.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				j.code = 128 + int(ws.Signal())
			}
		} else if err != nil {
			j.code = -1
		}
		close(j.done)
	}()
	return j
}

func (j *job) exited() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

func (j *job) stderr() string {
	b, _ := os.ReadFile(j.errPath)
	return string(b)
}

// waitAll waits up to d for every job to exit; it fails the test naming
// those still running.
func (js *jobs) waitAll(d time.Duration) {
	js.t.Helper()
	deadline := time.After(d)
	for _, j := range js.all() {
		select {
		case <-j.done:
		case <-deadline:
			var running []string
			for _, j := range js.all() {
				if !j.exited() {
					running = append(running, j.name)
				}
			}
			js.t.Fatalf("jobs still running after %s: %s", d, strings.Join(running, " "))
		}
	}
}

func (js *jobs) all() []*job {
	js.mu.Lock()
	defer js.mu.Unlock()
	return append([]*job(nil), js.list...)
}

// cleanup kills what still runs: slotctl-etcd, then the children's groups.
func (js *jobs) cleanup() {
	for _, j := range js.all() {
		if !j.exited() {
			_ = j.cmd.Process.Kill()
			<-j.done
		}
		if pid := readInt(filepath.Join(j.childDir, j.name+".pid")); pid > 1 {
			_ = syscall.Kill(-int(pid), syscall.SIGKILL)
			_ = syscall.Kill(int(pid), syscall.SIGKILL)
		}
	}
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func readTime(path string) time.Time {
	if n := readInt(path); n > 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// collect reads what each child recorded (after every job exited).
func (js *jobs) collect() {
	for _, j := range js.all() {
		p := filepath.Join(js.dir, j.name)
		j.childStart, j.childEnd = readTime(p+".start"), readTime(p+".end")
		j.childPid = int(readInt(p + ".pid"))
		b, _ := os.ReadFile(p + ".ticket")
		j.ticket = strings.TrimSpace(string(b))
		if !j.childStart.IsZero() && j.childEnd.IsZero() {
			// No end recorded (SIGKILLed): slotctl waits for its child,
			// so it was dead when slotctl exited, at the latest.
			j.childEnd = j.exit
		}
		if !j.died.IsZero() {
			j.childEnd = j.died // the child's last process gone, as the test saw it
		}
	}
}

// exitCodes counts the jobs' exit statuses.
func (js *jobs) exitCodes() map[int]int {
	m := map[int]int{}
	for _, j := range js.all() {
		m[j.code]++
	}
	return m
}

func fmtCodes(m map[int]int) string {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%d×exit %d", m[k], k))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// storedTicket is one ticket of the limit as the store's history has it.
type storedTicket struct {
	id   string
	rev  int64 // create revision: its place in the FIFO
	pid  int   // the slotctl that wrote it
	held bool  // ever written as held
}

// storeHistory replays the limit's ticket keys from the cluster's first
// revision (the members never compact): every ticket ever created, in
// FIFO order, with the pid of the slotctl that created it.
func (js *jobs) storeHistory(cli *clientv3.Client) []storedTicket {
	js.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pfx := "/" + js.prefix + "/tickets/" + js.limit + "/"
	sentinel := pfx + "~end-of-test"
	if _, err := cli.Put(ctx, sentinel, "x"); err != nil {
		js.t.Fatalf("put sentinel: %v", err)
	}
	byID := map[string]*storedTicket{}
	var order []*storedTicket
	wch := cli.Watch(ctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(1))
	for resp := range wch {
		if err := resp.Err(); err != nil {
			js.t.Fatalf("replay %s: %v", pfx, err)
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			if key == sentinel {
				cancel()
				goto done
			}
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			var r struct {
				ID     string `json:"id"`
				State  string `json:"state"`
				Holder struct {
					Pid int `json:"pid"`
				} `json:"holder"`
			}
			if err := json.Unmarshal(ev.Kv.Value, &r); err != nil {
				js.t.Fatalf("ticket %s: %v", key, err)
			}
			st := byID[r.ID]
			if st == nil {
				st = &storedTicket{id: r.ID, rev: ev.Kv.CreateRevision, pid: r.Holder.Pid}
				byID[r.ID] = st
				order = append(order, st)
			}
			if r.State == "held" {
				st.held = true
			}
		}
	}
	js.t.Fatalf("replay of %s ended before the sentinel", pfx)
done:
	sort.Slice(order, func(a, b int) bool { return order[a].rev < order[b].rev })
	out := make([]storedTicket, len(order))
	for i, st := range order {
		out[i] = *st
	}
	return out
}

// interval is a child's run.
type interval struct {
	job        string
	start, end time.Time
}

// maxConcurrent is the most children that ran at once, and when.
func maxConcurrent(iv []interval) (int, time.Time) {
	type ev struct {
		at time.Time
		d  int
	}
	var evs []ev
	for _, i := range iv {
		evs = append(evs, ev{i.start, +1}, ev{i.end, -1})
	}
	// Ends before starts at the same instant: a child that ended as the
	// next started did not overlap it.
	sort.Slice(evs, func(a, b int) bool {
		if evs[a].at.Equal(evs[b].at) {
			return evs[a].d < evs[b].d
		}
		return evs[a].at.Before(evs[b].at)
	})
	n, most := 0, 0
	var when time.Time
	for _, e := range evs {
		n += e.d
		if n > most {
			most, when = n, e.at
		}
	}
	return most, when
}

// intervals are the children that ran.
func (js *jobs) intervals() []interval {
	var iv []interval
	for _, j := range js.all() {
		if !j.childStart.IsZero() {
			iv = append(iv, interval{j.name, j.childStart, j.childEnd})
		}
	}
	return iv
}

// longestStall is the longest stretch, within [from, to], during which a
// job waited (started, neither admitted nor gone yet) while fewer than the
// limit's children ran, and when it began.
func (js *jobs) longestStall(from, to time.Time) (longest time.Duration, at time.Time) {
	type ev struct {
		at   time.Time
		w, r int
	}
	var evs []ev
	for _, j := range js.all() {
		if j.childStart.IsZero() {
			evs = append(evs, ev{j.start, +1, 0}, ev{j.exit, -1, 0}) // waited, then gave up or lost its ticket
			continue
		}
		evs = append(evs, ev{j.start, +1, 0}, ev{j.childStart, -1, +1}, ev{j.childEnd, 0, -1})
	}
	sort.Slice(evs, func(a, b int) bool { return evs[a].at.Before(evs[b].at) })
	w, r := 0, 0
	var since time.Time
	for _, e := range evs {
		stalled := w > 0 && r < js.slots
		w, r = w+e.w, r+e.r
		now := w > 0 && r < js.slots
		switch {
		case !stalled && now:
			since = e.at
		case stalled && !now:
			s, end := since, e.at
			if s.Before(from) {
				s = from
			}
			if end.After(to) {
				end = to
			}
			if d := end.Sub(s); d > longest {
				longest, at = d, s
			}
		}
	}
	return longest, at
}

// admittedBetween counts children started in [from, to].
func (js *jobs) admittedBetween(from, to time.Time) int {
	n := 0
	for _, j := range js.all() {
		if !j.childStart.IsZero() && !j.childStart.Before(from) && !j.childStart.After(to) {
			n++
		}
	}
	return n
}

// verdict is what the checks found in a run's history.
type verdict struct {
	porcupine string // Ok, Illegal or Unknown
	info      string // for Illegal: the longest legal order and what was left
	most      int    // the most children at once
	ops       int
	tickets   int
	err       error // the history could not be built whole
}

// verify collects the run's history and checks it: porcupine against a
// FIFO semaphore of the limit's size, and the children's intervals.
func (js *jobs) verify(c *cluster) verdict {
	js.t.Helper()
	js.collect()
	tickets := js.storeHistory(c.cli)
	ops, err := js.history(tickets)
	res, info := checkFIFO(ops, js.slots, 60*time.Second)
	most, _ := maxConcurrent(js.intervals())
	return verdict{string(res), info, most, len(ops), len(tickets), err}
}

// check is verify, failing the test unless porcupine finds the history
// legal and no more than the limit's children ran at once. It returns the
// most children that ran at once.
func (js *jobs) check(c *cluster) int {
	js.t.Helper()
	v := js.verify(c)
	if v.err != nil {
		js.t.Errorf("history: %v", v.err)
	}
	switch v.porcupine {
	case "Ok":
	case "Unknown":
		js.t.Errorf("porcupine: no verdict within 60s on %d operations", v.ops)
	default:
		js.t.Errorf("porcupine: the history (%d operations) is not one of a FIFO semaphore of %d slots:\n%s", v.ops, js.slots, v.info)
	}
	if v.most > js.slots {
		_, when := maxConcurrent(js.intervals())
		js.t.Errorf("%d children ran at once at %s (limit %d)", v.most, when.Format(time.StampMicro), js.slots)
		js.explain(when)
	}
	js.t.Logf("history: %d jobs, %d tickets in the store, %d operations: porcupine %s; at most %d children at once", len(js.all()), v.tickets, v.ops, v.porcupine, v.most)
	return v.most
}

// explain logs the jobs whose children ran at when: their times, exits,
// stderr, and (with an observer) what the store did with their tickets.
func (js *jobs) explain(when time.Time) {
	var ids []string
	for _, j := range js.all() {
		if j.childStart.IsZero() || j.childStart.After(when) || j.childEnd.Before(when) {
			continue
		}
		ids = append(ids, j.ticket)
		js.t.Logf("%s (pid %d, ticket %s): started %s, child %s .. %s, exited %s with %d; stderr:\n%s", j.name, j.cmd.Process.Pid, j.ticket,
			j.start.Format("15:04:05.000000"), j.childStart.Format("15:04:05.000000"), j.childEnd.Format("15:04:05.000000"),
			j.exit.Format("15:04:05.000000"), j.code, tail(j.stderr(), 2000))
	}
	if js.obs != nil {
		js.t.Logf("the store, as the members reported it (first report's time):\n%s", js.obs.about(ids...))
		js.t.Logf("slot keys:\n%s", js.obs.slotHistory(js.prefix, js.limit))
		js.t.Logf("leadership:\n%s", js.obs.leadership())
	}
}

// showUnexpected logs the stderr of up to n jobs whose exit is not want.
func (js *jobs) showUnexpected(want int, n int) {
	for _, j := range js.all() {
		if j.code != want && n > 0 {
			n--
			js.t.Logf("%s (started %s) exited %d at %s; stderr:\n%s", j.name, j.start.Format("15:04:05.000"), j.code,
				j.exit.Format("15:04:05.000"), tail(j.stderr(), 1500))
		}
	}
}
