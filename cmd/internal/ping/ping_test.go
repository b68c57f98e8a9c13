package ping

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, bad := range []string{"", "hc-ping.com/x", "ftp://h/x", "http://", "mailto:a@b", "http://a b/", "https:///path", "%zz"} {
		if m, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, m)
		}
	}
	m, err := Parse("https://user:secret@hc-ping.com/abc/def?create=1&token=t0p#frag")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.String(), "https://hc-ping.com/abc/def"; got != want {
		t.Errorf("String() = %q, want %q (no user, password or query)", got, want)
	}
}

func TestRID(t *testing.T) {
	if got, want := RID("0123456789abcdefFEDCBA9876543210"), "01234567-89ab-cdef-fedc-ba9876543210"; got != want {
		t.Errorf("RID of a hex id = %q, want %q", got, want)
	}
	a, b := RID("not-hex"), RID("not-hex")
	if a != b || len(a) != 36 || a[14] != '5' || !strings.ContainsRune("89ab", rune(a[19])) {
		t.Errorf("RID(not-hex) = %q, %q: want the same version-5 UUID twice", a, b)
	}
	if RID("other") == a {
		t.Errorf("RID of two ids is the same")
	}
}

func TestURLs(t *testing.T) {
	const rid = "01234567-89ab-cdef-fedc-ba9876543210"
	hc, _ := Parse("https://hc-ping.com/5f1d/?create=1")
	cr, _ := Parse("https://cronitor.link/p/KEY/nightly")
	sub, _ := Parse("https://EU.Cronitor.Link/p/KEY/nightly")
	for _, c := range []struct {
		r      request
		method string
		want   string
	}{
		{hc.start(rid), "POST", "https://hc-ping.com/5f1d/start?create=1&rid=" + rid},
		{hc.end(rid, 0), "POST", "https://hc-ping.com/5f1d/0?create=1&rid=" + rid},
		{hc.end(rid, 143), "POST", "https://hc-ping.com/5f1d/143?create=1&rid=" + rid},
		{hc.log(rid, "held"), "POST", "https://hc-ping.com/5f1d/log?create=1&rid=" + rid},
		{cr.start(rid), "GET", "https://cronitor.link/p/KEY/nightly?series=" + rid + "&state=run"},
		{cr.end(rid, 0), "GET", "https://cronitor.link/p/KEY/nightly?series=" + rid + "&state=complete&status_code=0"},
		{cr.end(rid, 2), "GET", "https://cronitor.link/p/KEY/nightly?series=" + rid + "&state=fail&status_code=2"},
		{cr.log(rid, "held by a b"), "GET", "https://cronitor.link/p/KEY/nightly?message=held+by+a+b&series=" + rid + "&state=ok"},
		{sub.start(rid), "GET", "https://EU.Cronitor.Link/p/KEY/nightly?series=" + rid + "&state=run"},
	} {
		if c.r.method != c.method || c.r.url.String() != c.want {
			t.Errorf("%s %s, want %s %s", c.r.method, c.r.url, c.method, c.want)
		}
	}
	if r := hc.log(rid, "held"); r.body != "held" {
		t.Errorf("healthchecks log body %q, want the message", r.body)
	}
}

// recorder is a monitor that records what it is sent.
type recorder struct {
	mu   sync.Mutex
	got  []string
	body []string
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.got = append(rc.got, r.Method+" "+r.URL.RequestURI())
	rc.body = append(rc.body, string(b))
	rc.mu.Unlock()
	if strings.Contains(r.URL.Path, "/fail/") {
		http.Error(w, "nope", http.StatusNotFound)
	}
}

func TestRunPings(t *testing.T) {
	rc := &recorder{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	m, err := Parse(srv.URL + "/check")
	if err != nil {
		t.Fatal(err)
	}
	r := m.Begin("rid1")
	if err := r.End(3); err != nil {
		t.Fatal(err)
	}
	if err := m.Skipped("rid2", "held by x"); err != nil {
		t.Fatal(err)
	}
	want := []string{"POST /check/start?rid=rid1", "POST /check/3?rid=rid1", "POST /check/log?rid=rid2"}
	if strings.Join(rc.got, "\n") != strings.Join(want, "\n") {
		t.Errorf("sent:\n%s\nwant:\n%s", strings.Join(rc.got, "\n"), strings.Join(want, "\n"))
	}
	if rc.body[2] != "held by x" {
		t.Errorf("log body %q", rc.body[2])
	}

	bad, _ := Parse(strings.Replace(srv.URL, "http://", "http://u:secret@", 1) + "/fail/x?key=secret")
	err = bad.Begin("rid3").End(0)
	if err == nil || !strings.Contains(err.Error(), "start: answered 404") || !strings.Contains(err.Error(), "exit status 0: answered 404") {
		t.Errorf("End against a 404: %v", err)
	}
	if err != nil && strings.Contains(err.Error(), "secret") {
		t.Errorf("error shows a secret: %v", err)
	}
}

// TestBound: a monitor that never answers costs End and Skipped their
// bound, not more (checked generously: they return, with the reason).
func TestBound(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	m, _ := Parse("http://user:pw@" + strings.TrimPrefix(srv.URL, "http://") + "/hang?k=secret")
	m.Timeout, m.Bound = 200*time.Millisecond, 300*time.Millisecond
	done := make(chan error, 2)
	go func() {
		done <- m.Begin("r").End(0)
		done <- m.Skipped("r", "x")
	}()
	for i := 0; i < 2; i++ {
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "no answer within") {
				t.Errorf("ping to a monitor that never answers: %v", err)
			} else if strings.Contains(err.Error(), "pw") || strings.Contains(err.Error(), "secret") {
				t.Errorf("error shows a secret: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("ping did not return within a minute")
		}
	}
}
