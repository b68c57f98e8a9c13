package cli

// slotctl release with no TICKET: ask the keeper of slotctl acquire to let
// go (keeper.go), then wait until its ticket is gone from the store.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// releaseGrace is how long release waits beyond a ticket's TTL for it to
// go, and for a ticket whose keeper has ended but whose slotctl run is
// still finishing.
const releaseGrace = 30 * time.Second

// releasePoll is how often release reads the ticket while it waits.
const releasePoll = 100 * time.Millisecond

// runReleaseKeeper is slotctl release without TICKET: the keeper named by
// --keeper or SLOTCTL_KEEPER lets go, and release returns once its ticket
// has left the store (its slotctl run releases only after the keeper's job
// is gone).
func runReleaseKeeper(ctx context.Context, f *Factory, g *globalOptions, o *ReleaseOptions) error {
	log := newLogger(f, g)
	// Keepers that ended otherwise than by a release left their
	// directories: once this release is done, whatever it said.
	defer sweepEndedKeepers(f)
	sock := o.Keeper
	if sock == "" {
		sock = f.Getenv(keeperVar)
	}
	ticket := f.Getenv(proc.TicketVar)
	if ticket != "" && checkTicketPrefix(ticket) != nil {
		return usageError("%s %s: not a ticket id", proc.TicketVar, quoteInput(ticket))
	}
	if sock == "" {
		if ticket != "" {
			st, err := f.openStore(withStore(g, ticketStore(f)))
			if err != nil {
				return err
			}
			defer st.Close()
			return keeperGone(ctx, st, log, "", ticket)
		}
		return &ExitError{Code: exitUsage, Err: fmt.Errorf("no TICKET given and no keeper to ask: %s is not set", keeperVar),
			Hint: "run it where slotctl acquire's variables are set, or name tickets: slotctl release TICKET..."}
	}
	// The store first, before the keeper is asked: a store that only
	// slotctl-etcd serves makes this process that one now, and a store
	// that cannot be opened is said while the slot is still held.
	st, err := f.openStore(withStore(g, ticketStore(f)))
	if err != nil {
		return err
	}
	defer func() { st.Close() }()
	reply, c, err := askKeeper(sock)
	switch {
	case errors.Is(err, errNoKeeper):
		return keeperGone(ctx, st, log, sock, ticket)
	case err != nil:
		return err
	}
	// The connection closes when the keeper has exited; then its run
	// drains the job and releases.
	_, _ = io.Copy(io.Discard, c)
	c.Close()
	if reply.Store != "" && reply.Store != st.String() {
		// The keeper's word on where its ticket is: it is this user's.
		// Should that store be etcd, slotctl-etcd takes this process's
		// place with its arguments and environment: these tell it which
		// ticket to look for, and where, now that the keeper has gone.
		_ = os.Setenv(storeExportedVar, reply.Store)
		_ = os.Setenv(proc.TicketVar, reply.Ticket)
		st.Close()
		if st, err = f.openStore(withStore(g, reply.Store)); err != nil {
			return err
		}
	}
	if err := waitTicketGone(ctx, st, log, reply.Ticket, 0); err != nil {
		return err
	}
	removeKeeperDir(sock)
	return nil
}

// removeKeeperDir removes the directory of the keeper whose socket was
// sock, once it has ended: the files a keeper's directory holds and the
// directory, nothing else (--keeper may name any socket).
func removeKeeperDir(sock string) {
	dir := filepath.Dir(sock)
	if filepath.Base(sock) != keeperSocket || checkPrivateDir(dir) != nil {
		return
	}
	pfd, err := unix.Open(filepath.Dir(dir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(pfd)
	dfd, err := openPrivateAt(pfd, filepath.Base(dir))
	if err != nil {
		return
	}
	defer unix.Close(dfd)
	removeKeeperDirAt(pfd, dfd, filepath.Base(dir))
}

// ticketStore is the store of the ticket the job's variables name:
// SLOTCTL_STORE_EXPORTED, which the run holding it (the keeper's, after
// acquire) exports beside SLOTCTL_TICKET, whatever SLOTCTL_STORE or --store
// name in the releasing step; "" without it (the store as configured).
func ticketStore(f *Factory) string { return f.Getenv(storeExportedVar) }

// withStore is g with its store set to url when url is not empty.
func withStore(g *globalOptions, url string) *globalOptions {
	if url == "" {
		return g
	}
	g2 := *g
	g2.Store = url
	return &g2
}

// waitTicketGone waits until ticket id is gone from st (released), or its
// lease has expired (its run could not release it: any admission now
// frees the slot), for at most its TTL and releaseGrace, or for bound if
// not 0.
func waitTicketGone(ctx context.Context, st store.Store, log *logger, id string, bound time.Duration) error {
	start := time.Now()
	deadline := start.Add(releaseGrace)
	if bound > 0 {
		deadline = start.Add(bound)
	}
	what := "ticket " + shortID(id)
	var lastErr error
	for {
		t, err := st.Get(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			log.info("released %s", what)
			return nil
		case err != nil:
			lastErr = err
		case t.Expired():
			log.warn("ticket %s (%s) was not released by its keeper's slotctl run, but its lease has expired: the next admission frees the slot", shortID(id), ticketLimits(t))
			return nil
		default:
			lastErr = nil
			if what == "ticket "+shortID(id) {
				what = fmt.Sprintf("ticket %s (%s)", shortID(id), ticketLimits(t))
				if bound == 0 {
					deadline = start.Add(t.TTL + releaseGrace)
				}
			}
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				return &ExitError{Code: exitUnavailable, Err: fmt.Errorf("%s: could not see it released: %w", what, lastErr)}
			}
			return &ExitError{Code: exitUnavailable, Err: fmt.Errorf("%s is still in the store %s after its keeper ended", what, time.Since(start).Round(time.Second))}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(releasePoll):
		}
	}
}

// keeperGone is release when there is no keeper to ask: none named
// (sock is ""), or none answers at sock. Ticket id gone (or unknown):
// nothing to release, exit 0. Still held by a slotctl run alive on this
// host while a keeper was named: that run is finishing, wait for it.
// Otherwise exit 64: release cannot release it, and does not take the
// store's word for whose it is.
func keeperGone(ctx context.Context, st store.Store, log *logger, sock, id string) error {
	if id == "" {
		log.info("keeper %s is not running, and %s is not set: nothing to release", sock, proc.TicketVar)
		return nil
	}
	t, err := st.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound) && sock == "":
		log.info("ticket %s (%s) is not in the store: already released", shortID(id), proc.TicketVar)
		return nil
	case errors.Is(err, store.ErrNotFound):
		log.info("keeper %s has ended and ticket %s is gone: already released", sock, shortID(id))
		return nil
	case err != nil:
		return err
	case sock != "" && proc.SupervisorAlive(t):
		return waitTicketGone(ctx, st, log, id, releaseGrace)
	}
	h := t.Holder
	if sock == "" {
		return usageError("ticket %s (%s) is held by %s (pid %d on %s), and %s is not set: no keeper of slotctl acquire to ask; a slotctl run releases when its command exits",
			shortID(id), ticketLimits(t), store.Printable(h.Command()), h.Pid, store.Printable(h.Host), keeperVar)
	}
	return usageError("keeper %s is not running, but ticket %s (%s) is still in the store, held by pid %d on %s: it goes when its lease expires (within %s), or by hand: slotctl release %s",
		sock, shortID(id), ticketLimits(t), h.Pid, store.Printable(h.Host), t.TTL, shortID(id))
}
