package cli

import (
	"bufio"
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// ReleaseOptions are slotctl release's flags and arguments.
type ReleaseOptions struct {
	Yes     bool // do not ask
	Force   bool // release a holder alive on this host too
	Tickets []string
	// Keeper is --keeper, the socket of slotctl acquire's keeper to ask
	// when no TICKET is given ("": SLOTCTL_KEEPER).
	Keeper string
}

func newReleaseCmd(f *Factory, g *globalOptions, runF func(*ReleaseOptions) error) *cobra.Command {
	o := &ReleaseOptions{}
	cmd := &cobra.Command{
		Use:   "release [TICKET...]",
		Short: "Let go of slotctl acquire's slot, or release a ticket by hand (operator's override)",
		Long: `Without TICKET: ask the keeper of slotctl acquire (SLOTCTL_KEEPER, or --keeper)
to let go of its slot, and wait until the ticket is gone.

With TICKET: remove it by hand and admit the next waiters. TICKET is a full
ticket id or a unique prefix of one (slotctl ls shows them). A holder still
alive on this host is refused unless --force.`,
		Annotations: manPage(releaseManPage),
		Example: `  # a later CI step, after slotctl acquire
  slotctl release
  # the operator's override
  slotctl release 3f2a9c1e
  slotctl release --yes 3f2a 77b0`,
		ValidArgsFunction: f.completeTickets,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && cmd.Flags().Changed("keeper") {
				return errArgs(cmd, "--keeper asks a keeper to let go of its own ticket: give it without TICKET")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Tickets = args
			if len(args) == 0 {
				if runF != nil {
					return runF(o)
				}
				return runReleaseKeeper(cmd.Context(), f, g, o)
			}
			for _, a := range args {
				if err := checkTicketPrefix(a); err != nil {
					return err
				}
			}
			if runF != nil {
				return runF(o)
			}
			return runRelease(cmd.Context(), f, g, o)
		},
	}
	cmd.Flags().BoolVarP(&o.Yes, "yes", "y", false, "do not ask")
	cmd.Flags().BoolVar(&o.Force, "force", false, "release even when the holder is alive on this host")
	cmd.Flags().StringVar(&o.Keeper, "keeper", "", "without TICKET: the keeper's socket to ask (default $SLOTCTL_KEEPER)")
	return cmd
}

// releaseManPage is slotctl release's man page, after the help.
const releaseManPage = `Without TICKET, release lets go of the slot that slotctl acquire took: it asks
the keeper named by SLOTCTL_KEEPER (which acquire prints and puts in
$GITHUB_ENV or its --env-file), or by --keeper, to let go, and waits until
the keeper's slotctl run has ended its job and removed the ticket from the
keeper's store (SLOTCTL_STORE_EXPORTED, or the one the keeper names,
whatever SLOTCTL_STORE or --store say). Only a keeper of the same user
answers. When no keeper answers, release looks for SLOTCTL_TICKET in that
store: gone, it was already released (exit 0); still held by a slotctl run
on this host, release waits for that run to finish; held elsewhere, release
says so and exits 64 (it goes when its lease expires, or by hand with
release TICKET). With neither SLOTCTL_KEEPER nor
TICKET, or with only a SLOTCTL_TICKET that a slotctl run holds, there is
nothing to ask: exit 64.

With TICKET, release is the operator's override: it removes the ticket by
hand and admits the next waiters. TICKET is a full ticket id or a unique
prefix of one (slotctl ls shows them).

On a terminal slotctl asks first, unless --yes. A holder that is provably
still alive on this host is refused unless --force: its job still runs, and
releasing its slot lets another job in beside it. The holder notices at its
next renewal and applies its --on-lost (by default it stops its job, exit 76).
A dead holder's ticket needs no release: slotctl reap removes it, and every
admission does too, within the ticket's TTL.

EXIT STATUS
  0    released (or already gone); without TICKET: the keeper let go and
       the ticket is gone, or the keeper had ended and its ticket was gone
  1    not confirmed at the prompt
  64   no ticket matches, a prefix matches several, or the holder is alive and --force was not given;
       without TICKET: no keeper to ask (SLOTCTL_KEEPER not set), a ticket held by
       a slotctl run rather than a keeper, no keeper answers while its ticket is
       held elsewhere, or a keeper directory that is not this user's alone
  69   the store cannot be opened or reached, or the ticket was still there
       past its TTL after its keeper let go`

// runRelease is slotctl release: find every ticket first, refuse live
// holders without --force, ask on a terminal, then release them.
func runRelease(ctx context.Context, f *Factory, g *globalOptions, o *ReleaseOptions) error {
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	log := newLogger(f, g)
	var tickets []store.Ticket
	for _, a := range o.Tickets {
		t, err := findTicket(ctx, st, a)
		if err != nil {
			return err
		}
		if alive, why := provablyAlive(t); alive && !o.Force {
			return &ExitError{Code: exitUsage, Err: fmt.Errorf("ticket %s (%s): %s", shortID(t.ID), ticketLimits(t), why),
				Hint: "pass --force to release it anyway, letting another job in beside it"}
		}
		tickets = append(tickets, t)
	}
	if !o.Yes && f.IO.InTTY && f.IO.ErrTTY {
		for _, t := range tickets {
			fmt.Fprintf(f.IO.ErrOut, "slotctl: release ticket %s (%s, %s, %s, pid %d on %s)? [y/N] ",
				shortID(t.ID), ticketLimits(t), describeState(t), store.Printable(t.Holder.Command()),
				t.Holder.Pid, store.Printable(t.Holder.Host))
		}
		line, _ := bufio.NewReader(f.IO.In).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			return &ExitError{Code: 1, Err: fmt.Errorf("not released")}
		}
	}
	for _, t := range tickets {
		removed, err := st.Release(ctx, t, store.ForceReleased)
		if err != nil {
			return err
		}
		if removed {
			if len(t.Names()) > 1 {
				// One removal frees its slots in every limit at once (docs/leases.md §2.1 item 9).
				log.info("released ticket %s (%s, %s): its slots in all %d limits are free", shortID(t.ID), ticketLimits(t), describeState(t), len(t.Names()))
			} else {
				log.info("released ticket %s (%s, %s)", shortID(t.ID), ticketLimits(t), describeState(t))
			}
		} else {
			log.info("ticket %s was already gone", shortID(t.ID))
		}
	}
	return nil
}

