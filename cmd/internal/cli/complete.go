package cli

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// completionTimeout bounds a completion's store read: a shell must never hang on Tab.
const completionTimeout = 500 * time.Millisecond

// completionStore opens the store for a completion: cobra runs no pre-run
// hooks for __complete, so the config is read here, and any failure quietly
// means no suggestions. The returned func ends the context and closes the store.
func (f *Factory) completionStore(cmd *cobra.Command) (store.Store, context.Context, context.CancelFunc, bool) {
	if f.loadConfig(cmd) != nil {
		return nil, nil, nil, false
	}
	g := &globalOptions{StoreTimeout: completionTimeout}
	g.Store, _ = cmd.Flags().GetString("store")
	st, err := f.openStore(g)
	if err != nil {
		return nil, nil, nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	return st, ctx, func() { cancel(); st.Close() }, true
}

// completeLimits suggests limit names from the store and the config file.
func (f *Factory) completeLimits(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	return f.suggestLimits(cmd, args, toComplete)
}

// completeRunLimits completes each --limit of slotctl run: the limits not
// named by an earlier --limit (a limit named twice is refused).
func (f *Factory) completeRunLimits(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	given, _ := cmd.Flags().GetStringArray("limit")
	return f.suggestLimits(cmd, given, toComplete)
}

// suggestLimits is the limit names from the store and the config file that
// start with toComplete, less those in given.
func (f *Factory) suggestLimits(cmd *cobra.Command, given []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	seen := map[string]bool{}
	for _, a := range given {
		seen[a] = true
	}
	var out []string
	add := func(name string) {
		// A candidate is a line of cobra's output: only a valid name may be one.
		if !seen[name] && store.ValidLimitName(name) && strings.HasPrefix(name, toComplete) {
			seen[name] = true
			out = append(out, name)
		}
	}
	if st, ctx, cancel, ok := f.completionStore(cmd); ok {
		defer cancel()
		if snap, err := st.Snapshot(ctx); err == nil {
			for _, l := range snap.Limits {
				add(l.Name)
			}
		}
	}
	if f.cfg != nil {
		for name := range f.cfg.Limits {
			add(name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeTickets suggests live ticket ids, described by limit and command.
func (f *Factory) completeTickets(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	st, ctx, cancel, ok := f.completionStore(cmd)
	if !ok {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer cancel()
	snap, err := st.Snapshot(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	seen := map[string]bool{}
	for _, t := range snap.Tickets {
		// A candidate is a line of cobra's output, its description after a
		// tab: a valid id, and the description escaped. A ticket of several
		// limits is listed under each: offered once, naming them all.
		if strings.HasPrefix(t.ID, toComplete) && store.CheckID(t.ID) == nil && !seen[t.ID] {
			seen[t.ID] = true
			out = append(out, t.ID+"\t"+printableNames(t.Names())+" "+ticketState(t)+": "+store.Printable(t.Holder.Command()))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// printableNames is a ticket's limits joined by commas, escaped.
func printableNames(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = store.Printable(n)
	}
	return strings.Join(q, ",")
}

// signalContext ends on Ctrl-C or SIGTERM, for commands that run until stopped.
func signalContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

// completeRunKeys suggests the keys of the tickets in the run's limits
// (docs/leases.md §2.1 item 10): a new run of a branch names the key of its
// older runs.
func (f *Factory) completeRunKeys(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	limits, _ := cmd.Flags().GetStringArray("limit")
	var out []string
	if st, ctx, cancel, ok := f.completionStore(cmd); ok {
		defer cancel()
		if snap, err := st.Snapshot(ctx, limits...); err == nil {
			seen := map[string]bool{}
			for _, t := range snap.Tickets {
				// A candidate is a line of cobra's output: only a printable key may be one.
				if k := t.Key; k != "" && !seen[k] && store.IsPrintable(k) && !strings.ContainsAny(k, " \t") && strings.HasPrefix(k, toComplete) {
					seen[k] = true
					out = append(out, k)
				}
			}
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
