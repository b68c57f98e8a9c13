package holder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/store"
)

// This file is test-only: mutation.HoldAndWait (docs/leases.md H1), the
// bug that docs/leases.md rule 13 prevents. Run calls holdAndWait only
// when Config.Mutations has it, which without the build tag
// slotctl_mutations is a constant false: the call is compiled out and the
// linker drops everything here.

// holdAndWait takes a request of several limits one limit at a time, each
// as a ticket of its own, holding (and renewing) the earlier ones while it
// waits for the next: two jobs that name the same limits in other orders
// deadlock. The last limit is the run's own ticket (the request's ID), run
// by Run as a ticket of one limit; the earlier ones are let go after it.
func holdAndWait(ctx context.Context, cfg Config) Outcome {
	r := newRunner(cfg)
	names := cfg.Request.Names()
	pw := &partsWaiter{ctx: ctx, w: r.w, now: r.now, st: cfg.Store, ttl: cfg.Request.TTL, releaseTimeout: r.cfg.ReleaseTimeout}
	defer pw.leave()
	g := cfg.Gate
	g.Store = cfg.Store
	deadline := never
	if cfg.Wait >= 0 {
		deadline = r.now() + cfg.Wait
	}
	for i, name := range names[:len(names)-1] {
		e, err := g.Join(ctx, part(cfg.Request, name, fmt.Sprintf("%s-%d", cfg.Request.ID, i)))
		if err != nil {
			return Outcome{Result: Failed, Err: err}
		}
		pw.add(e)
		r.note(Note{Kind: Joined, Ticket: e.Ticket()})
		for e.Ticket().State != store.Held {
			if r.now() >= deadline {
				return Outcome{Result: Busy, Ticket: e.Ticket(), Err: gate.ErrBusy}
			}
			ev := pw.Wait(Wake{At: at(deadline, r.now()+e.PollPeriod()), Done: ctx.Done(), Bell: e.Bell(), Nudge: e.Nudged()})
			switch {
			case ev.Kind == Done:
				return Outcome{Result: Failed, Ticket: e.Ticket(), Err: context.Cause(ctx)}
			case ev.Kind == Signal && Terminating(ev.Signal):
				return Outcome{Result: Signalled, Ticket: e.Ticket(), Signal: ev.Signal}
			case ev.Kind == Signal:
				continue
			}
			if _, err := e.Refresh(ctx); errors.Is(err, store.ErrLost) {
				return Outcome{Result: LostWaiting, Ticket: e.Ticket(), Err: err}
			}
		}
	}
	last := cfg
	last.Request = part(cfg.Request, names[len(names)-1], cfg.Request.ID)
	last.Waiter = pw
	if deadline != never {
		last.Wait = max(0, deadline-r.now())
	}
	return Run(ctx, last)
}

// part is req for one of its limits, as a ticket of its own.
func part(req store.EnqueueRequest, limit, id string) store.EnqueueRequest {
	req.ID, req.Limit, req.Limits = id, limit, nil
	return req
}

// partsWaiter is the Waiter of a holdAndWait run: it renews the tickets
// already taken (every TTL/3) whenever the run waits.
type partsWaiter struct {
	ctx            context.Context
	w              Waiter
	now            func() time.Duration
	st             Store
	ttl            time.Duration
	releaseTimeout time.Duration
	parts          []*gate.Entry
	lost           []bool
	next           time.Duration
}

func (p *partsWaiter) add(e *gate.Entry) {
	if len(p.parts) == 0 {
		p.next = p.now() + p.ttl/3
	}
	p.parts = append(p.parts, e)
	p.lost = append(p.lost, false)
}

// Wait implements Waiter.
func (p *partsWaiter) Wait(w Wake) Event {
	for {
		wk := w
		if len(p.parts) > 0 {
			until := w.At
			if until == 0 {
				until = never
			}
			wk.At = at(until, p.next)
		}
		ev := p.w.Wait(wk)
		now := p.now()
		if len(p.parts) > 0 && now >= p.next {
			p.renew()
			p.next = now + p.ttl/3
			if ev.Kind == Timer && (w.At == 0 || now < w.At) {
				continue // only the renewals were due
			}
		}
		return ev
	}
}

func (p *partsWaiter) renew() {
	for i, e := range p.parts {
		if p.lost[i] {
			continue
		}
		if _, err := p.st.Renew(p.ctx, e.Ticket(), p.ttl); errors.Is(err, store.ErrLost) {
			p.lost[i] = true
		}
	}
}

// leave lets the earlier tickets go: released when held, else cancelled.
func (p *partsWaiter) leave() {
	for _, e := range p.parts {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.releaseTimeout)
		if e.Ticket().State == store.Held {
			_, _ = e.Leave(rctx, store.Released)
		} else {
			_, _ = e.Cancel(rctx)
		}
		cancel()
	}
}
