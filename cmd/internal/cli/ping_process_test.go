package cli

// --ping end to end: the real slotctl against a monitor on 127.0.0.1
// (httptest) that records what it is sent.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pingMonitor records the pings it is sent, per path prefix; paths under
// /hang/ get no answer until the test ends.
type pingMonitor struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []string // "METHOD /path?query"
	body map[string]string
}

func newPingMonitor(t *testing.T) *pingMonitor {
	t.Helper()
	m := &pingMonitor{body: map[string]string{}}
	hang := make(chan struct{})
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		m.mu.Lock()
		m.reqs = append(m.reqs, r.Method+" "+r.URL.RequestURI())
		m.body[r.URL.Path] = string(b)
		m.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/hang/") {
			select {
			case <-hang:
			case <-r.Context().Done():
			}
		}
	}))
	t.Cleanup(func() { close(hang); m.srv.Close() })
	return m
}

// sent are the pings whose path starts with prefix, in order.
func (m *pingMonitor) sent(prefix string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, r := range m.reqs {
		if strings.HasPrefix(r, "POST "+prefix) || strings.HasPrefix(r, "GET "+prefix) {
			out = append(out, r)
		}
	}
	return out
}

var ridRE = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`

// TestPingStartAndExit: a job that runs sends start, then its exit status,
// both with the ticket as rid.
func TestPingStartAndExit(t *testing.T) {
	e := newPTEnv(t)
	mon := newPingMonitor(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		name, sh string
		code     string
	}{{"ok", "exit 0", "0"}, {"failed", "exit 3", "3"}, {"killed", "kill -TERM $$", "143"}} {
		p := e.start(ctx, c.name, "run", "--limit", "p", "--ping", mon.srv.URL+"/"+c.name, "--", "sh", "-c", c.sh)
		p.wait(t, 30*time.Second)
		got := mon.sent("/" + c.name + "/")
		re := regexp.MustCompile(`^POST /` + c.name + `/start\?rid=(` + ridRE + `)\nPOST /` + c.name + `/` + c.code + `\?rid=(` + ridRE + `)$`)
		sm := re.FindStringSubmatch(strings.Join(got, "\n"))
		if sm == nil || sm[1] != sm[2] {
			t.Errorf("%s: pings sent:\n%s\nwant start then /%s, same rid; stderr:\n%s", c.name, strings.Join(got, "\n"), c.code, p.stderr())
		}
		if s := p.stderr(); strings.Contains(s, "ping") {
			t.Errorf("%s: stderr speaks of pings that succeeded:\n%s", c.name, s)
		}
	}
}

// TestPingBusy: a run not admitted (--wait 0, the slot held) sends only
// the log ping, naming the holder; the holder's pings are its own.
func TestPingBusy(t *testing.T) {
	e := newPTEnv(t)
	mon := newPingMonitor(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := e.start(ctx, "holder", "run", "--limit", "b", "--label", "nightly-backup", "--ping", mon.srv.URL+"/holder",
		"--", "sh", "-c", `echo $$ > hpid; touch held; exec sleep 60`)
	ptWaitFor(t, "holder's child", 30*time.Second, func() bool { return ptExists(e.path("held")) })
	e.notePid(int(ptReadInt(t, e.path("hpid"))))

	busy := e.start(ctx, "busy", "run", "--limit", "b", "--wait", "0", "--ping", mon.srv.URL+"/busy", "--", "touch", "ran")
	if code := busy.wait(t, 30*time.Second); code != 75 {
		t.Errorf("busy run exited %d, want 75; stderr:\n%s", code, busy.stderr())
	}
	if got := mon.sent("/busy/"); len(got) != 1 || !regexp.MustCompile(`^POST /busy/log\?rid=`+ridRE+`$`).MatchString(got[0]) {
		t.Errorf("busy run's pings: %q, want one POST /busy/log?rid=UUID", got)
	}
	mon.mu.Lock()
	body := mon.body["/busy/log"]
	mon.mu.Unlock()
	if !strings.Contains(body, `limit "b" is full`) || !strings.Contains(body, "nightly-backup") || !regexp.MustCompile(`held by ticket [0-9a-f]{8} \(nightly-backup, host .+, pid [0-9]+\)`).MatchString(body) {
		t.Errorf("log ping's body does not name the holder:\n%s", body)
	}
	if ptExists(e.path("ran")) {
		t.Error("the busy run's command ran")
	}

	if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	holder.wait(t, 30*time.Second)
	got := strings.Join(mon.sent("/holder/"), "\n")
	if !regexp.MustCompile(`^POST /holder/start\?rid=` + ridRE + `\nPOST /holder/143\?rid=` + ridRE + `$`).MatchString(got) {
		t.Errorf("holder's pings:\n%s\nwant start, then 143 (stopped by SIGTERM)", got)
	}
}

// TestPingNoAnswer: a monitor that never answers delays the run's exit by
// the pings' bound at most (checked generously: it exits), and costs one
// warning line, which shows neither the password nor the query.
func TestPingNoAnswer(t *testing.T) {
	e := newPTEnv(t)
	mon := newPingMonitor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := strings.Replace(mon.srv.URL, "http://", "http://user:s3cret@", 1) + "/hang/x?key=k3y"
	p := e.start(ctx, "hang", "run", "--limit", "h", "--ping", u, "--", "sh", "-c", "exit 5")
	if code := p.wait(t, time.Minute); code != 5 {
		t.Errorf("exited %d, want the job's 5; stderr:\n%s", code, p.stderr())
	}
	stderr := p.stderr()
	if !regexp.MustCompile(`^slotctl: ping http://127\.0\.0\.1:[0-9]+/hang/x: start: no answer within 3s; exit status 5: .+\n$`).MatchString(stderr) {
		t.Errorf("stderr, want one warning line naming the monitor without user or query:\n%s", stderr)
	}
	if strings.Contains(stderr, "s3cret") || strings.Contains(stderr, "k3y") {
		t.Errorf("stderr shows a secret:\n%s", stderr)
	}
	t.Logf("exit %s after start", p.exitedAt.Sub(p.started))
}

