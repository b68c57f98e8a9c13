// Package testguard keeps a test binary from leaving processes behind. Every
// process a test starts carries a mark in its environment (its children and
// theirs inherit it, setsid or not); whatever still carries the mark when its
// test ends, when the package's tests end, or shortly before go test's
// -timeout would kill the binary, is SIGKILLed and named.
//
// A package opts in with
//
//	func TestMain(m *testing.M) { os.Exit(testguard.Main(m)) }
//
// and passes Env (or a Scope's Env) to any process it starts with an
// environment of its own making. Processes that clear their environment
// (env -i) escape the mark; the tests that make them kill them themselves.
package testguard

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Var is the environment variable that marks a test binary's processes.
const Var = "SLOTCTLTEST_GUARD"

// A Scope is the processes whose environment carries its mark: a test
// binary's, or one test's within it.
type Scope struct{ mark string }

var (
	rootOnce sync.Once
	root     Scope
	seq      struct {
		sync.Mutex
		n int
	}
)

// Root is the test binary's scope: every process started with the binary's
// environment is in it.
func Root() Scope {
	rootOnce.Do(func() {
		if v := os.Getenv(Var); v != "" && !strings.ContainsAny(v, "\x00") {
			// A test binary started by another's test (a re-run of itself as a
			// child): its processes stay in the parent's scope, one level down.
			root = Scope{mark: v + "." + strconv.Itoa(os.Getpid())}
		} else {
			root = Scope{mark: fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())}
		}
		_ = os.Setenv(Var, root.mark)
	})
	return root
}

// Env is the NAME=VALUE that puts a process in the scope.
func (s Scope) Env() string { return Var + "=" + s.mark }

// Sub is a scope inside s (in s's sweeps too).
func (s Scope) Sub() Scope {
	seq.Lock()
	defer seq.Unlock()
	seq.n++
	return Scope{mark: s.mark + "." + strconv.Itoa(seq.n)}
}

// Env is the root scope's NAME=VALUE, for a process started with an
// environment of its own making.
func Env() string { return Root().Env() }

// A Proc is a process found in a scope.
type Proc struct {
	Pid  int
	Argv string
}

func (p Proc) String() string { return strconv.Itoa(p.Pid) + " " + p.Argv }

// Running lists the scope's processes, this one excepted.
func (s Scope) Running() []Proc { return find(s.mark) }

// Kill SIGKILLs every process of the scope until none is left (a process
// may fork while it is being killed) and returns those it found.
func (s Scope) Kill() []Proc { return kill(s.mark) }

// sweep is Kill with its scan of the scope and its signal given: it
// signals what each scan finds, until two scans in a row find nothing (a
// process in the middle of exec reads with an empty environment, so one
// empty scan is not proof), and returns each process once.
func sweep(mark string, scan func(string) []Proc, signal func(pid int)) []Proc {
	var all []Proc
	seen := map[int]bool{}
	empty := 0
	for range 50 {
		ps := scan(mark)
		if len(ps) == 0 {
			if empty++; empty == 2 {
				break
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		empty = 0
		for _, p := range ps {
			signal(p.Pid)
			if !seen[p.Pid] {
				seen[p.Pid] = true
				all = append(all, p)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return all
}

// Test is a scope for one test: what is still running in it when the test
// ends is killed. Its processes are in the root scope too.
func Test(t testing.TB) Scope {
	s := Root().Sub()
	t.Cleanup(func() { s.Kill() })
	return s
}

// M is what Main runs: *testing.M, or what wraps it.
type M interface{ Run() int }

// Main runs the tests, kills whatever the binary started that outlived
// them (and fails the run, naming each), and kills the same shortly before
// -timeout would end the binary, so that a test waiting on a process fails
// with its own message instead of at the timeout, and no process survives
// the binary's death.
func Main(m M) int {
	r := Root()
	flag.Parse()
	if d := timeout(); d > 0 {
		margin := min(max(d/20, 5*time.Second), 30*time.Second)
		if d > 2*margin {
			t := time.AfterFunc(d-margin, func() {
				left := r.Kill()
				fmt.Fprintf(os.Stderr, "testguard: -timeout %v is %v away: killed the %d processes this test binary started that still ran%s\n",
					d, margin, len(left), list(left))
			})
			defer t.Stop()
		}
	}
	code := m.Run()
	// What a test killed in its cleanup may take a moment to go.
	deadline := time.Now().Add(3 * time.Second)
	for len(r.Running()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if left := r.Kill(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "testguard: %d processes outlived the tests that started them (killed now):%s\n", len(left), list(left))
		if code == 0 {
			code = 1
		}
	}
	return code
}

// timeout is go test's -timeout as the testing package parsed it; 0 if none.
func timeout() time.Duration {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return 0
	}
	d, err := time.ParseDuration(f.Value.String())
	if err != nil {
		return 0
	}
	return d
}

func list(ps []Proc) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString("\n\t")
		b.WriteString(p.String())
	}
	return b.String()
}
