package mutation_test

import (
	"testing"

	"github.com/slotctl/slotctl/internal/mutation"
)

// TestParse: with the tag, -mutations names bugs that Has then reports;
// without it, the empty list is the only one and Has is always false.
func TestParse(t *testing.T) {
	none, err := mutation.Parse("")
	if err != nil || none.Has(mutation.BlindReap) {
		t.Fatalf("Parse(\"\"): %v, %v; want no bug", none, err)
	}
	s, err := mutation.Parse("blind-reap, wall-clock")
	if !mutation.Enabled {
		if err == nil {
			t.Fatal("Parse of a bug name without the tag: no error")
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range mutation.All() {
		if want := b == mutation.BlindReap || b == mutation.WallClock; s.Has(b) != want {
			t.Errorf("Has(%s) = %v, want %v", b, s.Has(b), want)
		}
	}
	if got := mutation.String(s); got != "blind-reap,wall-clock" {
		t.Errorf("String = %q", got)
	}
	both, err := mutation.Parse("waiter-not-renewed,wall-clock,hold-and-wait,weight-ignored,barge-past-head")
	if err != nil {
		t.Fatal(err)
	}
	if got := mutation.String(mutation.InStore(both)); got != "wall-clock,weight-ignored,barge-past-head" {
		t.Errorf("InStore: %q, want wall-clock,weight-ignored,barge-past-head (the planner's bugs are the store's)", got)
	}
	newer, err := mutation.Parse("replace-beside,supersede-held")
	if err != nil {
		t.Fatal(err)
	}
	if got := mutation.String(mutation.InStore(newer)); got != "replace-beside,supersede-held" {
		t.Errorf("InStore: %q, want replace-beside,supersede-held (the planner's and the store's enqueue's)", got)
	}
	if _, err := mutation.Parse("no-such-bug"); err == nil {
		t.Error("Parse of an unknown name: no error")
	}
}
