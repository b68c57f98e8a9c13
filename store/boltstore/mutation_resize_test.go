//go:build slotctl_mutations

package boltstore

import (
	"testing"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
)

// The resize mutations are in policy.PlanResize, which this store calls:
// with ResizePastWaiter a growth takes a free slot a waiter is waiting
// for; with ResizeOverSize it takes slots the limit does not have; without
// either it takes nothing.
func TestMutationResize(t *testing.T) {
	for _, c := range []struct {
		bug  mutation.Bug
		want int
	}{{"", 2}, {mutation.ResizePastWaiter, 3}, {mutation.ResizeOverSize, 2}} {
		var set mutation.Set
		if c.bug != "" {
			set = mutation.Of(c.bug)
		}
		s, _, _ := newTestStore(t, Options{Mutations: set})
		r := req("a", "cpu", 4)
		r.Weight = 2
		a := mustEnqueue(t, s, r)
		r = req("w", "cpu", 4)
		r.Weight = 3
		mustEnqueue(t, s, r) // waits: 2 free
		if got := mustResize(t, s, a, 3); got.Weighs() != c.want {
			t.Errorf("%q: a growth past a waiter ends at weight %d, want %d", c.bug, got.Weighs(), c.want)
		}
		b := mustEnqueue(t, s, req("b", "other", 2))
		want := 2
		if c.bug == mutation.ResizeOverSize {
			want = 5
		}
		if got := mustResize(t, s, b, 5); got.Weighs() != want {
			t.Errorf("%q: a growth to 5 in a limit of 2 ends at weight %d, want %d", c.bug, got.Weighs(), want)
		}
	}
}

// With ResizeNoSettle a shrink leaves the waiter it made room for waiting.
func TestMutationResizeNoSettle(t *testing.T) {
	for _, on := range []bool{false, true} {
		var set mutation.Set
		if on {
			set = mutation.Of(mutation.ResizeNoSettle)
		}
		s, _, _ := newTestStore(t, Options{Mutations: set})
		r := req("a", "cpu", 2)
		r.Weight = 2
		a := mustEnqueue(t, s, r)
		mustEnqueue(t, s, req("w", "cpu", 2))
		mustResize(t, s, a, 1)
		if got := mustGet(t, s, "w"); (got.State == store.Held) == on {
			t.Errorf("mutation %v: the waiter is %s after the shrink", on, got.State)
		}
	}
}
