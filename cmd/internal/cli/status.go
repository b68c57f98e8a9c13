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
// every second; elsewhere one plain line when waiting starts.
type statusLine struct {
	f     *Factory
	log   *logger
	st    store.Store
	limit string
	live  bool

	mu     sync.Mutex
	t      store.Ticket
	cancel context.CancelFunc
	done   chan struct{}
}

func newStatusLine(f *Factory, log *logger, st store.Store, limit string) *statusLine {
	return &statusLine{f: f, log: log, st: st, limit: limit, live: f.IO.ErrTTY && !log.quiet}
}

func (s *statusLine) start(ctx context.Context, t store.Ticket) {
	s.t = t
	if s.log.quiet {
		return
	}
	if !s.live {
		s.log.info("%s", s.text(ctx, t, 0))
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
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
	fmt.Fprint(s.f.IO.ErrOut, "\r\033[K")
}

func (s *statusLine) draw(ctx context.Context) {
	s.mu.Lock()
	t := s.t
	s.mu.Unlock()
	w := width(s.f.ErrWidth) - 1
	fmt.Fprintf(s.f.IO.ErrOut, "\r\033[Kslotctl: %s", s.text(ctx, t, w-9))
}

// text is the status: "slotctl: waiting for limit "build" (2/2 held), 3rd in
// queue; held by make -j8 (pid 4242, 3m12s), ...", cut to width if > 0.
func (s *statusLine) text(ctx context.Context, t store.Ticket, width int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "waiting for limit %q", s.limit)
	snap, err := s.st.Snapshot(ctx, s.limit)
	if err == nil && len(snap.Limits) == 1 {
		l := snap.Limits[0]
		if l.Slots == 0 {
			fmt.Fprintf(&b, " (paused: 0 slots)")
		} else {
			fmt.Fprintf(&b, " (%d/%d held)", l.Held, l.Slots)
		}
		for _, x := range snap.Tickets {
			if x.ID == t.ID {
				t = x
			}
		}
	}
	if t.Position > 0 {
		fmt.Fprintf(&b, ", %s in queue", ordinal(t.Position))
	}
	var holders []string
	for _, x := range snap.Tickets {
		if x.State == store.Held {
			holders = append(holders, fmt.Sprintf("%s (pid %d on %s, %s)", store.Printable(x.Holder.Command()), x.Holder.Pid,
				store.Printable(x.Holder.Host), since(snap.Now, x.Admitted)))
		}
	}
	if len(holders) > 0 {
		fmt.Fprintf(&b, "; held by %s", strings.Join(holders, ", "))
	}
	out := escapeControls(b.String())
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
