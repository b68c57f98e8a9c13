// Package ping tells a cron monitor what a run did: that its job started,
// how it ended, or that it was skipped because its slot was held. Every
// ping is bounded in time and none is ever retried: a monitor that is slow
// or down costs a run a few seconds at most, and never its exit status.
//
// Two conventions are spoken, chosen by the URL's host. Healthchecks.io's
// (the default, also spoken by its self-hosted copies): URL/start, URL/N
// with the job's exit status, URL/log with a message, each with the run's
// id as rid. Cronitor's telemetry URLs (host cronitor.link or a subdomain):
// the same events as state=run, state=complete or state=fail with
// status_code, and state=ok with a message, the run's id as series.
package ping

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

const (
	// PerPing bounds one ping, from dialling to the answer's status line.
	PerPing = 3 * time.Second
	// Bound is the longest the end of a run waits for its pings: the end
	// ping, and the start ping if a short job outran it.
	Bound = 5 * time.Second
	// maxMessage bounds a log ping's message (Cronitor takes 2000
	// characters in a query, healthchecks far more in a body).
	maxMessage = 1000
)

// A Monitor is one ping URL, parsed.
type Monitor struct {
	u        *url.URL
	cronitor bool
	// Client sends the pings; nil means a client of its own.
	Client *http.Client
	// Timeout bounds each ping (0: PerPing); Bound the wait at the end of a
	// run (0: Bound). Tests shorten them.
	Timeout, Bound time.Duration
}

// Parse reads a ping URL: an absolute http or https URL with a host. The
// error says what is accepted, without repeating the input.
func Parse(raw string) (*Monitor, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Opaque != "" {
		return nil, errors.New("want an http:// or https:// URL, e.g. https://hc-ping.com/UUID or https://cronitor.link/p/KEY/MONITOR")
	}
	u.Fragment, u.RawFragment = "", ""
	host := strings.ToLower(u.Hostname())
	return &Monitor{u: u, cronitor: host == "cronitor.link" || strings.HasSuffix(host, ".cronitor.link")}, nil
}

// String is the URL as it may be shown: scheme, host and path, without the
// user and password or the query, which can carry secrets.
func (m *Monitor) String() string { return safe(m.u) }

func safe(u *url.URL) string {
	s := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return s.String()
}

// RID is a run's id as these monitors want it: a UUID. A ticket id of 32
// hex digits (what slotctl writes) is that UUID's digits; any other id is
// mapped to a name-based UUID (version 5) of itself, so the same id always
// gives the same rid.
func RID(id string) string {
	var b [16]byte
	if len(id) == 32 {
		if _, err := hex.Decode(b[:], []byte(id)); err == nil {
			return formatUUID(b)
		}
	}
	h := sha1.New()
	h.Write(nsURL[:])
	h.Write([]byte("slotctl:ticket:" + id))
	copy(b[:], h.Sum(nil))
	b[6] = b[6]&0x0f | 0x50 // version 5 (RFC 9562 §5.5)
	b[8] = b[8]&0x3f | 0x80 // the RFC's variant
	return formatUUID(b)
}

// nsURL is RFC 9562's namespace for URLs, 6ba7b811-9dad-11d1-80b4-00c04fd430c8.
var nsURL = [16]byte{0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8}