// findTicket resolves a full id or a unique prefix among the live tickets.
func findTicket(ctx context.Context, st store.Store, prefix string) (store.Ticket, error) {
	if err := checkTicketPrefix(prefix); err != nil {
		return store.Ticket{}, err
	}
	snap, err := st.Snapshot(ctx)
	if err != nil {
		return store.Ticket{}, err
	}
	var matches []store.Ticket
	seen := map[string]bool{}
	for _, t := range snap.Tickets {
		if t.ID == prefix {
			return t, nil
		}
		// A ticket of several limits is listed under each: one match.
		if strings.HasPrefix(t.ID, prefix) && !seen[t.ID] {
			seen[t.ID] = true
			matches = append(matches, t)
		}
	}
	switch len(matches) {
	case 0:
		return store.Ticket{}, usageError("no live ticket matches %q (slotctl ls shows them)", prefix)
	case 1:
		return matches[0], nil
	}
	var c []string
	for _, t := range matches {
		c = append(c, fmt.Sprintf("%s (%s, %s)", store.Printable(t.ID), ticketLimits(t), store.Printable(t.Holder.Command())))
	}
	return store.Ticket{}, usageError("ticket prefix %q matches %d tickets: %s", prefix, len(matches), strings.Join(c, "; "))
}

// checkTicketPrefix refuses a TICKET argument that no ticket id can start with.
func checkTicketPrefix(prefix string) error {
	if prefix == "" || strings.ContainsFunc(prefix, func(r rune) bool {
		return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-' || r == '_')
	}) {
		return usageError("ticket %q: want a ticket id or a prefix of one (letters, digits, - and _)", prefix)
	}
	return nil
}

// provablyAlive tells a holder that certainly still runs on this host.
func provablyAlive(t store.Ticket) (bool, string) {
	h := t.Holder
	if h.BootID != proc.BootID() || h.PidNS == 0 || h.PidNS != proc.PidNS() || h.Pid <= 0 {
		return false, ""
	}
	if proc.Identify(h.Pid, h.PidStart) != proc.Alive {
		if proc.JobRunning(t) {
			return true, fmt.Sprintf("its supervisor (pid %d) is gone but its job still runs in process group %d; slotctl reap stops it and frees the slot", h.Pid, h.Pgid)
		}
		return false, ""
	}
	return true, fmt.Sprintf("its holder %s (pid %d) is alive on this host", store.Printable(h.Command()), h.Pid)
}
