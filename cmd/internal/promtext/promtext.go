// Package promtext writes slotctl's metrics (slotctl metrics) in the Prometheus
// text exposition format.
//
// It is linked into slotctl-etcd only, never into slotctl (cmd/slotctl),
// which hands `slotctl metrics` to slotctl-etcd: protobuf's init, which
// client_model brings, would cost every run about 0.25 ms of start-up
// (README "Metrics and stats").
package promtext

import (
	"fmt"
	"io"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/slotctl/slotctl/store"
)

// Why expfmt (prometheus/common) and client_model: they are the reference
// encoder of the text exposition format (HELP and TYPE lines, label values
// escaped, histograms written from bucket counts as the store keeps them),
// and what promtool and every scraper parse. Their cost is protobuf's init
// in every slotctl process: about 0.27 ms (median of 41 runs, GODEBUG=inittrace=1)
// of a run -- true that takes ~8 ms, and 1.7 MB of binary. The lighter
// github.com/VictoriaMetrics/metrics costs 0.16 ms of init (it reads
// /proc/self/cgroup and the PSI files at init) but instruments a process
// rather than encoding values held elsewhere: it writes "# HELP name" with
// no text (promtool check metrics refuses that), leaves label escaping to
// the caller and cannot write a histogram from stored buckets; using it
// would mean writing the format by hand around it. README "Metrics and
// stats" has the figures and how to measure them again.

// The metric names, by Prometheus's conventions: a slotctl_limit_ prefix,
// the unit (_seconds, _slots, _tickets) and _total on counters.
const (
	Slots      = "slotctl_limit_slots"
	Held       = "slotctl_limit_held_slots"
	Waiting    = "slotctl_limit_waiting_tickets"
	Paused     = "slotctl_limit_paused"
	WaiterAge  = "slotctl_limit_oldest_waiter_age_seconds"
	HolderAge  = "slotctl_limit_oldest_holder_age_seconds"
	WaitTime   = "slotctl_limit_wait_seconds"
	HoldTime   = "slotctl_limit_hold_seconds"
	CounterFmt = "slotctl_limit_%s_total"

	// The scheduling policy (docs/scheduling.md): the order of every
	// limit; the aging of those that order by priority; the rate of those
	// that have one, and its state now.
	PolicyInfo = "slotctl_limit_policy_info"
	Aging      = "slotctl_limit_aging_seconds"
	RateN      = "slotctl_limit_rate_admissions"
	RatePer    = "slotctl_limit_rate_window_seconds"
	RateLeft   = "slotctl_limit_rate_remaining_admissions"
	RateOpens  = "slotctl_limit_rate_opens_in_seconds"
)

// Counters are the counter families: name (without slotctl_limit_ and
// _total), help, and the counter of store.Counts.
var Counters = []struct {
	name, help string
	value      func(c *store.Counts) uint64
}{
	{"admitted", "Runs admitted to the limit since it was created.", func(c *store.Counts) uint64 { return c.Admitted }},
	{"released", "Held runs that released their slots after their job exited.", func(c *store.Counts) uint64 { return c.Released }},
	{"cancelled", "Runs that gave up waiting (interrupted) before their job ran.", func(c *store.Counts) uint64 { return c.Cancelled }},
	{"busy", "Runs not admitted within --wait.", func(c *store.Counts) uint64 { return c.Busy }},
	{"superseded", "Waiting runs removed by a newer run of the same key (--supersede, --replace).", func(c *store.Counts) uint64 { return c.Superseded }},
	{"replaced", "Held runs asked to stop by a newer run of the same key (--replace).", func(c *store.Counts) uint64 { return c.Replaced }},
	{"reaped", "Tickets removed by a reap: lease expired or holder proven dead.", func(c *store.Counts) uint64 { return c.Reaped }},
	{"lost", "Runs whose holder presumed its lease lost.", func(c *store.Counts) uint64 { return c.Lost }},
	{"force_released", "Tickets an operator removed (slotctl release).", func(c *store.Counts) uint64 { return c.ForceReleased }},
}

// limitGauge is one limit's gauges, from a snapshot.
type limitGauge struct {
	slots, held, waiting   int
	waiterAge, holderAge   float64 // seconds; 0 when none
	oldestWait, oldestHeld time.Time
}

