package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/cmd/internal/ping"
	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/renew"
	"github.com/slotctl/slotctl/store"
)

// RunOptions are slotctl run's flags and arguments (docs/leases.md §2.1).
type RunOptions struct {
	Limits       []string // in the order given; the first is the one SLOTCTL_SLOT and Position speak of
	Weight       int      // slots taken in each limit
	Slots        int
	SlotsSet     bool           // --slots was given: a different existing size is an error
	SlotsOf      map[string]int // the config's limits.NAME sizes of o.Limits, when --slots was not given
	Wait         time.Duration  // < 0: no bound
	BusyExitCode int
	TTL          time.Duration
	RenewEvery   time.Duration // 0: TTL/3
	OnLost       string        // kill or continue
	KillAfter    time.Duration
	MaxHold      time.Duration // 0: none
	Label        string
	// Newer runs first (docs/leases.md §2.1 item 10): the run's key, and
	// what it does to older runs of that key; MaxWaiting < 0: no bound.
	Key        string
	Supersede  bool
	Replace    bool
	MaxWaiting int
	// Priority and Share order the run in limits whose policy asks for
	// them (limit set --order priority, fair); Share "" is the user.
	Priority int
	Share    string
	// URL is the job's CI run: --url, else the CI's variables.
	URL string
	// Jobserver makes slotctl the child's GNU make jobserver, its tokens
	// the ticket's extra slots (docs/leases.md §2.1 item 12): in JobserverStyle,
	// up to JobserverMax slots (0: the limit's size, at most the host's CPUs).
	Jobserver      bool
	JobserverStyle string
	JobserverMax   int
	// Ping is --ping (or the config's ping:), the cron monitor told of the
	// run (docs/cron.md); monitor is it parsed, nil without one.
	Ping    string
	monitor *ping.Monitor
	// ProgressEvery is how often a waiting run prints a progress line
	// where stderr is not a terminal (docs/ci.md); 0: only the first.
	// progressEvery is --progress-every as given ("": the default).
	ProgressEvery time.Duration
	progressEvery string
	Argv          []string
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
		Use:         "run --limit NAME [--limit NAME...] [flags] -- COMMAND [ARGS...]",
		Short:       "Run a command once a slot of a limit is free",
		Long:        runLong,
		Annotations: manPage(runManPage),
		Example:     runExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errArgs(cmd, "missing COMMAND: want slotctl run --limit NAME -- COMMAND [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Argv = args
			if err := opts.resolveFlags(f, cmd, wait, noWait); err != nil {
				return err
			}
			if err := opts.resolveProgress(f, f.cfg == nil || !f.cfg.Filled["progress-every"]); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			return runRun(cmd.Context(), f, g, opts)
		},
	}
	addRunFlags(cmd, f, opts, &wait, &noWait)
	return cmd
}

