package cli

import (
	"testing"
	"time"
)

func TestEstimateWait(t *testing.T) {
	m := time.Minute
	five := []time.Duration{4 * m, 2 * m, 3 * m, 10 * m, 3 * m} // median 3m
	for _, c := range []struct {
		name     string
		holds    []time.Duration
		elapsed  []time.Duration
		position int
		slots    int
		want     time.Duration
		ok       bool
	}{
		{"too few runs", five[:4], nil, 1, 1, 0, false},
		{"paused", five, nil, 1, 0, 0, false},
		{"no position", five, nil, 0, 1, 0, false},
		{"first, holder 1m in", five, []time.Duration{m}, 1, 1, 2 * m, true},
		{"third, one slot", five, []time.Duration{m}, 3, 1, 2*m + 3*m + 3*m, true},
		// past the median: the holds longer than 3m30s are 4m and 10m, so
		// 30s or 6m30s more: the lower median, 30s
		{"holder past the median", five, []time.Duration{3*m + 30*time.Second}, 1, 1, 30 * time.Second, true},
		{"holder past every recent hold: nothing to go by", five, []time.Duration{20 * m}, 1, 1, 0, false},
		// two slots, holders 1m and 2m in: they free at 2m and at 1m (the
		// holds above 2m less 2m: 1m, 1m, 2m, 8m); the waiters ahead take
		// those, and free them again at 4m and 5m.
		{"third, two slots", five, []time.Duration{m, 2 * m}, 3, 2, 4 * m, true},
		{"fourth, two slots", five, []time.Duration{m, 2 * m}, 4, 2, 5 * m, true},
		// a slot no one holds frees now (a heavier ticket ahead waits for two)
		{"free slot", five, []time.Duration{m}, 1, 2, 0, true},
		{"even count: lower median", []time.Duration{m, 2 * m, 3 * m, 4 * m, 5 * m, 6 * m}, nil, 2, 1, 3 * m, true},
	} {
		got, ok := estimateWait(c.holds, c.elapsed, c.position, c.slots)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: estimateWait = %v %v, want %v %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestApproxDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                 "~1s",
		400 * time.Millisecond:            "~1s",
		45 * time.Second:                  "~45s",
		59*time.Second + time.Millisecond: "~1m",
		4*time.Minute + 20*time.Second:    "~4m",
		2*time.Hour + 7*time.Minute:       "~2h10m",
		3 * time.Hour:                     "~3h",
		80 * time.Hour:                    "~3d",
	} {
		if got := approxDuration(d); got != want {
			t.Errorf("approxDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
