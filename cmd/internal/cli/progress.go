package cli

// A waiting run in CI (docs/ci.md): the CI log is not a terminal, so the
// live status line becomes a progress line every --progress-every (on by
// default in CI), inside a collapsible section in GitLab; in GitHub Actions
// the wait also ends with a Markdown section in the step summary. All of it
// says who holds the slots: the CI runs behind them, by their URLs.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
)

const (
	// defaultProgressEvery is --progress-every in CI.
	defaultProgressEvery = 30 * time.Second
	// minProgressEvery bounds --progress-every from below: a line a
	// tenth of a second is already more than a log wants.
	minProgressEvery = 100 * time.Millisecond
	// gitlabSection is the name of the GitLab log section of the wait.
	gitlabSection = "slotctl_wait"
	// maxBriefHolders and maxSummaryRuns are how many runs a progress
	// line and a summary (of each list) name before "N more".
	maxBriefHolders = 3
	maxSummaryRuns  = 10
	// Stored text is cut to these many characters in a progress line or
	// a summary: a record may hold a command line of any length.
	maxShownCommand = 80
	maxShownURL     = 300
)

// ciVars are the variables that say a run is in CI, each with the value
// that means so ("" for any non-empty value): CI as most CIs set it
// (GitHub Actions, GitLab, Buildkite, CircleCI, Travis), and the CIs' own.
var ciVars = []struct{ name, value string }{
	{"CI", ""},
	{"GITHUB_ACTIONS", "true"},
	{"GITLAB_CI", ""},
	{"BUILDKITE", "true"},
	{"JENKINS_URL", ""},
	{"TF_BUILD", "True"},
}

// inCI reports whether the environment says the run is in CI. CI set to
// "false" or "0" says it is not (as some tools set it to turn CI behaviour
// off), whatever else is set.
func inCI(getenv func(string) string) bool {
	if v := strings.ToLower(getenv("CI")); v == "false" || v == "0" {
		return false
	}
	for _, v := range ciVars {
		if x := getenv(v.name); x != "" && (v.value == "" || strings.EqualFold(x, v.value)) {
			return true
		}
	}
	return false
}

// ciWait is what a waiting run prints in CI when stderr is not a terminal.
type ciWait struct {
	every  time.Duration // a progress line this often; 0: the first line only
	gitlab bool          // the lines go in a collapsed GitLab section
}

// ciWaitOf is the run's ciWait: its --progress-every, and GitLab's
// section when GITLAB_CI is true.
func ciWaitOf(f *Factory, o *RunOptions) ciWait {
	return ciWait{every: o.ProgressEvery, gitlab: f.Getenv("GITLAB_CI") == "true"}
}

// resolveProgress reads --progress-every (or the config file's
// progress-every; set says it is the flag) into ProgressEvery: "" is the
// default, 30s in CI and off elsewhere; 0 is off.
func (o *RunOptions) resolveProgress(f *Factory, set bool) error {
	if o.progressEvery == "" {
		if inCI(f.Getenv) {
			o.ProgressEvery = defaultProgressEvery
		}
		return nil
	}
	d, err := time.ParseDuration(o.progressEvery)
	if err != nil || d < 0 || d > 0 && d < minProgressEvery {
		what := "--progress-every " + quoteInput(o.progressEvery)
		if !set {
			what = f.settingSource("progress-every") + ": progress-every " + quoteInput(o.progressEvery)
		}
		return usageError("%s: want 0 (no progress lines) or a duration of at least %s, such as 30s or 5m", what, minProgressEvery)
	}
	o.ProgressEvery = d
	return nil
}

// startPlain starts a wait's lines where stderr is not a terminal: the
// GitLab section's start, the first line, and a progress line every
// ci.every until stop.
func (s *statusLine) startPlain(ctx context.Context, t store.Ticket) {
	if s.ci.gitlab {
		fmt.Fprintf(s.f.IO.ErrOut, "\033[0Ksection_start:%d:%s[collapsed=true]\r\033[0Kslotctl: %s\n",
			time.Now().Unix(), gitlabSection, escapeControls("waiting for "+limitsPhrase(s.limits)))
		s.section = true
	}
	s.log.info("%s", s.text(ctx, t, 0))
	if s.ci.every <= 0 {
		return
	}
	began := time.Now()
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		tick := time.NewTicker(s.ci.every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s.mu.Lock()
			t := s.t
			s.mu.Unlock()
			line := s.progressLine(ctx, t, time.Since(began))
			if ctx.Err() != nil {
				return // the wait ended during the reads: no stale line
			}
			s.log.info("%s", line)
		}
	}()
}