// TestPingBadURL: a --ping that is not an http(s) URL is a usage error,
// one line, before anything is enqueued or run.
func TestPingBadURL(t *testing.T) {
	e := newPTEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, bad := range []string{"ftp://u:pw@example.org/x", "hc-ping.com/abc", "http://[::1/x?k=pw"} {
		name := "bad" + string(rune('0'+i))
		p := e.start(ctx, name, "run", "--limit", "x", "--ping", bad, "--", "touch", "ran")
		if code := p.wait(t, 30*time.Second); code != 64 {
			t.Errorf("--ping %q: exit %d, want 64", bad, code)
		}
		s := p.stderr()
		if !regexp.MustCompile(`^slotctl: --ping ".*": want an http:// or https:// URL, e\.g\. .*\n$`).MatchString(s) || strings.Contains(s, "pw") {
			t.Errorf("--ping %q: stderr, want one line naming the input (no password) and what is accepted:\n%s", bad, s)
		}
	}
	if ptExists(e.path("ran")) {
		t.Error("a run with a bad --ping ran its command")
	}
	ls := e.start(ctx, "ls", "limit", "ls", "-o", "json")
	ls.wait(t, 30*time.Second)
	if out := readFile(t, e.path("ls.stdout")); strings.Contains(out, `"x"`) {
		t.Errorf("a run with a bad --ping left a limit:\n%s", out)
	}
}

// TestPingConfig: the config file's ping: is --ping's default, and a bad
// one is a usage error that names the file.
func TestPingConfig(t *testing.T) {
	e := newPTEnv(t)
	mon := newPingMonitor(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(e.dir, "home", ".config", "slotctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("ping: "+mon.srv.URL+"/cfg\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.start(ctx, "cfg", "run", "--limit", "c", "--", "true")
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Errorf("exit %d; stderr:\n%s", code, p.stderr())
	}
	if got := strings.Join(mon.sent("/cfg/"), "\n"); !regexp.MustCompile(`^POST /cfg/start\?rid=` + ridRE + `\nPOST /cfg/0\?rid=` + ridRE + `$`).MatchString(got) {
		t.Errorf("pings from the config's ping:\n%s", got)
	}

	// --ping '' turns the config's off for one run.
	p = e.start(ctx, "off", "run", "--limit", "c", "--ping", "", "--", "true")
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Errorf("--ping '': exit %d; stderr:\n%s", code, p.stderr())
	}
	if got := mon.sent("/cfg/"); len(got) != 2 {
		t.Errorf("--ping '' sent pings all the same: %q", got)
	}

	if err := os.WriteFile(cfg, []byte("ping: ftp://example.org/x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p = e.start(ctx, "badcfg", "run", "--limit", "c", "--", "touch", "ran")
	if code := p.wait(t, 30*time.Second); code != 64 {
		t.Errorf("bad ping: in the config: exit %d, want 64", code)
	}
	if s := p.stderr(); !regexp.MustCompile(`^slotctl: config file .*config\.yaml: ping "ftp://example\.org/x": want an http:// or https:// URL`).MatchString(s) || strings.Count(s, "\n") != 1 {
		t.Errorf("bad ping: in the config: stderr:\n%s", s)
	}
	if ptExists(e.path("ran")) {
		t.Error("a run with a bad ping: ran its command")
	}
}