// formatUUID writes b as 8-4-4-4-12 lowercase hex digits.
func formatUUID(b [16]byte) string {
	x := hex.EncodeToString(b[:])
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

// A Run is the pings of one run whose job started: Begin sent the start
// ping, End sends the exit status.
type Run struct {
	m       *Monitor
	rid     string
	started chan struct{} // closed when the start ping is done
	err     error         // the start ping's, once started is closed
}

// Begin sends the start ping of run rid in the background and returns at
// once: the job's start never waits for its monitor.
func (m *Monitor) Begin(rid string) *Run {
	r := &Run{m: m, rid: rid, started: make(chan struct{})}
	go func() {
		defer close(r.started)
		ctx, cancel := context.WithTimeout(context.Background(), m.timeout())
		defer cancel()
		if err := m.send(ctx, m.start(rid)); err != nil {
			r.err = fmt.Errorf("start: %w", err)
		}
	}()
	return r
}

// End sends the exit status of the job (0..255) once the start ping is
// done, so that the monitor sees them in order, within Bound from now in
// all. The error, if any, names each ping that failed, in one line.
func (r *Run) End(status int) error {
	m := r.m
	ctx, cancel := context.WithTimeout(context.Background(), m.bound())
	defer cancel()
	var errs []string
	select {
	case <-r.started:
		if r.err != nil {
			errs = append(errs, r.err.Error())
		}
	case <-ctx.Done():
		errs = append(errs, "start: "+timeoutError(m.bound()).Error())
	}
	if ctx.Err() == nil {
		pctx, pcancel := context.WithTimeout(ctx, m.timeout())
		defer pcancel()
		if err := m.send(pctx, m.end(r.rid, status)); err != nil {
			errs = append(errs, fmt.Sprintf("exit status %d: %v", status, err))
		}
	} else {
		errs = append(errs, fmt.Sprintf("exit status %d: not sent (%s spent)", status, m.bound()))
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// Skipped sends the log ping of a run rid that did not run (its slot was
// held), with msg saying why and who held it: no start and no exit status,
// so that the monitor neither counts the run nor misses it. It returns
// within Bound.
func (m *Monitor) Skipped(rid, msg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), min(m.timeout(), m.bound()))
	defer cancel()
	if err := m.send(ctx, m.log(rid, cut(msg, maxMessage))); err != nil {
		return fmt.Errorf("log: %w", err)
	}
	return nil
}

func (m *Monitor) timeout() time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return PerPing
}

func (m *Monitor) bound() time.Duration {
	if m.Bound > 0 {
		return m.Bound
	}
	return Bound
}

// request is one ping: its method, URL and body.
type request struct {
	method string
	url    *url.URL
	body   string
}

// at is the monitor's URL with sub appended to its path and params added
// to its query (what the user's URL had in its query is kept: healthchecks'
// create=1, say).
func (m *Monitor) at(sub string, params url.Values) *url.URL {
	u := *m.u
	if sub != "" {
		u.Path = strings.TrimRight(u.Path, "/") + "/" + sub
		if u.RawPath != "" {
			u.RawPath = strings.TrimRight(u.RawPath, "/") + "/" + sub
		}
	}
	q := u.Query()
	for k, vs := range params {
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return &u
}

// Healthchecks takes HEAD, GET and POST alike. POST it is: no proxy or
// cache along the way answers it from a cache, and the log ping carries its
// message as the body. Cronitor's telemetry takes its parameters in the
// query, and is documented with GET.

func (m *Monitor) start(rid string) request {
	if m.cronitor {
		return request{method: http.MethodGet, url: m.at("", url.Values{"state": {"run"}, "series": {rid}})}
	}
	return request{method: http.MethodPost, url: m.at("start", url.Values{"rid": {rid}})}
}

func (m *Monitor) end(rid string, status int) request {
	if m.cronitor {
		state := "complete"
		if status != 0 {
			state = "fail"
		}
		return request{method: http.MethodGet, url: m.at("", url.Values{"state": {state}, "status_code": {strconv.Itoa(status)}, "series": {rid}})}
	}
	return request{method: http.MethodPost, url: m.at(strconv.Itoa(status), url.Values{"rid": {rid}})}
}

func (m *Monitor) log(rid, msg string) request {
	if m.cronitor {
		// state=ok records the event without starting or ending a run.
		return request{method: http.MethodGet, url: m.at("", url.Values{"state": {"ok"}, "message": {msg}, "series": {rid}})}
	}
	return request{method: http.MethodPost, url: m.at("log", url.Values{"rid": {rid}}), body: msg}
}

// send sends one ping under ctx: an answer other than 2xx is an error. The
// error never holds the URL (the caller names the monitor by its String).
func (m *Monitor) send(ctx context.Context, r request) error {
	req, err := http.NewRequestWithContext(ctx, r.method, r.url.String(), strings.NewReader(r.body))
	if err != nil {
		return errors.New("cannot build the request")
	}
	if r.body != "" {
		req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	}
	req.Header.Set("User-Agent", "slotctl")
	c := m.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return timeoutError(m.timeout())
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, query and all
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

// timeoutError is a ping that had no answer within d.
func timeoutError(d time.Duration) error {
	return fmt.Errorf("no answer within %s", d)
}

// cut shortens s to at most n bytes, on a character boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
