//go:build slotctl_mutations

package boltstore

import (
	"testing"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// The SupersedeHeld mutation is at its real location: with it a supersede
// removes the held ticket of its key too (the bug internal/testkit/sim must catch),
// without it the held one stays.
func TestMutationSupersedeHeld(t *testing.T) {
	for _, on := range []bool{false, true} {
		var set mutation.Set
		if on {
			set = mutation.Of(mutation.SupersedeHeld)
		}
		s, _, _ := newTestStore(t, Options{Mutations: set})
		mustEnqueue(t, s, kreq("h", "x", "main"))
		mustEnqueue(t, s, superseding(kreq("n", "x", "main")))
		if on {
			wantSuperseded(t, s, "h", "n")
			wantState(t, s, "n", store.Held)
		} else {
			wantState(t, s, "h", store.Held)
			wantState(t, s, "n", store.Waiting)
		}
	}
}
