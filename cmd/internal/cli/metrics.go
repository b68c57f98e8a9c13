package cli

import (
	"bytes"
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// MetricsOptions are slotctl metrics's flags and arguments.
type MetricsOptions struct {
	Limits   []string
	Textfile string // "": stdout
}

func newMetricsCmd(f *Factory, g *globalOptions, runF func(*MetricsOptions) error) *cobra.Command {
	o := &MetricsOptions{}
	cmd := &cobra.Command{
		Use:   "metrics [LIMIT...]",
		Short: "Print the limits' gauges, counters and histograms for Prometheus",
		Long: `Print the store's state in the Prometheus text exposition format: per limit
its gauges (slots, held, waiting, paused, oldest waiter and holder, policy
and rate), counters of runs by outcome, and histograms of wait and hold times. --textfile writes
it atomically, for node_exporter's textfile collector.`,
		Annotations: manPage(`Print the store's state in the Prometheus text exposition format: per limit
its slots, held slots, waiting tickets, whether it is paused, and the age of
its oldest waiter and oldest holder, its order (slotctl_limit_policy_info),
and where it has them its aging, its rate, the admissions the rate allows
now and the seconds until it allows the next (gauges); how many runs were admitted,
released, cancelled, busy (not admitted within --wait), superseded, replaced,
reaped, lost and force-released since the limit was created (counters); and
how long runs waited and held their slots (histograms, in seconds).

The counters and histograms live in the store beside the tickets and change
in the same step as what they count: they never go backwards, survive
restarts and do not depend on the event log's pruning. Removing a limit
removes them.

--textfile PATH writes the file atomically (a temporary file in the same
directory, synced, then renamed over PATH; mode 0644), for node_exporter's
textfile collector: a reader sees the old file or the new one, never half.
The packaged slotctl-metrics.timer does that every minute.

EXIT STATUS
  0    written
  64   bad flag or limit name, no such limit, or --textfile cannot be written
  69   the store cannot be opened or reached`),
		Example: `  slotctl metrics
  slotctl metrics build --textfile /var/lib/prometheus/node-exporter/slotctl.prom
  slotctl metrics | promtool check metrics`,
		ValidArgsFunction: f.completeLimits,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Limits = args
			if err := checkLimitNames("limit", o.Limits); err != nil {
				return err
			}
			if cmd.Flags().Changed("textfile") {
				if err := checkTextfile(o.Textfile); err != nil {
					return err
				}
			}
			if runF != nil {
				return runF(o)
			}
			return runMetrics(cmd.Context(), f, g, o)
		},
	}
	cmd.Flags().StringVar(&o.Textfile, "textfile", "", "write to `PATH` atomically (for node_exporter's textfile collector) instead of stdout")
	return cmd
}

// runMetrics is slotctl metrics: one snapshot and the counters, encoded.
func runMetrics(ctx context.Context, f *Factory, g *globalOptions, o *MetricsOptions) error {
	if writeMetrics == nil {
		return execHelper("metrics", "the Prometheus encoder")
	}
	st, err := f.openStore(g)
	if err != nil {
		return err
	}
	defer st.Close()
	snap, err := store.Heads(ctx, st, o.Limits...) // its gauges need the heads only
	if err != nil {
		return err
	}
	counts, err := st.Counts(ctx, o.Limits...)
	if err != nil {
		return err
	}
	if o.Textfile == "" {
		return writeMetrics(f.IO.Out, snap, counts)
	}
	var b bytes.Buffer
	if err := writeMetrics(&b, snap, counts); err != nil {
		return err
	}
	return writeTextfile(o.Textfile, b.Bytes())
}

// MetricsWriter encodes a snapshot and the counters of its limits in the
// Prometheus text format (package promtext).
type MetricsWriter func(w io.Writer, snap store.Snapshot, counts []store.Counts) error

// writeMetrics is nil in slotctl, which hands `metrics` to slotctl-etcd.
var writeMetrics MetricsWriter

// RegisterMetrics links the Prometheus encoder in (slotctl-etcd). Call it
// before Main.
func RegisterMetrics(w MetricsWriter) { writeMetrics = w }