// endSection closes the GitLab section, if one is open.
func (s *statusLine) endSection() {
	if s.section {
		fmt.Fprintf(s.f.IO.ErrOut, "\033[0Ksection_end:%d:%s\r\033[0K\n", time.Now().Unix(), gitlabSection)
		s.section = false
	}
}

// progressLine is a progress line: "still waiting after 1m30s for limit
// "build" (1/1 held), 1st in queue, ~4m; held by https://ci/run/7 (2m10s)".
func (s *statusLine) progressLine(ctx context.Context, t store.Ticket, waited time.Duration) string {
	lead := "still waiting after " + toSecond(waited) + " for"
	return s.describe(ctx, t, 0, lineStyle{lead: lead, holders: briefHolders, readOwn: true})
}

// briefHolders names the holders of the limits in snap that pick chooses,
// each ticket once, at most maxBriefHolders: a progress line is one line
// of a log.
func briefHolders(snap store.Snapshot, pick func(limit string) bool) string {
	seen := map[string]bool{}
	var out []string
	n := 0
	for _, x := range snap.Tickets {
		if x.State != store.Held || !pick(x.Limit) || seen[x.ID] {
			continue
		}
		seen[x.ID] = true
		if n++; n <= maxBriefHolders {
			out = append(out, briefHolder(x, snap.Now))
		}
	}
	if n > maxBriefHolders {
		out = append(out, fmt.Sprintf("%d more", n-maxBriefHolders))
	}
	return strings.Join(out, ", ")
}

// briefHolder is one holder as a progress line names it: its CI run's URL
// if it recorded one, else its command, pid and host; and how long it
// has held.
func briefHolder(x store.Ticket, now time.Time) string {
	held := since(now, x.Admitted)
	if x.Holder.URL != "" {
		return fmt.Sprintf("%s (%s)", clip(store.Printable(x.Holder.URL), maxShownURL), held)
	}
	return fmt.Sprintf("%s (pid %d on %s, %s)", clip(store.Printable(x.Holder.Command()), maxShownCommand), x.Holder.Pid,
		clip(store.Printable(x.Holder.Host), maxShownCommand), held)
}

// clip cuts s to n characters, marking the cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// waitSummary writes a run's wait into GitHub Actions' step summary
// ($GITHUB_STEP_SUMMARY): a Markdown section once the wait ends, saying
// how long it waited for which limits, who held them and who was ahead
// when it began, and how it ended; for an admitted run, a line once the
// job has run. A file it cannot write costs one warning, never the run.
type waitSummary struct {
	ctx    context.Context
	path   string
	log    *logger
	st     store.Store
	o      *RunOptions
	limits []string

	began    time.Time // the wait's start; zero if it did not wait
	waited   time.Duration
	held     []summaryRun // when the wait began
	ahead    []summaryRun
	more     [2]int    // held and ahead beyond those listed
	admitted time.Time // zero unless admitted after a wait
	warned   bool
}

// A summaryRun is a run a summary names.
type summaryRun struct {
	url, what string        // its CI run's URL, else its command, pid and host
	limits    []string      // the run's limits among the waiter's
	held      time.Duration // how long it had held them; < 0: waiting
}

// newWaitSummary is the run's step summary, nil when
// GITHUB_STEP_SUMMARY is not set.
func newWaitSummary(ctx context.Context, f *Factory, log *logger, st store.Store, o *RunOptions, limits []string) *waitSummary {
	path := f.Getenv("GITHUB_STEP_SUMMARY")
	if path == "" {
		return nil
	}
	return &waitSummary{ctx: ctx, path: path, log: log, st: st, o: o, limits: limits}
}

// notify takes the wait's start, end and admission from the holder's
// notes, then hands each on to next.
func (w *waitSummary) notify(next func(holder.Note)) func(holder.Note) {
	if w == nil {
		return next
	}
	return func(n holder.Note) {
		switch n.Kind {
		case holder.WaitStart:
			w.start(n.Ticket)
		case holder.WaitEnd:
			w.waited = time.Since(w.began)
		case holder.Admitted:
			if !w.began.IsZero() {
				w.admitted = time.Now()
				w.write(w.section("Admitted."))
			}
		}
		next(n)
	}
}