// gaugesOf reads each limit's gauges from snap: a ticket of several limits
// counts in each, where the snapshot lists it.
func gaugesOf(snap store.Snapshot) map[string]*limitGauge {
	out := make(map[string]*limitGauge, len(snap.Limits))
	for _, l := range snap.Limits {
		out[l.Name] = &limitGauge{slots: l.Slots, held: l.Held, waiting: l.Waiting}
	}
	for _, t := range snap.Tickets {
		g := out[t.Limit]
		if g == nil {
			continue
		}
		if t.State == store.Waiting {
			if g.oldestWait.IsZero() || t.Created.Before(g.oldestWait) {
				g.oldestWait = t.Created
			}
			continue
		}
		at := t.Admitted
		if at.IsZero() {
			at = t.Created
		}
		if g.oldestHeld.IsZero() || at.Before(g.oldestHeld) {
			g.oldestHeld = at
		}
	}
	for _, g := range out {
		if !g.oldestWait.IsZero() {
			g.waiterAge = max(snap.Now.Sub(g.oldestWait), 0).Seconds()
		}
		if !g.oldestHeld.IsZero() {
			g.holderAge = max(snap.Now.Sub(g.oldestHeld), 0).Seconds()
		}
	}
	return out
}

// metricFamilies are the families of slotctl metrics, each with one series
// per limit of snap (in its order, by name); counters and histograms for
// the limits counts has (a limit made between the two reads has none yet).
func metricFamilies(snap store.Snapshot, counts []store.Counts) []*dto.MetricFamily {
	gauges := gaugesOf(snap)
	byName := make(map[string]*store.Counts, len(counts))
	for i := range counts {
		byName[counts[i].Limit] = &counts[i]
	}
	gauge := func(name, help string, v func(g *limitGauge) float64) *dto.MetricFamily {
		fam := family(name, help, dto.MetricType_GAUGE)
		for _, l := range snap.Limits {
			fam.Metric = append(fam.Metric, &dto.Metric{Label: limitLabel(l.Name), Gauge: &dto.Gauge{Value: ptr(v(gauges[l.Name]))}})
		}
		return fam
	}
	fams := []*dto.MetricFamily{
		gauge(Slots, "Slots of the limit; 0 pauses admission.", func(g *limitGauge) float64 { return float64(g.slots) }),
		gauge(Held, "Slots of the limit held now (a ticket of weight N holds N).", func(g *limitGauge) float64 { return float64(g.held) }),
		gauge(Waiting, "Tickets waiting in the limit's queue.", func(g *limitGauge) float64 { return float64(g.waiting) }),
		gauge(Paused, "1 when the limit is paused (0 slots), else 0.", func(g *limitGauge) float64 {
			if g.slots == 0 {
				return 1
			}
			return 0
		}),
		gauge(WaiterAge, "Seconds the oldest waiting ticket has waited; 0 when none waits.", func(g *limitGauge) float64 { return g.waiterAge }),
		gauge(HolderAge, "Seconds since the longest-holding ticket was admitted; 0 when none holds.", func(g *limitGauge) float64 { return g.holderAge }),
	}
	fams = append(fams, policyFamilies(snap)...)
	for _, c := range Counters {
		fam := family(fmt.Sprintf(CounterFmt, c.name), c.help, dto.MetricType_COUNTER)
		for _, l := range snap.Limits {
			if n := byName[l.Name]; n != nil {
				fam.Metric = append(fam.Metric, &dto.Metric{Label: limitLabel(l.Name), Counter: &dto.Counter{Value: ptr(float64(c.value(n)))}})
			}
		}
		fams = append(fams, fam)
	}
	for _, h := range []struct {
		name, help string
		of         func(c *store.Counts) *store.Histogram
	}{
		{WaitTime, "How long admitted runs waited for their slots.", func(c *store.Counts) *store.Histogram { return &c.Wait }},
		{HoldTime, "How long runs held their slots, counted when their ticket was removed.", func(c *store.Counts) *store.Histogram { return &c.Hold }},
	} {
		fam := family(h.name, h.help, dto.MetricType_HISTOGRAM)
		for _, l := range snap.Limits {
			if n := byName[l.Name]; n != nil {
				fam.Metric = append(fam.Metric, &dto.Metric{Label: limitLabel(l.Name), Histogram: histogramOf(h.of(n))})
			}
		}
		fams = append(fams, fam)
	}
	return fams
}

