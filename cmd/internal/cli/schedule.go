package cli

// Scheduling policies as the commands read and show them (docs/scheduling.md):
// limit set's --order, --aging and --rate, run's --priority and --share, and
// the policy and rate state in limit ls, ls, stats and the waiting line.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// policyFlags are limit set's policy flags as given (cobra says which were).
type policyFlags struct {
	order, aging, rate string
}

// addPolicyFlags defines limit set's --order, --aging and --rate.
func addPolicyFlags(cmd *cobra.Command, p *policyFlags) {
	fl := cmd.Flags()
	fl.StringVar(&p.order, "order", "", "how waiters are admitted, `ORDER`: fifo (arrival order, the default), priority (run --priority, aged) or fair (the share holding the fewest slots first)")
	fl.StringVar(&p.aging, "aging", "", "with --order priority: a waiter gains one point of priority per `DURATION` waited (default 1m)")
	fl.StringVar(&p.rate, "rate", "", "at most N admissions in any window of length D, as `N/D` (10/1m, 1/1h); 0 removes the rate")
	_ = cmd.RegisterFlagCompletionFunc("order", cobra.FixedCompletions([]string{"fifo", "priority", "fair"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("aging", cobra.FixedCompletions([]string{"30s", "1m", "10m"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("rate", cobra.FixedCompletions([]string{"10/1m", "1/1h", "0"}, cobra.ShellCompDirectiveNoFileComp))
}

// completeLimitSet completes limit set's NAME (the limits there are) and,
// after NAME SLOTS, the policy flags' names: cobra completes no flag after
// the first argument of a command whose flags stop there. (Their values
// are completed where cobra reads them, before NAME.)
func (f *Factory) completeLimitSet(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	switch {
	case len(args) == 0:
		return f.completeLimits(cmd, args, toComplete)
	case len(args) < 2:
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, fl := range []string{"--order", "--aging", "--rate"} {
		if strings.HasPrefix(fl, toComplete) && !slices.Contains(args[2:], fl) {
			out = append(out, fl)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// rateWant is what --rate accepts.
var rateWant = fmt.Sprintf("want N/DURATION, at most N admissions in any window of that length (10/1m, 1/1h: N 1-%d, DURATION %s to %s), or 0 for no rate",
	store.MaxRate, shortDuration(store.MinPer), shortDuration(store.MaxPer))

// change reads the flags cmd was given into a store.PolicyChange: nil
// parts are left as the limit has them.
func (p *policyFlags) change(cmd *cobra.Command) (store.PolicyChange, error) {
	var ch store.PolicyChange
	fl := cmd.Flags()
	if fl.Changed("order") {
		o := store.Order(p.order)
		switch o {
		case store.FIFO, store.ByPriority, store.Fair:
		default:
			return ch, usageError("--order %s: want fifo, priority or fair", quoteInput(p.order))
		}
		ch.Order = &o
	}
	if fl.Changed("aging") {
		d, err := time.ParseDuration(p.aging)
		if err != nil || d < time.Second || d > store.MaxPer {
			return ch, usageError("--aging %s: want a duration from %s to %s (one point of priority per AGING waited)",
				quoteInput(p.aging), shortDuration(time.Second), shortDuration(store.MaxPer))
		}
		if ch.Order != nil && *ch.Order != store.ByPriority {
			return ch, usageError("--aging %s with --order %s: aging applies to --order priority only", p.aging, p.order)
		}
		ch.Aging = &d
	}
	if fl.Changed("rate") {
		r, err := store.ParseRate(p.rate)
		if err != nil {
			return ch, usageError("--rate %s: %s", quoteInput(p.rate), rateWant)
		}
		ch.Rate = &r
	}
	return ch, nil
}

// changesPolicy reports whether ch changes anything.
func changesPolicy(ch store.PolicyChange) bool {
	return ch.Order != nil || ch.Aging != nil || ch.Rate != nil
}

// shortDuration is a bound as people write it: 1s, 168h.
func shortDuration(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	s = strings.TrimSuffix(s, "0m")
	if s == "" {
		return "0s"
	}
	return s
}

// checkRunPolicy checks run's --priority and --share (one line naming the
// input and what is accepted).
func (o *RunOptions) checkRunPolicy(shareSet bool) error {
	if store.CheckPriority(o.Priority) != nil {
		return usageError("--priority %d: want a whole number from %d to %d (higher goes first where the limit orders by priority)",
			o.Priority, store.MinPriority, store.MaxPriority)
	}
	if shareSet && (o.Share == "" || store.CheckShare(o.Share) != nil) {
		return usageError("--share %s: want 1-%d printable characters (what the run counts against in a fair limit; default: your user)",
			quoteInput(o.Share), store.MaxShare)
	}
	return nil
}

// policyCell is a limit's POLICY cell: its policy (store.Policy.String)
// and, when its rate is spent, when the next admission may be.
func policyCell(l store.Limit, now time.Time) string {
	s := l.Policy.String()
	if l.Opens.After(now) {
		s += " (spent, opens in " + human(ceilSecond(l.Opens.Sub(now))) + ")"
	}
	return s
}

// ceilSecond rounds d up to a whole second: a window that opens in 300ms
// does not open in "0s".
func ceilSecond(d time.Duration) time.Duration {
	return (d + time.Second - 1).Truncate(time.Second)
}

// anyPolicy reports whether a limit of limits has a policy other than FIFO:
// only then do the limit tables show a POLICY column.
func anyPolicy(limits []store.Limit) bool {
	for _, l := range limits {
		if !l.Policy.IsFIFO() {
			return true
		}
	}
	return false
}

// policyJSON is a limit's policy in limit ls, ls and stats -o json.
type policyJSON struct {
	Order        string    `json:"order"`         // fifo, priority or fair
	AgingSeconds *float64  `json:"aging_seconds"` // with order priority; else null
	Rate         *rateJSON `json:"rate"`          // null without a rate
}

// rateJSON is a limit's rate and its state at the snapshot's time.
type rateJSON struct {
	N          int     `json:"n"`
	PerSeconds float64 `json:"per_seconds"`
	// Left is how many admissions the rate allows now; OpensInSeconds,
	// when none, how long until the next one may be made (else 0).
	Left           int     `json:"left"`
	OpensInSeconds float64 `json:"opens_in_seconds"`
}

func policyJSONOf(l store.Limit, now time.Time) policyJSON {
	p := l.Policy
	out := policyJSON{Order: string(p.Ordered())}
	if p.Ordered() == store.ByPriority {
		out.AgingSeconds = ptr(seconds(p.AgingOr()))
	}
	if p.Rate.N > 0 {
		out.Rate = &rateJSON{N: p.Rate.N, PerSeconds: seconds(p.Rate.Per), Left: p.Tokens(l.Starts, now)}
		if l.Opens.After(now) {
			out.Rate.OpensInSeconds = seconds(l.Opens.Sub(now))
		}
	}
	return out
}

// rateWait is how long the k-th waiter of limit l (its place, 1-based)
// waits at least for l's rate, as of now; 0 without a rate.
func rateWait(l store.Limit, now time.Time, k int) time.Duration {
	if l.Policy.Rate.N == 0 || k < 1 {
		return 0
	}
	return max(l.Policy.Opens(l.Starts, now, k).Sub(now), 0)
}

// rateSpent is ", rate 2/3s spent" for a limit whose rate allows no
// admission now, else "": part of the waiting line's limit state.
func rateSpent(l store.Limit, now time.Time) string {
	if l.Opens.After(now) {
		return ", rate " + l.Policy.Rate.String() + " spent"
	}
	return ""
}

// priorityCell is a ticket's PRIO cell in ls: its effective priority while
// it waits in a limit that orders by priority, else "-".
func priorityCell(t store.Ticket) string {
	if t.Effective == nil {
		return "-"
	}
	return strconv.Itoa(*t.Effective)
}

// ordersOf is which orders the limits have.
func ordersOf(limits []store.Limit) map[store.Order]bool {
	out := map[store.Order]bool{}
	for _, l := range limits {
		out[l.Policy.Ordered()] = true
	}
	return out
}
