package boltstore

import (
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
)

// FuzzFastState: reading the state without decoding must agree with the
// decoder on every record the store writes, and never disagree with it on
// anything else that decodes.
func FuzzFastState(f *testing.F) {
	f.Add("a", "build", "held", "make", "", "b1", int64(3600e9))
	f.Add("b-1_x", "x.y:z", "waiting", `say "state":"held"`, `"state":"held"`, `"deadline_boot":"x"`, int64(-5))
	f.Fuzz(func(t *testing.T, id, limit, state, arg, label, boot string, mono int64) {
		if store.CheckID(id) != nil || store.CheckLimitName(limit) != nil {
			return // the store refuses these before writing anything
		}
		r := ticketRec{V: formatVersion, ID: id, Limit: limit, State: store.State(state), Slot: -1,
			DeadlineBoot: boot, DeadlineMono: time.Duration(mono),
			Holder: store.Holder{Argv: []string{arg}, Label: label, Host: arg, User: label, BootID: boot}}
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
		if fx, ok := fastFields(v); ok && (fx.state != r.State || fx.boot != r.DeadlineBoot || fx.deadline != r.DeadlineMono) {
			t.Fatalf("fastFields(%s) = %+v, want %q %q %d", v, fx, r.State, r.DeadlineBoot, r.DeadlineMono)
		}
	})
}