// policyFamilies are the gauges of the limits' scheduling policies: a
// series per limit for the order, and for the aging and the rate only
// where the limit has them (a family without series is left out).
func policyFamilies(snap store.Snapshot) []*dto.MetricFamily {
	gauge := func(name, help string, v func(l store.Limit) (float64, bool)) *dto.MetricFamily {
		fam := family(name, help, dto.MetricType_GAUGE)
		for _, l := range snap.Limits {
			if x, ok := v(l); ok {
				fam.Metric = append(fam.Metric, &dto.Metric{Label: limitLabel(l.Name), Gauge: &dto.Gauge{Value: ptr(x)}})
			}
		}
		return fam
	}
	info := family(PolicyInfo, "1, with the order in which the limit admits its waiters: fifo, priority or fair.", dto.MetricType_GAUGE)
	for _, l := range snap.Limits {
		labels := append(limitLabel(l.Name), &dto.LabelPair{Name: ptr("order"), Value: ptr(string(l.Policy.Ordered()))})
		info.Metric = append(info.Metric, &dto.Metric{Label: labels, Gauge: &dto.Gauge{Value: ptr(1.0)}})
	}
	rated := func(l store.Limit) bool { return l.Policy.Rate.N > 0 }
	return []*dto.MetricFamily{
		info,
		gauge(Aging, "Where the limit orders by priority: the wait that gains a waiter one point of priority.", func(l store.Limit) (float64, bool) {
			return l.Policy.AgingOr().Seconds(), l.Policy.Ordered() == store.ByPriority
		}),
		gauge(RateN, "Where the limit has a rate: the admissions it allows in any window.", func(l store.Limit) (float64, bool) {
			return float64(l.Policy.Rate.N), rated(l)
		}),
		gauge(RatePer, "Where the limit has a rate: the length of its sliding window.", func(l store.Limit) (float64, bool) {
			return l.Policy.Rate.Per.Seconds(), rated(l)
		}),
		gauge(RateLeft, "Where the limit has a rate: the admissions it allows now.", func(l store.Limit) (float64, bool) {
			return float64(l.Policy.Tokens(l.Starts, snap.Now)), rated(l)
		}),
		gauge(RateOpens, "Where the limit has a rate: seconds until it allows the next admission; 0 while it allows one now.", func(l store.Limit) (float64, bool) {
			if !l.Opens.After(snap.Now) {
				return 0, rated(l)
			}
			return l.Opens.Sub(snap.Now).Seconds(), rated(l)
		}),
	}
}

// histogramOf turns the store's per-bucket counts into Prometheus's
// cumulative ones (le="+Inf" is the count, which expfmt writes).
func histogramOf(h *store.Histogram) *dto.Histogram {
	out := &dto.Histogram{SampleCount: ptr(h.Count), SampleSum: ptr(h.Sum)}
	var cum uint64
	for i, bound := range store.HistogramBounds {
		if i < len(h.Buckets) {
			cum += h.Buckets[i]
		}
		out.Bucket = append(out.Bucket, &dto.Bucket{UpperBound: ptr(bound), CumulativeCount: ptr(cum)})
	}
	return out
}

func family(name, help string, typ dto.MetricType) *dto.MetricFamily {
	return &dto.MetricFamily{Name: ptr(name), Help: ptr(help), Type: typ.Enum(), Metric: []*dto.Metric{}}
}

func limitLabel(name string) []*dto.LabelPair {
	return []*dto.LabelPair{{Name: ptr("limit"), Value: ptr(name)}}
}

func ptr[T any](v T) *T { return &v }

// Write encodes the families in the text format (version 0.0.4),
// leaving out those with no series (no limit at all: an empty output).
func Write(w io.Writer, snap store.Snapshot, counts []store.Counts) error {
	for _, fam := range metricFamilies(snap, counts) {
		if len(fam.Metric) == 0 {
			continue
		}
		if _, err := expfmt.MetricFamilyToText(w, fam); err != nil {
			return err
		}
	}
	return nil
}
