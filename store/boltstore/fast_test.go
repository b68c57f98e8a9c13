package boltstore

import (
	"slices"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// FuzzFastState: reading the state without decoding must agree with the
// decoder on every record the store writes, and never disagree with it on
// anything else that decodes.
func FuzzFastState(f *testing.F) {
	f.Add("a", "build", "", uint16(1), "held", "make", "", "b1", int64(3600e9))
	f.Add("b-1_x", "x.y:z", "db", uint16(2), "waiting", `say "state":"held"`, `"state":"held"`, `"deadline_boot":"x"`, int64(-5))
	f.Add("c", "x", "y", uint16(65535), "held", `"limits":["a","b"]`, `"weight":7`, "b1", int64(1))
	f.Fuzz(func(t *testing.T, id, limit, limit2 string, weight uint16, state, arg, label, boot string, mono int64) {
		limits := []string{limit}
		if limit2 != "" {
			limits = append(limits, limit2)
		}
		if store.CheckID(id) != nil || store.CheckLimits(limits) != nil || weight == 0 {
			return // the store refuses these before writing anything
		}
		r := ticketRec{V: formatVersion, Rec: policy.Rec{ID: id, Limit: limit, State: store.State(state), Slot: -1,
			DeadlineBoot: boot, DeadlineMono: time.Duration(mono),
			Holder: store.Holder{Argv: []string{arg}, Label: label, Host: arg, User: label, BootID: boot}}}
		if len(limits) > 1 || weight > 1 { // else stored without them, as version 1 did
			r.Limits, r.Weight = limits, int(weight)
		}
		if r.State == store.Held && r.Limits != nil {
			r.Slot, r.Indexes = 0, map[string][]int{}
			for _, l := range limits {
				for i := range int(weight) {
					r.Indexes[l] = append(r.Indexes[l], i)
				}
			}
		}
		v := encode(&r)
		got, ok := fastState(v)
		if r.State == store.Held || r.State == store.Waiting {
			if !ok || got != r.State {
				t.Fatalf("fastState(%s) = %q, %v; want %q", v, got, ok, r.State)
			}
		} else if ok {
			t.Fatalf("fastState(%s) = %q for state %q", v, got, r.State)
		}
		var back ticketRec
		if decode(v, &back) == nil && ok && back.State != got {
			t.Fatalf("fastState %q, decoder %q", got, back.State)
		}
		// fastFields may decline (then the caller decodes), never misread.
		fx, ok := fastFields(v)
		if ok && (fx.state != r.State || fx.boot != r.DeadlineBoot || fx.deadline != r.DeadlineMono || fx.weight != r.Weighs()) {
			t.Fatalf("fastFields(%s) = %+v, want %q %q %d weight %d", v, fx, r.State, r.DeadlineBoot, r.DeadlineMono, r.Weighs())
		}
		if ok && len(limits) > 1 && !slices.Equal(fx.limits, limits) || ok && len(limits) == 1 && fx.limits != nil {
			t.Fatalf("fastFields(%s) read limits %q, want %q", v, fx.limits, limits)
		}
	})
}
