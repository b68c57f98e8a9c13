package cli

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
)

// RunOptions are slotctl run's flags and arguments (docs/leases.md §2.1).
type RunOptions struct {
	Limit        string
	Slots        int
	SlotsSet     bool          // --slots was given: a different existing size is an error
	Wait         time.Duration // < 0: no bound
	BusyExitCode int
	TTL          time.Duration
	RenewEvery   time.Duration // 0: TTL/3
	OnLost       string        // kill or continue
	KillAfter    time.Duration
	MaxHold      time.Duration // 0: none
	Label        string
	Argv         []string
}

const (
	defaultTTL       = 30 * time.Second
	defaultKillAfter = 10 * time.Second
	minTTL           = time.Second
	maxTTL           = 24 * time.Hour
	// waiterPoll is a waiter's fallback poll: renewals (every TTL/3) wake
	// it when they see it admitted, so the poll is only the last resort.
	waiterPoll = 30 * time.Second
)

func newRunCmd(f *Factory, g *globalOptions, runF func(*RunOptions) error) *cobra.Command {
	opts := &RunOptions{}
	var noWait bool
	var wait string
	cmd := &cobra.Command{
		Use:   "run --limit NAME [flags] -- COMMAND [ARGS...]",
		Short: "Run a command once a slot of a limit is free",
		Long: `Run COMMAND once a slot of the limit is free, keeping the slot until it exits.

slotctl writes a waiting ticket, waits its turn in arrival order, starts
COMMAND with SLOTCTL_LIMIT, SLOTCTL_TICKET, SLOTCTL_FENCE, SLOTCTL_SLOT and
SLOTCTL_STORE in its environment, renews the ticket's lease while it runs, and
releases the slot when it has exited. A limit that does not exist is created
with --slots (else the config file's limits.NAME, else 1).

COMMAND also gets SLOTCTL_SUPERVISOR=PID:START:PIDNS, this slotctl's pid,
start time (clock ticks after boot) and pid namespace: with SLOTCTL_TICKET it
is how a reaper tells the job's processes, which it kills only once that
supervisor is gone, and how a nested slotctl run proves that its ancestor
holds the ticket. SLOTCTL_STORE_EXPORTED (the same value as SLOTCTL_STORE)
and SLOTCTL_STORE_BEFORE (what SLOTCTL_STORE held for this slotctl, absent if
unset) keep the exported SLOTCTL_STORE from choosing a nested slotctl's store:
while SLOTCTL_STORE equals SLOTCTL_STORE_EXPORTED, slotctl reads
SLOTCTL_STORE_BEFORE instead. SLOTCTL_ETCD_USERNAME and SLOTCTL_ETCD_PASSWORD
are removed from COMMAND's environment.

If the lease cannot be renewed before it would expire, --on-lost decides:
kill (the default) stops COMMAND and exits 76; continue warns and lets it run.
A COMMAND stopped for a lost lease gets SIGTERM and, TTL/20 later, SIGKILL,
whatever --kill-after says: the whole stop fits before the store could judge
the lease expired and hand the slot on.

EXIT STATUS
  COMMAND's exit status, or 128+N if it was killed by signal N
  64   usage error: bad flag, bad limit name, --slots disagrees with the limit
  69   the store cannot be opened or reached
  70   internal error
  75   not admitted within --wait (--busy-exit-code changes it)
  76   the lease was lost while COMMAND ran, and COMMAND was stopped
  124  --max-hold ran out and COMMAND was stopped
  126  COMMAND is not executable
  127  COMMAND was not found`,
		Example: `  # at most two builds at once, in arrival order
  slotctl run --limit build --slots 2 -- make -j8

  # cron: skip this run quietly if the previous one still holds the slot
  slotctl run --limit backup --no-wait --busy-exit-code 0 -- /usr/local/bin/backup

  # CI: wait at most ten minutes for a deploy slot
  slotctl run --limit deploy --wait 10m -- ./deploy.sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errArgs(cmd, "missing COMMAND: want slotctl run --limit NAME -- COMMAND [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Argv = args
			opts.SlotsSet = cmd.Flags().Changed("slots")
			if err := opts.resolve(f, cmd, wait, noWait); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			return runRun(cmd.Context(), f, g, opts)
		},
	}
	fl := cmd.Flags()
	fl.SetInterspersed(false) // slotctl run --limit x make -j8: -j8 is make's
	fl.StringVarP(&opts.Limit, "limit", "l", "", "name of the limit (required)")
	fl.IntVar(&opts.Slots, "slots", 1, "size of the limit when it is created (default: config limits.NAME, else 1)")
	fl.StringVar(&wait, "wait", "", "give up if not admitted within this duration (default: wait without bound; 0 = do not wait)")
	fl.BoolVar(&noWait, "no-wait", false, "do not wait: exit 75 at once if no slot is free")
	fl.IntVar(&opts.BusyExitCode, "busy-exit-code", exitBusy, "exit status when not admitted in time (0 for cron)")
	fl.DurationVar(&opts.TTL, "ttl", defaultTTL, "lease time-to-live: a dead holder's slot comes back after it (env SLOTCTL_TTL)")
	fl.DurationVar(&opts.RenewEvery, "renew-every", 0, "renewal period (default TTL/3, ±20% jitter)")
	fl.StringVar(&opts.OnLost, "on-lost", "kill", "when the lease is lost: kill (stop COMMAND, exit 76) or continue (warn)")
	fl.DurationVar(&opts.KillAfter, "kill-after", defaultKillAfter, "after stopping COMMAND with a signal, SIGKILL its process group after this long (on a lost lease: at most TTL/20)")
	fl.DurationVar(&opts.MaxHold, "max-hold", 0, "stop COMMAND and free the slot after this long (exit 124; default: no bound)")
	fl.StringVar(&opts.Label, "label", "", "text shown instead of the command line in ls (command lines can carry secrets)")
	_ = cmd.RegisterFlagCompletionFunc("limit", f.completeLimits)
	_ = cmd.RegisterFlagCompletionFunc("on-lost", cobra.FixedCompletions([]string{"kill", "continue"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// resolve validates the flags (docs/leases.md §7: one line naming the input and what
// would be accepted) and applies the config's limit sizes.
func (o *RunOptions) resolve(f *Factory, cmd *cobra.Command, wait string, noWait bool) error {
	if o.Limit == "" {
		return errArgs(cmd, "--limit is required: name the limit to run under, e.g. --limit build")
	}
	if err := checkLimitName("--limit", o.Limit); err != nil {
		return err
	}
	if err := checkLabel(o.Label); err != nil {
		return err
	}
	if err := store.CheckSlots(o.Slots); err != nil {
		return usageError("--slots %d: want 0..%d (0 pauses the limit)", o.Slots, store.MaxSlots)
	}
	if !o.SlotsSet {
		if n, ok := f.cfg.Limits[o.Limit]; ok {
			o.Slots = n
		}
	}
	var err error
	if o.Wait, err = parseWait(wait); err != nil {
		return err
	}
	if noWait {
		if wait != "" && o.Wait != 0 {
			return usageError("--no-wait and --wait %s disagree: pick one", wait)
		}
		o.Wait = 0
	}
	if o.BusyExitCode < 0 || o.BusyExitCode > 255 {
		return usageError("--busy-exit-code %d: want 0..255", o.BusyExitCode)
	}
	if err := checkDuration("ttl", o.TTL, minTTL, maxTTL); err != nil {
		return err
	}
	if o.RenewEvery != 0 {
		if err := checkDuration("renew-every", o.RenewEvery, 10*time.Millisecond, o.TTL/2); err != nil {
			return err
		}
	}
	if err := (renew.Options{TTL: o.TTL, Every: o.RenewEvery}).Validate(); err != nil {
		return usageError("--renew-every %s with --ttl %s: want a period well inside the ttl (at most ttl/2)", o.RenewEvery, o.TTL)
	}
	if o.OnLost != "kill" && o.OnLost != "continue" {
		return usageError("--on-lost %q: want kill or continue", o.OnLost)
	}
	if err := checkDuration("kill-after", o.KillAfter, 0, 0); err != nil {
		return err
	}
	if err := checkDuration("max-hold", o.MaxHold, 0, 0); err != nil {
		return err
	}
	return nil
}

// parseWait reads --wait: "" waits without bound (-1), else a duration >= 0.
func parseWait(wait string) (time.Duration, error) {
	if wait == "" {
		return -1, nil
	}
	d, err := time.ParseDuration(wait)
	if err != nil || d < 0 {
		return 0, usageError("--wait %q: want a duration such as 0, 30s or 10m", wait)
	}
	return d, nil
}

// runRun is slotctl run: the protocol is gate/holder's; here are the
// command, its messages, its status line and the real child.
func runRun(ctx context.Context, f *Factory, g *globalOptions, o *RunOptions) error {
	path, err := lookCommand(o.Argv[0])
	if err != nil {
		return err // before taking a slot: a typo must not wait its turn first
	}
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	log := newLogger(f, g)
	sigs := notifySignals()
	defer stopSignals(sigs)

	cfg := holder.Config{
		Store:     st,
		Signals:   sigs.C,
		Continue:  o.OnLost == "continue",
		KillAfter: o.KillAfter,
		MaxHold:   o.MaxHold,
		Now:       proc.Boottime,
	}
	if anc, ok := nestedTicket(ctx, f, log, st, o.Limit); ok {
		log.verbose("nested run: %q already holds slot %d of %q in this store; running under its ticket %s", anc.Holder.Command(), anc.Slot, o.Limit, short(anc.ID))
		c, err := startChild(f, path, o.Argv, nil, log)
		if err != nil {
			return err
		}
		cfg.Notify = runNotes(ctx, f, log, st, o)
		return outcomeErr(ctx, st, o, holder.Supervise(ctx, cfg, c))
	}

	// The keeper renews a waiting ticket every TTL/3 and nudges the wait
	// when a renewal shows it held (the renewal of a waiter settles its
	// limit): that covers a lost ring, so the fallback poll can be rare.
	cfg.Gate = gate.Gate{PollEvery: waiterPoll}
	cfg.Request = store.EnqueueRequest{ID: gate.NewID(), Limit: o.Limit, Slots: o.Slots, CheckSlots: o.SlotsSet, TTL: o.TTL, Holder: holderIdentity(f, o)}
	cfg.Wait = o.Wait
	cfg.Renew = renew.Options{TTL: o.TTL, Every: o.RenewEvery, WatchdogOnHold: true, Logf: log.info}
	cfg.Notify = runNotes(ctx, f, log, st, o)
	cfg.Start = func(_ context.Context, t store.Ticket) (holder.Child, error) {
		env := []string{
			"SLOTCTL_LIMIT=" + o.Limit,
			"SLOTCTL_TICKET=" + t.ID,
			"SLOTCTL_FENCE=" + strconv.FormatUint(t.Fence, 10),
			"SLOTCTL_SLOT=" + strconv.Itoa(t.Slot),
		}
		env = append(append(env, f.storeVars(st.String())...), supervisorVar()...)
		return startChild(f, path, o.Argv, env, log)
	}
	return outcomeErr(ctx, st, o, holder.Run(ctx, cfg))
}

// runNotes turns what the holder reports into slotctl run's messages and
// status line.
func runNotes(ctx context.Context, f *Factory, log *logger, st store.Store, o *RunOptions) func(holder.Note) {
	var status *statusLine
	var stopStatus context.CancelFunc
	return func(n holder.Note) {
		id := short(n.Ticket.ID)
		switch n.Kind {
		case holder.WaitStart:
			var sctx context.Context
			sctx, stopStatus = context.WithCancel(ctx)
			status = newStatusLine(f, log, st, o.Limit)
			status.start(sctx, n.Ticket)
		case holder.WaitUpdate:
			if status != nil {
				status.update(n.Ticket)
			}
		case holder.WaitEnd:
			if status != nil {
				stopStatus()
				status.stop()
				status = nil
			}
		case holder.Admitted:
			log.verbose("admitted to %q: slot %d, ticket %s, fence %d", o.Limit, n.Ticket.Slot, id, n.Ticket.Fence)
		case holder.LeaseLost:
			if o.OnLost == "kill" {
				log.warn("lease of limit %q lost (%v): stopping %s", o.Limit, n.Err, o.Argv[0])
			} else {
				log.warn("LEASE LOST for limit %q (%v): %s keeps running without a slot (--on-lost continue)", o.Limit, n.Err, o.Argv[0])
			}
		case holder.MaxHoldOut:
			log.warn("--max-hold %s ran out: stopping %s", o.MaxHold, o.Argv[0])
		case holder.Kill:
			log.warn("%s still running %s after being stopped: sending SIGKILL", o.Argv[0], n.After)
		case holder.RecordFailed:
			log.info("could not record the child's process group in ticket %s: %v", id, n.Err)
		case holder.LeaveFailed:
			log.warn("could not remove ticket %s: %v (it expires within %s)", id, n.Err, o.TTL)
		case holder.ReleaseFailed:
			log.warn("could not release ticket %s: %v (the slot comes back when its lease expires, within %s)", id, n.Err, o.TTL)
		case holder.AlreadyGone:
			log.warn("ticket %s was already gone (reaped or released by an operator): this run was not protected by the limit for part of its life", id)
		}
	}
}

// outcomeErr turns the holder's outcome into Main's error (docs/leases.md §3): the
// child's status passes through, 128+N for a signal.
func outcomeErr(ctx context.Context, st store.Store, o *RunOptions, out holder.Outcome) error {
	id := short(out.Ticket.ID)
	switch out.Result {
	case holder.Busy:
		return &ExitError{Code: o.BusyExitCode, Err: busyError(ctx, st, o.Limit, o.Wait == 0)}
	case holder.LostWaiting:
		return &ExitError{Code: exitLost, Err: fmt.Errorf("ticket %s for limit %q was lost while waiting: %w", id, o.Limit, out.Err)}
	case holder.LostBeforeStart:
		return &ExitError{Code: exitLost, Err: fmt.Errorf("lease of ticket %s lost before %s could start", id, o.Argv[0])}
	case holder.Signalled:
		return &ExitError{Code: 128 + signalNumber(out.Signal), Err: fmt.Errorf("%v while waiting for limit %q: left the queue", out.Signal, o.Limit)}
	case holder.Failed:
		return out.Err
	}
	switch {
	case out.Lost:
		return &ExitError{Code: exitLost}
	case out.MaxHold:
		return &ExitError{Code: exitMaxHold}
	case out.ExitErr != nil:
		return &ExitError{Code: exitInternal, Err: fmt.Errorf("wait for %s: %v", o.Argv[0], out.ExitErr)}
	case out.Exit.Signal != 0:
		return &ExitError{Code: 128 + int(out.Exit.Signal)}
	case out.Exit.Code != 0:
		return &ExitError{Code: out.Exit.Code}
	}
	return nil
}

// nestedTicket finds an ancestor's ticket on the same limit and store
// (docs/leases.md §2.1 item 8): a nested run must not wait for its own ancestor. The
// environment only names the ticket — any process can set SLOTCTL_TICKET —
// so the ticket must be held on this boot and in this pid namespace by a
// supervisor that is on this process's parent chain (pid and start time),
// the one SLOTCTL_SUPERVISOR names. Anything else is gated normally. (Only
// on Linux: elsewhere the parent chain is not read and the environment decides.)
func nestedTicket(ctx context.Context, f *Factory, log *logger, st store.Store, limit string) (store.Ticket, bool) {
	id := f.Getenv(proc.TicketVar)
	if id == "" || f.Getenv("SLOTCTL_LIMIT") != limit || f.Getenv(storeVar) != st.String() {
		return store.Ticket{}, false
	}
	t, err := st.Get(ctx, id)
	if err != nil || t.State != store.Held || t.Limit != limit {
		return store.Ticket{}, false
	}
	if !proc.AncestryKnown() {
		return t, true // elsewhere than Linux the environment alone decides (README)
	}
	h := t.Holder
	m, merr := proc.ParseMarker(f.Getenv(proc.SupervisorVar))
	switch {
	case merr != nil:
		log.verbose("%s names held ticket %s, but %s is missing or malformed (%v): waiting for a slot like any run", proc.TicketVar, short(id), proc.SupervisorVar, merr)
	case h.BootID != proc.BootID() || h.PidNS == 0 || h.PidNS != proc.PidNS() || m.PidNS != h.PidNS:
		log.verbose("ticket %s is held on another boot, host or pid namespace: not an ancestor's; waiting for a slot like any run", short(id))
	case m.Pid != h.Pid || m.Start != h.PidStart:
		log.verbose("ticket %s is held by pid %d, not by the supervisor %d that %s names: waiting for a slot like any run", short(id), h.Pid, m.Pid, proc.SupervisorVar)
	case !proc.IsAncestor(h.Pid, h.PidStart):
		log.verbose("ticket %s is held by pid %d, which is not an ancestor of this process: waiting for a slot like any run", short(id), h.Pid)
	default:
		return t, true
	}
	return store.Ticket{}, false
}

// holderIdentity is what the ticket records of this process (docs/leases.md §4.3).
func holderIdentity(f *Factory, o *RunOptions) store.Holder {
	if f.Identity != nil {
		h := f.Identity()
		h.Argv, h.Label = o.Argv, o.Label
		return h
	}
	return realIdentity(o)
}

// realIdentity is this process's own identity.
func realIdentity(o *RunOptions) store.Holder {
	h := store.Holder{BootID: proc.BootID(), PidNS: proc.PidNS(), Pid: os.Getpid(), Argv: o.Argv, Label: o.Label}
	h.Host, _ = os.Hostname()
	h.PidStart, _ = proc.StartTime(h.Pid)
	if u, err := user.Current(); err == nil {
		h.User = u.Username
	} else {
		h.User = strconv.Itoa(os.Getuid())
	}
	return h
}

// short is the short form of a ticket id shown to people.
func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// busyError says why a run was not admitted (printed even with --busy-exit-code 0, unless -q).
func busyError(ctx context.Context, st store.Store, limit string, noWait bool) error {
	held, slots := "?", "?"
	if snap, err := st.Snapshot(ctx, limit); err == nil && len(snap.Limits) == 1 {
		held, slots = strconv.Itoa(snap.Limits[0].Held), strconv.Itoa(snap.Limits[0].Slots)
	}
	if noWait {
		return fmt.Errorf("limit %q is full (%s/%s held)", limit, held, slots)
	}
	return fmt.Errorf("limit %q: not admitted within --wait (%s/%s held)", limit, held, slots)
}