// start reads who holds the limits and who is ahead of ticket t.
func (w *waitSummary) start(t store.Ticket) {
	w.began = time.Now()
	snap, err := w.st.Snapshot(w.ctx, w.limits...)
	if err != nil {
		return // a summary without names rather than no run
	}
	w.held, w.ahead, w.more = summaryRuns(snap, t.ID)
}

// summaryRuns are the runs holding the limits of snap and those waiting
// ahead of ticket id in any of them (id "": none), each once with the
// limits it is listed under, at most maxSummaryRuns of each, and how many
// more there were of each.
func summaryRuns(snap store.Snapshot, id string) (held, ahead []summaryRun, more [2]int) {
	pos := map[string]int{}
	for _, x := range snap.Tickets {
		if x.ID == id && x.State == store.Waiting {
			pos[x.Limit] = x.Position
		}
	}
	type ref struct {
		list *[]summaryRun
		i    int // < 0: not listed
	}
	seen := map[string]ref{}
	for _, x := range snap.Tickets {
		list := &ahead
		switch {
		case x.ID == id:
			continue
		case x.State == store.Held:
			list = &held
		case x.Position < 1 || x.Position >= pos[x.Limit]:
			continue
		}
		if r, ok := seen[x.ID]; ok {
			if r.i >= 0 {
				(*r.list)[r.i].limits = append((*r.list)[r.i].limits, x.Limit)
			}
			continue
		}
		if len(*list) >= maxSummaryRuns {
			seen[x.ID] = ref{list, -1}
			if list == &held {
				more[0]++
			} else {
				more[1]++
			}
			continue
		}
		r := summaryRun{url: x.Holder.URL, limits: []string{x.Limit}, held: -1}
		if r.url == "" {
			r.what = fmt.Sprintf("%s (pid %d on %s)", clip(store.Printable(x.Holder.Command()), maxShownCommand), x.Holder.Pid,
				clip(store.Printable(x.Holder.Host), maxShownCommand))
		}
		if x.State == store.Held {
			r.held = 0
			if !x.Admitted.IsZero() {
				r.held = max(snap.Now.Sub(x.Admitted), 0)
			}
		}
		seen[x.ID] = ref{list, len(*list)}
		*list = append(*list, r)
	}
	return held, ahead, more
}

// toSecond is a duration as the summary and the progress lines show it,
// to the second.
func toSecond(d time.Duration) string {
	if d < time.Second {
		return "0s"
	}
	return d.Truncate(time.Second).String()
}

// finish writes the end of the run into the summary once holder.Run is
// done: the job's time and status after an admission that waited, or the
// section of a run that was not admitted (err is the run's error).
func (w *waitSummary) finish(out holder.Outcome, err error) {
	if w == nil {
		return
	}
	if !w.admitted.IsZero() {
		if out.Result == holder.Ran {
			w.write(fmt.Sprintf("_slotctl: the job held %s for %s and exited with status %d._\n\n",
				codeList(w.limits), toSecond(time.Since(w.admitted)), exitCode(err)))
		}
		return
	}
	var full *store.QueueFullError
	isFull := out.Result == holder.Failed && errors.As(out.Err, &full)
	if w.began.IsZero() {
		// Not admitted without waiting: --no-wait, a full queue.
		if out.Result != holder.Busy && !isFull {
			return
		}
		if snap, serr := store.Heads(w.ctx, w.st, w.limits...); serr == nil {
			w.held, _, w.more = summaryRuns(snap, "")
		}
	}
	var outcome string
	switch {
	case out.Result == holder.Busy && w.o.Wait == 0:
		outcome = "Not admitted: no slot was free and it did not wait; the job did not run."
	case out.Result == holder.Busy:
		outcome = fmt.Sprintf("Not admitted within --wait %s; the job did not run.", w.o.Wait)
	case isFull:
		outcome = fmt.Sprintf("Refused: %d runs were already waiting for `%s` (--max-waiting %d); the job did not run.", full.Waiting, full.Limit, full.Max)
	case out.Result == holder.Superseded:
		by := mdText(store.Printable(out.By.Ticket))
		if out.By.URL != "" {
			by = mdLink(out.By.URL)
		}
		outcome = "Superseded by a newer run of its key, " + by + "; the job did not run."
	case out.Result == holder.Signalled:
		outcome = "Stopped by a signal (" + mdText(fmt.Sprint(out.Signal)) + ") while waiting; the job did not run."
	case out.Result == holder.LostWaiting:
		outcome = "Its ticket was lost while waiting; the job did not run."
	default:
		if err == nil {
			return
		}
		outcome = "Not admitted: " + mdText(err.Error()) + "."
	}
	w.write(w.section(outcome))
}

