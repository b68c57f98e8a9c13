package cli

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/slotctl/slotctl/store"
)

// statusLine tells a waiting user where they stand: on a terminal one live
// line (queue position, who holds the slots and for how long), refreshed
// every second; elsewhere one plain line when waiting starts, then in CI
// a progress line every so often (progress.go).
type statusLine struct {
	f      *Factory
	log    *logger
	st     store.Store
	limits []string // the ticket's, in its order
	live   bool

	// holds are the limit's recent hold times for the admission estimate
	// (estimate.go), read at holdsAt; only the drawing goroutine uses them.
	holds   map[string][]time.Duration
	holdsAt time.Time

	// ci is what it prints in CI when not live (progress.go): a line
	// every ci.every, in a GitLab section; section: one is open.
	ci      ciWait
	section bool

	mu     sync.Mutex
	t      store.Ticket
	cancel context.CancelFunc
	done   chan struct{}
}

func newStatusLine(f *Factory, log *logger, st store.Store, limits []string) *statusLine {
	return &statusLine{f: f, log: log, st: st, limits: limits, live: f.IO.ErrTTY && !log.quiet}
}

func (s *statusLine) start(ctx context.Context, t store.Ticket) {
	s.t = t
	if s.log.quiet {
		return
	}
	if !s.live {
		s.startPlain(ctx, t) // progress.go
		return
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			s.draw(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// update takes a fresh read of the ticket from the waiter.
func (s *statusLine) update(t store.Ticket) {
	s.mu.Lock()
	s.t = t
	s.mu.Unlock()
}

func (s *statusLine) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
		if s.live {
			fmt.Fprint(s.f.IO.ErrOut, "\r\033[K")
		}
	}
	s.endSection()
}

func (s *statusLine) draw(ctx context.Context) {
	s.mu.Lock()
	t := s.t
	s.mu.Unlock()
	w := width(s.f.ErrWidth) - 1
	fmt.Fprintf(s.f.IO.ErrOut, "\r\033[Kslotctl: %s", s.text(ctx, t, w-9))
}

// text is the status: "slotctl: waiting for limit "build" (2/2 held), 3rd in
// queue, ~4m; held by make -j8 (pid 4242, 3m12s), ...", cut to width if > 0
// (the estimate once the limit has a few recent runs: estimate.go).
func (s *statusLine) text(ctx context.Context, t store.Ticket, width int) string {
	return s.describe(ctx, t, width, lineStyle{lead: "waiting for", holders: holders, readOwn: s.live})
}

// lineStyle is how a waiting line is written: its lead ("waiting for"),
// how it names the holders, and whether it reads the ticket's own place
// when the heads do not list it.
type lineStyle struct {
	lead    string
	holders func(snap store.Snapshot, pick func(limit string) bool) string
	readOwn bool
}

// describe is text in style ls.
func (s *statusLine) describe(ctx context.Context, t store.Ticket, width int, ls lineStyle) string {
	if len(s.limits) > 1 || t.Weighs() > 1 {
		return cut(s.multiText(ctx, t, ls), width)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s limit %q", ls.lead, s.limits[0])
	// The heads only: every waiter draws this line, and a read of the
	// whole queue by each would cost the store the square of the queue.
	snap, err := store.Heads(ctx, s.st, s.limits[0])
	if err == nil && len(snap.Limits) == 1 {
		l := snap.Limits[0]
		if l.Slots == 0 {
			fmt.Fprintf(&b, " (paused: 0 slots)")
		} else {
			fmt.Fprintf(&b, " (%d/%d held%s)", l.Held, l.Slots, rateSpent(l, snap.Now))
		}
		found := false
		for _, x := range snap.Tickets {
			if x.ID == t.ID {
				t, found = x, true
			}
		}
		if !found && ls.readOwn {
			// The heads list no waiter but the first: redrawn every
			// second (or a progress line), the line asks for the
			// ticket's own place, which the waiter's renewals would
			// bring only every period.
			if x, err := s.st.Get(ctx, t.ID); err == nil && x.State == store.Waiting {
				t = x
			}
		}
	}
	if t.Position > 0 {
		fmt.Fprintf(&b, ", %s in queue", ordinal(t.Position))
		if err == nil {
			b.WriteString(s.estimate(ctx, snap, t, nil))
		}
	}
	if h := ls.holders(snap, func(string) bool { return true }); h != "" {
		fmt.Fprintf(&b, "; held by %s", h)
	}
	return cut(b.String(), width)
}

// multiText is the status of a ticket of several limits or of a weight
// above one: which of its limits keep it waiting, with its place in each,
// and who holds those: "waiting for limits "build", "db" (weight 2): "db"
// (3/4 held), 2nd in queue; held by ...". A limit keeps it waiting while an
// older ticket waits there or fewer than its weight slots are free.
func (s *statusLine) multiText(ctx context.Context, t store.Ticket, ls lineStyle) string {
	var b strings.Builder
	b.WriteString(ls.lead + " " + limitsPhrase(s.limits))
	if w := t.Weighs(); w > 1 {
		fmt.Fprintf(&b, " (weight %d)", w)
	}
	snap, err := s.st.Snapshot(ctx, s.limits...)
	if err != nil {
		return b.String()
	}
	pos := map[string]int{}
	for _, x := range snap.Tickets {
		if x.ID == t.ID && x.State == store.Waiting {
			pos[x.Limit] = x.Position
		}
	}
	blocking := map[string]bool{}
	var parts []string
	for _, l := range snap.Limits {
		if pos[l.Name] <= 1 && l.Slots-l.Held >= t.Weighs() && !l.Opens.After(snap.Now) {
			continue // first in line with room (and a rate not spent): not what it waits for
		}
		blocking[l.Name] = true
		p := fmt.Sprintf("%q ", l.Name)
		if l.Slots == 0 {
			p += "(paused: 0 slots)"
		} else {
			p += fmt.Sprintf("(%d/%d held%s)", l.Held, l.Slots, rateSpent(l, snap.Now))
		}
		if pos[l.Name] > 0 {
			p += fmt.Sprintf(", %s in queue", ordinal(pos[l.Name]))
		}
		if l.Slots > 0 && l.Slots < t.Weighs() {
			p += fmt.Sprintf(", smaller than weight %d: waits for a resize", t.Weighs()) // shrunk below it (README)
		}
		parts = append(parts, p)
	}
	if len(parts) > 0 {
		b.WriteString(": " + strings.Join(parts, "; "))
		b.WriteString(s.estimate(ctx, snap, t, blocking))
	}
	if h := ls.holders(snap, func(l string) bool { return blocking[l] }); h != "" {
		fmt.Fprintf(&b, "; held by %s", h)
	}
	return b.String()
}

// holders lists who holds slots of the limits in snap that pick chooses,
// each ticket once.
func holders(snap store.Snapshot, pick func(limit string) bool) string {
	seen := map[string]bool{}
	var out []string
	for _, x := range snap.Tickets {
		if x.State == store.Held && pick(x.Limit) && !seen[x.ID] {
			seen[x.ID] = true
			url := ""
			if x.Holder.URL != "" { // the CI run behind it (run --url, else the CI's variables)
				url = ", " + store.Printable(x.Holder.URL)
			}
			out = append(out, fmt.Sprintf("%s (pid %d on %s, %s%s)", store.Printable(x.Holder.Command()), x.Holder.Pid,
				store.Printable(x.Holder.Host), since(snap.Now, x.Admitted), url))
		}
	}
	return strings.Join(out, ", ")
}

// cut escapes the status and cuts it to width, if > 1.
func cut(s string, width int) string {
	out := escapeControls(s)
	if width > 1 && len([]rune(out)) > width {
		out = string([]rune(out)[:width-1]) + "…"
	}
	return out
}

func since(now, t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	d := now.Sub(t)
	if d < time.Second {
		return "0s"
	}
	return d.Truncate(time.Second).String()
}

func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}
