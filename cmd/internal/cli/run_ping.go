package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/slotctl/slotctl/cmd/internal/ping"
	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/store"
)

// resolvePing parses --ping, or the config file's ping: (set says which):
// one line naming the input, without its user, password or query, and
// what is accepted. An empty --ping turns the config's off.
func (o *RunOptions) resolvePing(f *Factory, set bool) error {
	if o.Ping == "" {
		return nil
	}
	m, err := ping.Parse(o.Ping)
	if err != nil {
		if set {
			return usageError("--ping %s: %v", quoteInput(redactURL(o.Ping)), err)
		}
		return usageError("%s: ping %s: %v", f.settingSource("ping"), quoteInput(redactURL(o.Ping)), err)
	}
	o.monitor = m
	return nil
}

// redactURL is a ping URL, good or bad, as it may be shown: whatever stands
// between "//" and an "@" is a user and password, and the query from "?"
// on can hold a key.
func redactURL(s string) string {
	s, _, _ = strings.Cut(s, "?")
	if i := strings.Index(s, "//"); i >= 0 {
		rest := s[i+2:]
		if at := strings.LastIndexByte(rest, '@'); at >= 0 && !strings.Contains(rest[:at], "/") {
			s = s[:i+2] + "…@" + rest[at+1:]
		}
	}
	return s
}

// runPings are the pings of one run (docs/cron.md): the start ping when
// the job starts, its exit status once the slot is released, or the log
// ping of a run that was not admitted. Without a monitor they are nothing.
type runPings struct {
	m   *ping.Monitor
	log *logger
	run *ping.Run // the job's, once it started
}

// notify sends the start ping when the holder reports the job started,
// then hands the note on to next.
func (p *runPings) notify(next func(holder.Note)) func(holder.Note) {
	if p.m == nil {
		return next
	}
	return func(n holder.Note) {
		if n.Kind == holder.Started && p.run == nil {
			p.started(n.Ticket.ID)
		}
		next(n)
	}
}

// started sends the start ping of the run with ticket id, in the
// background.
func (p *runPings) started(id string) {
	if p.m != nil {
		p.run = p.m.Begin(ping.RID(id))
	}
}

// finish sends the run's last ping once the holder is done (the slot is
// released): the exit status slotctl exits with (err's) for a job that
// started, the log ping naming the holders for one that was not admitted
// (busy, queue full or superseded: it exits --busy-exit-code), nothing
// otherwise. id is the run's ticket. It returns within ping.Bound.
func (p *runPings) finish(ctx context.Context, st store.Store, limits []string, id string, out holder.Outcome, err error) {
	if p.m == nil {
		return
	}
	var perr error
	var full *store.QueueFullError
	switch {
	case p.run != nil:
		perr = p.run.End(exitCode(err))
	case out.Result == holder.Busy || out.Result == holder.Superseded || out.Result == holder.Failed && errors.As(out.Err, &full):
		perr = p.m.Skipped(ping.RID(id), skipMessage(ctx, st, limits, err))
	}
	if perr != nil {
		p.log.warn("ping %s: %v", p.m, perr)
	}
}

// skipMessage is a skipped run's log ping: why it was not admitted, and
// who held the slots — each holder's ticket, label, host, pid and CI URL,
// as ls shows them, but not its command line, which can carry secrets and
// is not the monitor's to see.
func skipMessage(ctx context.Context, st store.Store, limits []string, err error) string {
	msg := "slotctl: not admitted, did not run"
	if err != nil && err.Error() != "" {
		msg += ": " + err.Error()
	}
	snap, herr := store.Heads(ctx, st, limits...)
	if herr != nil {
		return msg
	}
	seen := map[string]bool{}
	var held []string
	for _, t := range snap.Tickets {
		if t.State != store.Held || seen[t.ID] || !contains(limits, t.Limit) {
			continue
		}
		seen[t.ID] = true
		var b strings.Builder
		fmt.Fprintf(&b, "ticket %s (", short(t.ID))
		if t.Holder.Label != "" {
			fmt.Fprintf(&b, "%s, ", store.Printable(t.Holder.Label))
		}
		fmt.Fprintf(&b, "host %s, pid %d", store.Printable(t.Holder.Host), t.Holder.Pid)
		if t.Holder.URL != "" {
			b.WriteString(", " + store.Printable(t.Holder.URL))
		}
		b.WriteString(")")
		held = append(held, b.String())
	}
	if len(held) > 0 {
		msg += "\nheld by " + strings.Join(held, ", ")
	}
	return msg
}