// section is the summary's Markdown section with outcome (Markdown).
func (w *waitSummary) section(outcome string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### slotctl: %s\n\n", limitsPhraseCode(w.limits))
	if !w.began.IsZero() {
		fmt.Fprintf(&b, "Waited %s. ", toSecond(w.waited))
	}
	b.WriteString(outcome + "\n\n")
	when := "When it began waiting, held by:"
	if w.began.IsZero() {
		when = "Held by:"
	}
	w.list(&b, when, w.held, w.more[0])
	w.list(&b, "Ahead of it in the queue:", w.ahead, w.more[1])
	return b.String()
}

// list writes runs as a Markdown list under title, if there are any.
func (w *waitSummary) list(b *strings.Builder, title string, runs []summaryRun, more int) {
	if len(runs) == 0 {
		return
	}
	b.WriteString(title + "\n")
	for _, r := range runs {
		b.WriteString("- ")
		if r.url != "" {
			b.WriteString(mdLink(r.url))
		} else {
			b.WriteString(mdText(r.what))
		}
		var notes []string
		if len(w.limits) > 1 {
			notes = append(notes, "in "+codeList(r.limits))
		}
		if r.held >= 0 {
			notes = append(notes, "held for "+toSecond(r.held))
		}
		if len(notes) > 0 {
			b.WriteString(" (" + strings.Join(notes, ", ") + ")")
		}
		b.WriteString("\n")
	}
	if more > 0 {
		fmt.Fprintf(b, "- and %d more\n", more)
	}
	b.WriteString("\n")
}

// write appends text to the summary file; the first failure is a warning.
func (w *waitSummary) write(text string) {
	// O_NONBLOCK: a FIFO with no reader is an error, not a hang.
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK, 0o644)
	if err == nil {
		_, err = f.WriteString(text)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil && !w.warned {
		w.warned = true
		w.log.warn("step summary not written (GITHUB_STEP_SUMMARY): %v", err)
	}
}

// limitsPhraseCode is limitsPhrase in Markdown: limit `a`, limits `a`, `b`
// (limit names are [A-Za-z0-9._:-]: nothing to escape in a code span).
func limitsPhraseCode(limits []string) string {
	if len(limits) == 1 {
		return "limit " + codeList(limits)
	}
	return "limits " + codeList(limits)
}

// codeList is names as Markdown code spans: `a`, `b`.
func codeList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "`" + strings.ReplaceAll(store.Printable(n), "`", "'") + "`"
	}
	return strings.Join(q, ", ")
}

// mdPunct are the characters Markdown may read as markup in the middle
// of a line (links, images, emphasis, code, HTML, entities, autolinks,
// mentions, emoji, math, tables) or after a list item's "- " (headings,
// nested lists), each of which a backslash makes literal. Stored text
// never begins a line of a summary, and no line break reaches it.
const mdPunct = "\\`*_{}[]()<>#+-!|~&:@$"

// mdText is text as literal Markdown: one line without control
// characters (escapeControls, the net under store.Printable, which
// callers apply to stored text), cut short, with each character of mdPunct
// escaped, so that it can open no link, emphasis, heading, list, HTML tag,
// entity or autolink.
func mdText(s string) string {
	s = clip(escapeControls(s), maxShownURL)
	var b strings.Builder
	for _, r := range s {
		if r < utf8.RuneSelf && strings.ContainsRune(mdPunct, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// mdLink is a stored URL as a Markdown link: the URL as literal text
// (mdText), linking to it with every byte outside a URL's plain
// characters percent-encoded, so that it cannot end the link or begin
// markup. Only an absolute http or https URL is linked; anything else is
// text.
func mdLink(raw string) string {
	text := mdText(store.Printable(raw))
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || !store.IsPrintable(raw) || len(raw) > store.MaxURL {
		return text
	}
	return "[" + text + "](" + mdDest(raw) + ")"
}

// mdDest is raw as a link destination: letters, digits and
// -._~:/?#@!$&'*+,;=% as they are, any other byte percent-encoded.
func mdDest(raw string) string {
	const plain = "-._~:/?#@!$&'*+,;=%"
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(plain, c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