// addRunFlags defines slotctl run's flags, into opts and, for --wait and
// --no-wait (which resolve reads together), into wait and noWait, with
// their completions: the flags are most of the command's definition.
func addRunFlags(cmd *cobra.Command, f *Factory, opts *RunOptions, wait *string, noWait *bool) {
	fl := cmd.Flags()
	fl.SetInterspersed(false) // slotctl run --limit x make -j8: -j8 is make's
	fl.StringArrayVarP(&opts.Limits, "limit", "l", nil, "name of the limit (required; repeat for several, admitted to all at once)")
	fl.IntVar(&opts.Weight, "weight", 1, "slots the run takes in each of its limits")
	fl.IntVar(&opts.Slots, "slots", 1, "size of each limit this run creates, unless the config file's limits.NAME sets it")
	fl.StringVar(wait, "wait", "", "give up if not admitted within this duration (default: wait without bound; 0 = do not wait)")
	fl.BoolVar(noWait, "no-wait", false, "do not wait: exit 75 at once if no slot is free")
	fl.IntVar(&opts.BusyExitCode, "busy-exit-code", exitBusy, "exit status when not admitted in time (0 for cron)")
	fl.DurationVar(&opts.TTL, "ttl", defaultTTL, "lease time-to-live: a dead holder's slot comes back after it (env SLOTCTL_TTL)")
	fl.DurationVar(&opts.RenewEvery, "renew-every", 0, "renewal period (default TTL/3, ±20% jitter)")
	fl.StringVar(&opts.OnLost, "on-lost", "kill", "when the lease is lost: kill (stop COMMAND, exit 76) or continue (warn)")
	fl.DurationVar(&opts.KillAfter, "kill-after", defaultKillAfter, "after stopping COMMAND with a signal, SIGKILL what is left of the job (COMMAND and everything it started) after this long (on a lost lease: at most TTL/20)")
	fl.DurationVar(&opts.MaxHold, "max-hold", 0, "stop COMMAND and free the slot after this long (exit 124; default: no bound)")
	fl.StringVar(&opts.Label, "label", "", "text shown instead of the command line in ls (command lines can carry secrets)")
	fl.StringVar(&opts.Key, "key", "", "the work this run does in its limits (a branch, an environment), for --supersede and --replace")
	fl.BoolVar(&opts.Supersede, "supersede", false, "remove the older waiting runs of the same --key (required): they exit 75 without running")
	fl.BoolVar(&opts.Replace, "replace", false, "like --supersede, and also stop the runs of the same --key (required) that hold a slot (they exit 143)")
	fl.IntVar(&opts.MaxWaiting, "max-waiting", -1, "exit 75 at once rather than wait behind N or more waiting runs of a limit (default: no bound)")
	fl.IntVar(&opts.Priority, "priority", 0, "where a limit orders by priority: `P` of -100..100, higher first (a waiter gains a point per --aging the limit sets)")
	fl.StringVar(&opts.Share, "share", "", "where a limit is fair: the `KEY` the run counts against (default: your user), e.g. a team or a project")
	fl.StringVar(&opts.URL, "url", "", "where the job comes from, shown by ls (default: the CI run's URL from its variables)")
	fl.StringVar(&opts.Ping, "ping", "", "cron monitor URL told when COMMAND starts and ends, or that it was skipped (healthchecks.io, Cronitor)")
	fl.StringVar(&opts.progressEvery, "progress-every", "", "while waiting, print a line this often saying who holds the slots, when stderr is not a terminal (default: 30s in CI, else off; 0 = off)")
	addJobserverFlags(cmd, opts)
	_ = cmd.RegisterFlagCompletionFunc("key", f.completeRunKeys)
	_ = cmd.RegisterFlagCompletionFunc("url", cobra.NoFileCompletions)
	_ = cmd.RegisterFlagCompletionFunc("priority", cobra.FixedCompletions([]string{"-10", "0", "10", "50"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("share", cobra.NoFileCompletions)
	_ = cmd.RegisterFlagCompletionFunc("ping", cobra.NoFileCompletions)
	_ = cmd.RegisterFlagCompletionFunc("progress-every", cobra.FixedCompletions([]string{"30s", "1m", "0"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("max-waiting", cobra.FixedCompletions([]string{"0", "1"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("limit", f.completeRunLimits)
	_ = cmd.RegisterFlagCompletionFunc("on-lost", cobra.FixedCompletions([]string{"kill", "continue"}, cobra.ShellCompDirectiveNoFileComp))
}

// runLong is slotctl run's help.
const runLong = `Run COMMAND once a slot of each --limit is free, and keep the slot until
COMMAND exits. Runs wait their turn in arrival order, or in the limit's
order (slotctl limit set --order: --priority, --share). A limit that does not
exist is created with --slots (else the config file's limits.NAME, else 1).
Should the job or its machine die, the slot comes back within --ttl.

Exits with COMMAND's status, else 75 when not admitted in time, 76 when the
lease was lost, 124 when --max-hold ran out, 143 when replaced (--replace).`

// runManPage is slotctl run's man page, after the help.
const runManPage = `Run COMMAND once a slot of the limit is free, keeping the slot until it exits.

slotctl writes a waiting ticket, waits its turn (in arrival order, unless a
limit has another order: see below), starts
COMMAND with SLOTCTL_LIMIT, SLOTCTL_TICKET, SLOTCTL_FENCE, SLOTCTL_SLOT,
SLOTCTL_SLOTS and SLOTCTL_STORE in its environment, renews the ticket's lease
while it runs, and releases the slot when it has exited. A limit that does not exist is created
with --slots (else the config file's limits.NAME, else 1).

--limit may be repeated: the run is admitted to all of its limits in one step
or to none, and never holds one while it waits for another. --weight N makes
it take N slots of each. The queue's order holds across limits: a ticket
ahead of it in any of its limits goes first, so a heavy run at the head is
not overtaken by lighter ones. SLOTCTL_LIMIT is then the names joined by commas,
SLOTCTL_SLOT the lowest slot index in the first limit, and SLOTCTL_SLOTS the
indexes held in each, e.g. "build=0 db=2,3".

Newer runs first: --key names the work a run does in its limits (a branch,
an environment). With --supersede a new run removes the older WAITING runs
of the same key that share a limit with it: they exit 75 at once, naming
the run that took their place, and their COMMAND never runs. --replace also
asks the runs of the key that HOLD a slot to stop: each stops its COMMAND as
for a lost lease (SIGTERM, SIGKILL after --kill-after), releases and exits
143, and the new run is admitted only after that, never beside them.
--max-waiting N refuses (exit 75) a run that would wait behind N or more
waiting runs of one of its limits. --url records where the job comes from
(default: the CI's variables: GITHUB_SERVER_URL/GITHUB_REPOSITORY/actions/
runs/GITHUB_RUN_ID, CI_JOB_URL, BUILDKITE_BUILD_URL, BUILD_URL), shown by
ls -o wide and the waiting and busy messages.

Scheduling: a limit admits its waiters in arrival order unless slotctl
limit set gave it another order (docs/scheduling.md). Where it orders by
priority, --priority P (-100..100, default 0) puts the run ahead of lower
priorities; every waiter gains a point for each of the limit's --aging it
has waited, so a low priority waits but never starves. Where it is fair,
--share KEY (default: the user) is what the run counts against: the share
holding the fewest slots of the limit goes first. A limit's --rate N/D
admits at most N runs in any window of length D; the waiting line's
estimate says when the window opens. A run of several limits is admitted
only when it is first in each of them.

--ping URL (or ping: in the config file) tells a cron monitor about the
run, in healthchecks.io's conventions: URL/start when COMMAND starts, and
URL/N once the slot is released, N being the status slotctl exits with; a
run that is not admitted (busy, queue full, superseded) sends only URL/log,
naming the runs that held the slots, so a skipped run is not taken for a
missing one. Each carries the ticket as rid, written as a UUID. A URL on
cronitor.link speaks Cronitor's telemetry instead: state=run, then
state=complete or state=fail with status_code, or state=ok with a message,
the ticket as series. A ping gives up after 3s and slotctl waits 5s at
most for its last ones: they never delay COMMAND or the release, and a
failed ping is one warning line, never the exit status.

Waiting in CI: where stderr is not a terminal, a waiting run prints one
line when it begins to wait and then, every --progress-every (default 30s
when CI, GITHUB_ACTIONS, GITLAB_CI, BUILDKITE, JENKINS_URL or TF_BUILD says
it runs in CI, else never; 0 turns the lines off; progress-every: in the
config file), a line saying how long it has waited, its place in each
limit's queue, the estimate, and who holds the slots: their CI run's URL,
else their command, pid and host. With GITLAB_CI=true the lines are a
collapsed section of the job log. With GITHUB_STEP_SUMMARY set, a wait
that ends (admitted, not admitted within --wait, refused, superseded)
appends a Markdown section to that file: how long it waited, who held the
slots and who was ahead, linked to their runs; a file that cannot be
written costs one warning line, never the run. -q prints no waiting lines;
the summary is written all the same.

--jobserver makes slotctl COMMAND's GNU make jobserver: COMMAND's MAKEFLAGS
gets -jN and --jobserver-auth, and each token the build takes beyond its
first job is one more slot of the limit(s), taken while slots are free and
nobody waits, given back when the build returns the token and other runs
wait (or another build sharing the limit has less than its fair share).
Run make without -j. --jobserver-style pipe (GNU make 4.2 and later,
cargo) passes two descriptors; fifo (make 4.4 and later, cargo 1.95 and
later, ninja 1.13 and later) a FIFO in a private directory. The default,
auto, asks make, cargo or ninja for its version and takes the style it
reads (pipe when both), pipe for any other command; a style the client is
known not to read (make 4.3 and cargo 1.65 ignore a FIFO) is refused, exit
64, before the run waits. --jobserver-max N bounds the slots (default: the limit's size,
at most the host's CPU count, since any member can resize a shared limit).
The extra slots are the ticket's weight: ls shows it, they are renewed and
released with the ticket, and a crash frees them all.

A nested slotctl run (one started by COMMAND) on limits its ancestor's ticket
holds runs at once under that ticket; it waits only for the limits the
ancestor's ticket does not hold.

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
  64   usage error: bad flag, bad limit name, the same limit twice, --slots
       disagrees with the limit, --weight above a limit's size
  69   the store cannot be opened or reached
  70   internal error
  75   not admitted within --wait, a --max-waiting queue was full, or a
       newer run of the --key superseded this one before COMMAND ran
       (--busy-exit-code changes it)
  76   the lease was lost while COMMAND ran, and COMMAND was stopped
  124  --max-hold ran out and COMMAND was stopped
  143  a newer run of the --key asked with --replace to stop COMMAND, and
       it was stopped
  126  COMMAND is not executable
  127  COMMAND was not found

EXAMPLES
  # a build slot and a database slot at once; a heavy job takes two of four
  slotctl run --limit build --limit db -- ./integration-tests
  slotctl run --limit build --slots 4 --weight 2 -- make -j16

  # deploy: stop the running deploy of this environment and take its place
  slotctl run --limit deploy --key prod --replace -- ./deploy.sh prod`

// runExample are slotctl run's examples.
const runExample = `  # at most two builds at once, in arrival order
  slotctl run --limit build --slots 2 -- make -j8

  # cron: skip this run quietly if the previous one still holds the slot
  slotctl run --limit backup --no-wait --busy-exit-code 0 -- /usr/local/bin/backup

  # CI: wait at most ten minutes for a deploy slot
  slotctl run --limit deploy --wait 10m -- ./deploy.sh

  # branches share the limit ci; each keeps only its newest pending run
  slotctl run --limit ci --key "$GITHUB_REF_NAME" --supersede -- make test

  # builds share 8 slots of the host's cpu budget: make without -j
  slotctl run --limit cpu --slots 8 --jobserver -- make`

// resolveFlags reads and checks every flag of addRunFlags (slotctl run's,
// and slotctl acquire's, which takes the same).
func (o *RunOptions) resolveFlags(f *Factory, cmd *cobra.Command, wait string, noWait bool) error {
	o.SlotsSet = cmd.Flags().Changed("slots")
	if cmd.Flags().Changed("max-waiting") && o.MaxWaiting < 0 {
		return usageError("--max-waiting %d: want 0 or more", o.MaxWaiting)
	}
	if err := o.resolveNewer(f, cmd.Flags().Changed("key"), cmd.Flags().Changed("url")); err != nil {
		return err
	}
	if err := o.checkRunPolicy(cmd.Flags().Changed("share")); err != nil {
		return err
	}
	if err := o.resolve(f, cmd, wait, noWait); err != nil {
		return err
	}
	if err := o.resolveJobserver(cmd); err != nil {
		return err
	}
	return o.resolvePing(f, cmd.Flags().Changed("ping") && (f.cfg == nil || !f.cfg.Filled["ping"]))
}

// resolve validates the flags (docs/leases.md §7: one line naming the input and what
// would be accepted) and applies the config's limit sizes.
func (o *RunOptions) resolve(f *Factory, cmd *cobra.Command, wait string, noWait bool) error {
	if err := o.checkLimits(cmd); err != nil {
		return err
	}
	if o.Weight < 1 || o.Weight > store.MaxSlots {
		return usageError("--weight %d: want 1..%d (the slots taken in each limit)", o.Weight, store.MaxSlots)
	}
	if err := checkLabel(o.Label); err != nil {
		return err
	}
	if err := o.resolveSlots(f); err != nil {
		return err
	}
	if err := o.resolveWait(wait, noWait); err != nil {
		return err
	}
	if o.BusyExitCode < 0 || o.BusyExitCode > 255 {
		return usageError("--busy-exit-code %d: want 0..255", o.BusyExitCode)
	}
	return o.checkLease()
}

// checkLimits checks the --limit flags: at least one, at most
// store.MaxLimits, each a valid name given once.
func (o *RunOptions) checkLimits(cmd *cobra.Command) error {
	if len(o.Limits) == 0 || len(o.Limits) == 1 && o.Limits[0] == "" {
		return errArgs(cmd, "--limit is required: name the limit to run under, e.g. --limit build")
	}
	if len(o.Limits) > store.MaxLimits {
		return usageError("--limit given %d times: want at most %d limits", len(o.Limits), store.MaxLimits)
	}
	for i, name := range o.Limits {
		if err := checkLimitName("--limit", name); err != nil {
			return err
		}
		if contains(o.Limits[:i], name) {
			return usageError("--limit %q given twice: name each limit once", name)
		}
	}
	return nil
}

// resolveSlots checks --slots and, without it, takes the sizes of the
// run's limits from the config (SlotsOf; Slots is the first limit's).
func (o *RunOptions) resolveSlots(f *Factory) error {
	if err := store.CheckSlots(o.Slots); err != nil {
		return usageError("--slots %d: want 0..%d (0 pauses the limit)", o.Slots, store.MaxSlots)
	}
	if o.SlotsSet {
		// --slots sizes every limit, existing ones included (a different
		// size is a conflict), so a weight above it can never be admitted.
		if err := store.CheckWeightFits("", o.Slots, o.Weight); err != nil {
			return usageError("--weight %d is more than --slots %d: want a weight of 1..%d", o.Weight, o.Slots, o.Slots)
		}
		return nil
	}
	for _, name := range o.Limits {
		if n, ok := f.cfg.Limits[name]; ok {
			if o.SlotsOf == nil {
				o.SlotsOf = map[string]int{}
			}
			o.SlotsOf[name] = n
		}
	}
	if n, ok := o.SlotsOf[o.Limits[0]]; ok {
		o.Slots = n
	}
	return nil
}

// resolveWait reads --wait and --no-wait into Wait: they may not disagree.
func (o *RunOptions) resolveWait(wait string, noWait bool) error {
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
	return nil
}

// checkLease checks the flags of the lease and of stopping the job:
// --ttl, --renew-every (a period that can keep the lease), --on-lost,
// --kill-after and --max-hold.
func (o *RunOptions) checkLease() error {
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
	return checkDuration("max-hold", o.MaxHold, 0, 0)
}

// resolveNewer checks --key, --supersede, --replace, --max-waiting and
// --url (docs/leases.md §7: one line naming the input), and fills URL from
// the CI's variables when --url is not given.
func (o *RunOptions) resolveNewer(f *Factory, keySet, urlSet bool) error {
	if keySet {
		if o.Key == "" {
			return usageError("--key '': want 1-%d printable characters (a branch, an environment)", store.MaxKey)
		}
		if store.CheckKey(o.Key) != nil {
			return usageError("--key %s: want 1-%d printable characters (a branch, an environment)", quoteInput(o.Key), store.MaxKey)
		}
	}
	// Without a key the request would match every keyless ticket of the
	// limits: any member could stop or drop everyone else's runs.
	if !keySet && (o.Supersede || o.Replace) {
		flag := "--supersede"
		if o.Replace {
			flag = "--replace"
		}
		return usageError("%s needs --key KEY: it acts only on the runs of the same key (1-%d printable characters)", flag, store.MaxKey)
	}
	if urlSet {
		if store.CheckURL(o.URL) != nil {
			return usageError("--url %s: want at most %d printable characters", quoteInput(o.URL), store.MaxURL)
		}
		return nil
	}
	o.URL = ciURL(f.Getenv)
	return nil
}

// quoteInput shows a bad input on one line: quoted, escaped, cut short.
func quoteInput(s string) string {
	const max = 80
	if len(s) > max {
		return strconv.Quote(s[:max]) + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return strconv.Quote(s)
}

// ciURL is the job's CI run from the CI's own variables: GitHub Actions',
// else GitLab's CI_JOB_URL, Buildkite's BUILDKITE_BUILD_URL, Jenkins'
// BUILD_URL; "" when there is none or it is not a URL slotctl can record
// (too long, control characters).
func ciURL(getenv func(string) string) string {
	url := ""
	switch {
	case getenv("GITHUB_RUN_ID") != "" && getenv("GITHUB_REPOSITORY") != "":
		server := getenv("GITHUB_SERVER_URL")
		if server == "" {
			server = "https://github.com"
		}
		url = strings.TrimRight(server, "/") + "/" + getenv("GITHUB_REPOSITORY") + "/actions/runs/" + getenv("GITHUB_RUN_ID")
	case getenv("CI_JOB_URL") != "":
		url = getenv("CI_JOB_URL")
	case getenv("BUILDKITE_BUILD_URL") != "":
		url = getenv("BUILDKITE_BUILD_URL")
	case getenv("BUILD_URL") != "":
		url = getenv("BUILD_URL")
	}
	if store.CheckURL(url) != nil {
		return ""
	}
	return url
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
	if o.Jobserver {
		style, err := chooseJobserverStyle(o.JobserverStyle, probeJobClient(ctx, o.Argv[0], path))
		if err != nil {
			return err
		}
		o.JobserverStyle = string(style)
	}
	if err := f.checkEtcdLease(g, o.TTL, o.RenewEvery); err != nil {
		return err
	}
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	log := newLogger(f, g)
	sigs := notifySignals()
	if !f.ExitAfterMain {
		defer stopSignals(sigs)
	}

	cfg := holder.Config{
		Store:     st,
		Signals:   sigs.C,
		Continue:  o.OnLost == "continue",
		KillAfter: o.KillAfter,
		MaxHold:   o.MaxHold,
		Now:       proc.Boottime,
	}
	limits := o.Limits // what this run waits for: all of its limits, or those its ancestor does not hold
	anc, held, nested := nestedTicket(ctx, f, log, st, o)
	if nested {
		if len(held) == len(o.Limits) {
			return runUnderAncestor(ctx, f, log, st, o, cfg, path, anc)
		}
		limits = without(o.Limits, held)
		log.verbose("nested run: %q already holds %s in this store (ticket %s); waiting only for %s", anc.Holder.Command(), heldSlots(anc, held), short(anc.ID), limitsPhrase(limits))
	}
	// The keeper renews a waiting ticket every TTL/3 and nudges the wait
	// when a renewal shows it held (the renewal of a waiter settles its
	// limit): that covers a lost ring, so the fallback poll can be rare.
	cfg.Gate = gate.Gate{PollEvery: waiterPoll, WatchHolders: proc.WatchHolders}
	cfg.Request = runRequest(f, o, limits)
	cfg.Wait = o.Wait
	cfg.Renew = renew.Options{TTL: o.TTL, Every: o.RenewEvery, WatchdogOnHold: true, Logf: log.info}
	if o.RenewEvery == 0 { // an explicit period is kept while waiting too
		cfg.Renew.WaitEvery = renew.WaitPeriod(o.TTL, o.TTL/3)
	}
	pings := &runPings{m: o.monitor, log: log}
	summary := newWaitSummary(ctx, f, log, st, o, limits) // GitHub Actions' step summary (progress.go)
	cfg.Notify = summary.notify(pings.notify(runNotes(ctx, f, log, st, o, limits)))
	unmark := func() {} // the job's marker, removed once holder.Run has released
	defer func() { unmark() }()
	early := guardEarly(f, o, &cfg)
	defer early.drop()
	cfg.Start = func(jobCtx context.Context, t store.Ticket) (holder.Child, error) {
		env := jobVars(o.Limits, t, anc, held, st.String(), f)
		unmark = markJob(st, log, t.ID, env)
		if o.Jobserver {
			return startJobserved(jobCtx, f, st, log, o, path, env, t)
		}
		if pj := early.take(); pj != nil {
			return startPrepared(f, pj, path, o.Argv, env, log)
		}
		return startChild(f, path, o.Argv, env, log)
	}
	out := holder.Run(ctx, cfg)
	err = outcomeErr(ctx, st, o, limits, out)
	summary.finish(out, err)
	pings.finish(ctx, st, limits, cfg.Request.ID, out, err) // after the release: the next run never waits for a ping
	return err
}

// guardEarly starts the guard of the job of cfg's request as the run
// enqueues (earlyGuard), and has cfg's Notify end it should the run wait
// further back than next in line, where it would only sit idle. A jobserver's
// job is started apart: nil.
func guardEarly(f *Factory, o *RunOptions, cfg *holder.Config) *earlyGuard {
	if o.Jobserver {
		return nil
	}
	early := startEarlyGuard(f, append([]string{proc.TicketVar + "=" + cfg.Request.ID}, supervisorVar()...))
	notify := cfg.Notify
	cfg.Notify = func(n holder.Note) {
		if n.Kind == holder.WaitStart && n.Ticket.Position != 1 {
			early.drop() // the next in line keeps it: its handoff is what it saves
		}
		if notify != nil {
			notify(n)
		}
	}
	return early
}

// runUnderAncestor runs a nested run whose ancestor's ticket anc holds all
// of its limits: at once, under that ticket, with no ticket of its own,
// watched as any job (holder.Supervise). cfg is the run's, with no
// request; path is the command's.
func runUnderAncestor(ctx context.Context, f *Factory, log *logger, st store.Store, o *RunOptions, cfg holder.Config, path string, anc store.Ticket) error {
	log.verbose("nested run: %q already holds %s in this store; running under its ticket %s", anc.Holder.Command(), heldSlots(anc, o.Limits), short(anc.ID))
	if o.Jobserver {
		log.verbose("nested run: --jobserver: MAKEFLAGS left as the ancestor's run set it (its jobserver serves this build too)")
	}
	c, err := startChild(f, path, o.Argv, nil, log)
	if err != nil {
		return err
	}
	// No ticket of its own: the rid is an id of this run alone.
	id := gate.NewID()
	pings := &runPings{m: o.monitor, log: log}
	pings.started(id)
	cfg.Notify = runNotes(ctx, f, log, st, o, o.Limits)
	out := holder.Supervise(ctx, cfg, c)
	err = outcomeErr(ctx, st, o, o.Limits, out)
	pings.finish(ctx, st, o.Limits, id, out, err)
	return err
}

// runRequest is the ticket a run asks for in limits (all of its limits,
// or those a nested run waits for): its identity, size, weight, the
// config's sizes of the limits it creates and its newer-runs-first flags.
func runRequest(f *Factory, o *RunOptions, limits []string) store.EnqueueRequest {
	req := store.EnqueueRequest{ID: gate.NewID(), Slots: o.sizeOf(limits[0]), CheckSlots: o.SlotsSet, TTL: o.TTL, Holder: holderIdentity(f, o),
		Key: o.Key, Supersede: o.Supersede || o.Replace, Replace: o.Replace, Priority: o.Priority, Share: o.Share}
	if o.MaxWaiting >= 0 {
		n := o.MaxWaiting
		req.MaxWaiting = &n
	}
	if len(limits) == 1 {
		req.Limit = limits[0] // the one-limit request as before
	} else {
		req.Limits = limits
		for _, name := range limits[1:] { // the config's size of each limit this run creates
			if n := o.sizeOf(name); n != req.Slots {
				if req.Sizes == nil {
					req.Sizes = map[string]int{}
				}
				req.Sizes[name] = n
			}
		}
	}
	if o.Weight > 1 {
		req.Weight = o.Weight
	}
	return req
}

// jobVars are the SLOTCTL_* variables of a child running under ticket t
// (docs/leases.md §2.1 and its item 9). A nested run that waited only for
// some of its limits (held: those its ancestor's ticket anc holds) shows
// its own ticket, and the ancestor's indexes in the limits it shares.
func jobVars(limits []string, t, anc store.Ticket, held []string, storeURL string, f *Factory) []string {
	in := func(name string) []int {
		if contains(held, name) {
			return anc.In(name)
		}
		return t.In(name)
	}
	first := in(limits[0])
	slot := t.Slot
	if len(first) > 0 {
		slot = first[0]
	}
	env := []string{
		"SLOTCTL_LIMIT=" + strings.Join(limits, ","),
		"SLOTCTL_TICKET=" + t.ID,
		"SLOTCTL_FENCE=" + strconv.FormatUint(t.Fence, 10),
		"SLOTCTL_SLOT=" + strconv.Itoa(slot),
		"SLOTCTL_SLOTS=" + slotsVar(limits, in),
	}
	return append(append(env, f.storeVars(storeURL)...), supervisorVar()...)
}

// slotsVar is SLOTCTL_SLOTS, as store.Ticket.SlotsVar writes it, with the
// indexes of each limit from in.
func slotsVar(limits []string, in func(string) []int) string {
	var b []byte
	for i, name := range limits {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, name...)
		b = append(b, '=')
		for j, ix := range in(name) {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(ix), 10)
		}
	}
	return string(b)
}

// plural is "1 slot", "2 slots".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// sizeOf is the size a limit this run creates gets: --slots, else the
// config's limits.NAME, else 1.
func (o *RunOptions) sizeOf(name string) int {
	if o.SlotsSet {
		return o.Slots
	}
	if n, ok := o.SlotsOf[name]; ok {
		return n
	}
	return 1
}

// weightError is a weight above a limit's size, said in the run's words.
func weightError(e *store.WeightError) error {
	return &ExitError{Code: exitUsage,
		Err:  fmt.Errorf("--weight %d is more than the %s of limit %q: want a weight of 1..%d", e.Weight, plural(e.Slots, "slot"), e.Limit, e.Slots),
		Hint: fmt.Sprintf("or resize it: slotctl limit set %s %d", e.Limit, e.Weight)}
}

// heldSlots says what an ancestor's ticket holds of limits: "slot 0 of \"n\"",
// or "build=0 db=2,3".
func heldSlots(t store.Ticket, limits []string) string {
	if len(limits) == 1 && len(t.In(limits[0])) == 1 {
		return fmt.Sprintf("slot %d of %q", t.In(limits[0])[0], limits[0])
	}
	return "slots " + slotsVar(limits, t.In)
}

// limitsPhrase names limits in a message: limit "a", or limits "a", "b".
func limitsPhrase(limits []string) string {
	if len(limits) == 1 {
		return fmt.Sprintf("limit %q", limits[0])
	}
	q := make([]string, len(limits))
	for i, l := range limits {
		q[i] = strconv.Quote(l)
	}
	return "limits " + strings.Join(q, ", ")
}

// without is list less the names in drop, in order.
func without(list, drop []string) []string {
	var out []string
	for _, x := range list {
		if !contains(drop, x) {
			out = append(out, x)
		}
	}
	return out
}

// waitTrimAfter is how long a run waits before it gives its start-up's
// memory back: not at once, so that a wait of a moment costs no GC.
const waitTrimAfter = time.Second

// waitMemoryLimit bounds the heap while a run waits with the collector off:
// a waiter then wakes for nothing, not even the runtime's collection every
// two minutes (which halves a quiet waiter's idle cost), and a long wait's
// few allocations are still collected at this size.
const waitMemoryLimit = 24 << 20

// runNotes turns what the holder reports into slotctl run's messages and
// status line.
//
// limits are the request's: all of the run's, or those a nested run waits for.
func runNotes(ctx context.Context, f *Factory, log *logger, st store.Store, o *RunOptions, limits []string) func(holder.Note) {
	w := &runWait{ctx: ctx, f: f, log: log, st: st, limits: limits, ci: ciWaitOf(f, o)}
	return func(n holder.Note) {
		switch n.Kind {
		case holder.WaitStart:
			w.start(n.Ticket)
		case holder.WaitUpdate:
			w.update(n.Ticket)
		case holder.WaitEnd:
			w.end()
		default:
			logRunNote(log, o, limits, n)
		}
	}
}

// runWait is slotctl run's wait for a slot: its status line, and the
// runtime's settings it lowers while it waits, kept to be put back.
type runWait struct {
	ctx    context.Context
	f      *Factory
	log    *logger
	st     store.Store
	limits []string
	ci     ciWait // its lines in CI (progress.go)

	status     *statusLine
	stopStatus context.CancelFunc
	trim       *time.Timer
	procs      int // GOMAXPROCS before the wait
	gcPercent  int
	memLimit   int64
}

// start shows the status line of the waiting ticket t and makes the
// waiting process cheap.
func (w *runWait) start(t store.Ticket) {
	var sctx context.Context
	sctx, w.stopStatus = context.WithCancel(w.ctx)
	w.status = newStatusLine(w.f, w.log, w.st, w.limits)
	w.status.ci = w.ci
	w.status.start(sctx, t)
	// A run that waits gives back the memory its start-up used: a
	// queue of hundreds of waiters costs each one's private pages
	// (the goal is 10 MB a waiter at most, docs/leases.md §8).
	w.trim = time.AfterFunc(waitTrimAfter, debug.FreeOSMemory)
	// One P while it waits: a renewal's goroutines then run on
	// the thread that woke, not handed to another (about a fifth
	// of an idle waiter's CPU).
	w.procs = runtime.GOMAXPROCS(1)
	w.gcPercent, w.memLimit = debug.SetGCPercent(-1), debug.SetMemoryLimit(waitMemoryLimit)
}

// update shows a fresh read of the waiting ticket.
func (w *runWait) update(t store.Ticket) {
	if w.status != nil {
		w.status.update(t)
	}
}

// end puts the runtime's settings back for the job and takes the status
// line down.
func (w *runWait) end() {
	if w.trim != nil {
		w.trim.Stop()
		runtime.GOMAXPROCS(w.procs)
		debug.SetGCPercent(w.gcPercent)
		debug.SetMemoryLimit(w.memLimit)
	}
	if w.status != nil {
		w.stopStatus()
		w.status.stop()
		w.status = nil
	}
}

// logRunNote says what the holder reports, other than the wait's notes:
// one message for each that slotctl run tells its user of (with -v for
// some); limits are the request's.
func logRunNote(log *logger, o *RunOptions, limits []string, n holder.Note) {
	id := short(n.Ticket.ID)
	switch n.Kind {
	case holder.Admitted:
		if n.Ticket.Multi() {
			log.verbose("admitted to %s: slots %s, ticket %s, fence %d", limitsPhrase(limits), n.Ticket.SlotsVar(), id, n.Ticket.Fence)
		} else {
			log.verbose("admitted to %q: slot %d, ticket %s, fence %d", limits[0], n.Ticket.Slot, id, n.Ticket.Fence)
		}
	case holder.LeaseLost:
		if o.OnLost == "kill" {
			log.warn("lease of %s lost (%v): stopping %s", limitsPhrase(limits), n.Err, o.Argv[0])
		} else {
			log.warn("LEASE LOST for %s (%v): %s keeps running without a slot (--on-lost continue)", limitsPhrase(limits), n.Err, o.Argv[0])
		}
	case holder.MaxHoldOut:
		log.warn("--max-hold %s ran out: stopping %s", o.MaxHold, o.Argv[0])
	case holder.Kill:
		log.warn("%s still running %s after being stopped: sending SIGKILL", o.Argv[0], n.After)
	case holder.Leftover:
		log.verbose("%s exited; processes it started still run: stopping them before the release", o.Argv[0])
	case holder.StoreBusy:
		log.verbose("%v: trying again", n.Err)
	case holder.NotGone:
		log.warn("processes of %s still there %s after SIGKILL (stuck in the kernel?): releasing anyway", o.Argv[0], n.After)
	case holder.RecordFailed:
		log.info("could not record the child's process group in ticket %s: %v", id, n.Err)
	case holder.LeaveFailed:
		log.warn("could not remove ticket %s: %v (it expires within %s)", id, n.Err, o.TTL)
	case holder.ReleaseFailed:
		log.warn("could not release ticket %s: %v (the slot comes back when its lease expires, within %s)", id, n.Err, o.TTL)
	case holder.Replaced:
		log.verbose("%s: stopping %s", replacedBy(n.Ticket.Stop), o.Argv[0]) // the exit says it once (an error is one line)
	case holder.AlreadyGone:
		log.warn("ticket %s was already gone (reaped or released by an operator): this run was not protected by the limit for part of its life", id)
	}
}

// outcomeErr turns the holder's outcome into Main's error (docs/leases.md §3): the
// child's status passes through, 128+N for a signal.
func outcomeErr(ctx context.Context, st store.Store, o *RunOptions, limits []string, out holder.Outcome) error {
	id := short(out.Ticket.ID)
	switch out.Result {
	case holder.Busy:
		return &ExitError{Code: o.BusyExitCode, Err: busyError(ctx, st, limits, o.Weight, o.Wait == 0)}
	case holder.LostWaiting:
		return &ExitError{Code: exitLost, Err: fmt.Errorf("ticket %s for %s was lost while waiting: %w", id, limitsPhrase(limits), out.Err)}
	case holder.LostBeforeStart:
		return &ExitError{Code: exitLost, Err: fmt.Errorf("lease of ticket %s lost before %s could start", id, o.Argv[0])}
	case holder.Signalled:
		left := "left the queue"
		if out.Ticket.ID == "" {
			left = "it had not reached the store, which stayed locked"
		} else if out.LeaveErr != nil { // said above (LeaveFailed)
			left = fmt.Sprintf("its ticket %s stays in the queue until its lease expires", id)
		}
		return &ExitError{Code: 128 + signalNumber(out.Signal), Err: fmt.Errorf("%v while waiting for %s: %s", out.Signal, limitsPhrase(limits), left)}
	case holder.Superseded:
		return &ExitError{Code: o.BusyExitCode, Err: fmt.Errorf("superseded by ticket %s: %s did not run", successorPhrase(out.By), o.Argv[0])}
	case holder.Failed:
		var heavy *store.WeightError
		if errors.As(out.Err, &heavy) {
			return weightError(heavy)
		}
		var full *store.QueueFullError
		if errors.As(out.Err, &full) {
			return &ExitError{Code: o.BusyExitCode, Err: queueFullError(ctx, st, full)}
		}
		return out.Err
	}
	switch {
	case out.Replaced != nil:
		return &ExitError{Code: exitReplaced, Err: errors.New(replacedBy(out.Replaced))}
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

// nestedTicket finds an ancestor's ticket on some of the run's limits in
// the same store (docs/leases.md §2.1 and its item 9): a nested run must not
// wait for its own ancestor. held are the run's limits that ticket holds, in
// the run's order; the run waits only for the others. The environment only
// names the ticket — any process can set SLOTCTL_TICKET — so the ticket must
// be held on this boot and in this pid namespace by a supervisor that is on
// this process's parent chain (pid and start time), the one
// SLOTCTL_SUPERVISOR names. Anything else is gated normally. (Only on Linux:
// elsewhere the parent chain is not read and the environment decides.)
//
// A nested run heavier than its ancestor in a shared limit still runs under
// the ancestor's ticket there: it could only get more of that limit by
// waiting for slots its own ancestor holds, for ever (README).
func nestedTicket(ctx context.Context, f *Factory, log *logger, st store.Store, o *RunOptions) (store.Ticket, []string, bool) {
	id := f.Getenv(proc.TicketVar)
	if id == "" || !overlaps(strings.Split(f.Getenv("SLOTCTL_LIMIT"), ","), o.Limits) || f.Getenv(storeVar) != st.String() {
		return store.Ticket{}, nil, false
	}
	t, err := st.Get(ctx, id)
	if err != nil || t.State != store.Held {
		return store.Ticket{}, nil, false
	}
	var held []string
	for _, name := range o.Limits {
		if contains(t.Names(), name) {
			held = append(held, name)
		}
	}
	if len(held) == 0 {
		return store.Ticket{}, nil, false
	}
	if !proc.AncestryKnown() {
		return t, nestedHeld(log, t, held, o.Weight), true // elsewhere than Linux the environment alone decides (README)
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
	case !proc.IsAncestor(h.Pid, h.PidStart) && f.Getenv(keeperVar) != "":
		// A later step of a pipeline that acquired the slot: said plainly,
		// since the wait lasts until the release step.
		log.info("ticket %s of %s is held by slotctl acquire's keeper, not by an ancestor of this run: this run waits for a slot of its own (the steps before slotctl release hold the slot already)", short(id), limitsPhrase(held))
	case !proc.IsAncestor(h.Pid, h.PidStart):
		log.verbose("ticket %s is held by pid %d, which is not an ancestor of this process: waiting for a slot like any run", short(id), h.Pid)
	default:
		return t, nestedHeld(log, t, held, o.Weight), true
	}
	return store.Ticket{}, nil, false
}

// nestedHeld says with -v when the nested run is heavier than its
// ancestor's ticket in the limits they share, and returns held.
func nestedHeld(log *logger, t store.Ticket, held []string, weight int) []string {
	if weight > t.Weighs() {
		log.verbose("nested run: --weight %d is more than the %s ticket %s holds in %s: running under that ticket there (taking more would wait for the ancestor's own slots)", weight, plural(t.Weighs(), "slot"), short(t.ID), limitsPhrase(held))
	}
	return held
}

// overlaps reports whether a and b share a name.
func overlaps(a, b []string) bool {
	for _, x := range a {
		if contains(b, x) {
			return true
		}
	}
	return false
}

// holderIdentity is what the ticket records of this process (docs/leases.md §4.3).
func holderIdentity(f *Factory, o *RunOptions) store.Holder {
	if f.Identity != nil {
		h := f.Identity()
		h.Argv, h.Label, h.URL = store.CutArgv(shownArgv(o.Argv)), o.Label, o.URL
		return h
	}
	return realIdentity(o)
}

// realIdentity is this process's own identity.
func realIdentity(o *RunOptions) store.Holder {
	h := store.Holder{BootID: proc.BootID(), PidNS: proc.PidNS(), Pid: os.Getpid(), Argv: store.CutArgv(shownArgv(o.Argv)), Label: o.Label, URL: o.URL}
	h.Host, _ = os.Hostname()
	h.PidStart, _ = proc.StartTime(h.Pid)
	if u, err := user.Current(); err == nil {
		h.User = u.Username
	} else {
		h.User = strconv.Itoa(os.Getuid())
	}
	return h
}

// successorPhrase names a newer run: "ID (host H, pid P, URL)", escaped.
func successorPhrase(s store.Successor) string {
	var b strings.Builder
	b.WriteString(store.Printable(s.Ticket))
	b.WriteString(" (host ")
	b.WriteString(store.Printable(s.Host))
	fmt.Fprintf(&b, ", pid %d", s.Pid)
	if s.URL != "" {
		b.WriteString(", ")
		b.WriteString(store.Printable(s.URL))
	}
	b.WriteString(")")
	return b.String()
}

// replacedBy is the message of a holder stopped by --replace.
func replacedBy(s *store.Successor) string {
	if s == nil {
		return "replaced by a newer run"
	}
	return "replaced by ticket " + successorPhrase(*s)
}

// queueFullError is a --max-waiting refusal: the limit, its waiting count
// and the runs holding it (with their CI URLs).
func queueFullError(ctx context.Context, st store.Store, e *store.QueueFullError) error {
	msg := fmt.Sprintf("limit %q already has %d waiting (--max-waiting %d): not queued", e.Limit, e.Waiting, e.Max)
	if snap, err := store.Heads(ctx, st, e.Limit); err == nil {
		if h := holdersPhrase(snap, e.Limit); h != "" {
			msg += "; held by " + h
		}
	}
	return errors.New(msg)
}

// holdersPhrase names the runs holding limit in snap: their ticket, host,
// pid and URL, at most three.
func holdersPhrase(snap store.Snapshot, limit string) string {
	var parts []string
	n := 0
	for _, t := range snap.Tickets {
		if t.Limit != limit || t.State != store.Held {
			continue
		}
		n++
		if n <= 3 {
			parts = append(parts, successorPhrase(store.Successor{Ticket: short(t.ID), Host: t.Holder.Host, Pid: t.Holder.Pid, URL: t.Holder.URL}))
		}
	}
	if n > 3 {
		parts = append(parts, fmt.Sprintf("%d more", n-3))
	}
	return strings.Join(parts, ", ")
}

// short is the short form of a ticket id shown to people.
func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// busyError says why a run was not admitted (printed even with
// --busy-exit-code 0, unless -q). A run of several limits names those that
// kept it out: too few free slots for its weight, or older waiters.
func busyError(ctx context.Context, st store.Store, limits []string, weight int, noWait bool) error {
	if len(limits) == 1 && weight == 1 {
		held, slots, spent, urls := "?", "?", "", ""
		if snap, err := store.Heads(ctx, st, limits[0]); err == nil && len(snap.Limits) == 1 {
			held, slots = strconv.Itoa(snap.Limits[0].Held), strconv.Itoa(snap.Limits[0].Slots)
			spent, urls = rateSpent(snap.Limits[0], snap.Now), heldByURLs(snap, limits)
		}
		if noWait {
			return fmt.Errorf("limit %q is full (%s/%s held%s)%s", limits[0], held, slots, spent, urls)
		}
		return fmt.Errorf("limit %q: not admitted within --wait (%s/%s held%s)%s", limits[0], held, slots, spent, urls)
	}
	what := limitsPhrase(limits)
	if weight > 1 {
		what += fmt.Sprintf(" (weight %d)", weight)
	}
	why := "?"
	if snap, err := store.Heads(ctx, st, limits...); err == nil {
		var blocked []string
		for _, l := range snap.Limits {
			if l.Slots-l.Held < weight || l.Waiting > 0 || l.Opens.After(snap.Now) {
				blocked = append(blocked, limitState(l, snap.Now))
			}
		}
		if len(blocked) > 0 {
			why = "no room in " + strings.Join(blocked, ", ")
		} else {
			why = "room came free just now"
		}
		why += heldByURLs(snap, limits)
	}
	return multiBusy(what, why, noWait)
}

func multiBusy(what, why string, noWait bool) error {
	if noWait {
		return fmt.Errorf("%s: %s", what, why)
	}
	return fmt.Errorf("%s: not admitted within --wait (%s)", what, why)
}

// heldByURLs is "; held by ID (host H, pid P, URL), ..." for the holders of
// limits in snap that come from a CI run (Holder.URL), or
// "" when none does: the busy message points at the run to look at.
func heldByURLs(snap store.Snapshot, limits []string) string {
	seen := map[string]bool{}
	var parts []string
	for _, t := range snap.Tickets {
		if t.State != store.Held || t.Holder.URL == "" || seen[t.ID] || !contains(limits, t.Limit) {
			continue
		}
		seen[t.ID] = true
		if len(parts) < 3 {
			parts = append(parts, successorPhrase(store.Successor{Ticket: short(t.ID), Host: t.Holder.Host, Pid: t.Holder.Pid, URL: t.Holder.URL}))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; held by " + strings.Join(parts, ", ")
}

// limitState is one limit in a busy or waiting message at now: "build"
// 2/2 held, and its waiters and a spent rate if any.
func limitState(l store.Limit, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%q ", l.Name)
	if l.Slots == 0 {
		b.WriteString("(paused: 0 slots")
	} else {
		fmt.Fprintf(&b, "(%d/%d held", l.Held, l.Slots)
	}
	if l.Waiting > 0 {
		fmt.Fprintf(&b, ", %d waiting", l.Waiting)
	}
	b.WriteString(rateSpent(l, now))
	b.WriteString(")")
	return b.String()
}
