package store

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestValidLimitName checks the hand-written check against docs/leases.md §7's regexp.
func TestValidLimitName(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	cases := []string{"", "a", "build", "B-1.x:y_z", "-x", ".x", "a/b", "a b", "é", strings.Repeat("a", 128), strings.Repeat("a", 129), "a\n", "x-"}
	for _, c := range cases {
		if got, want := ValidLimitName(c), re.MatchString(c); got != want {
			t.Errorf("ValidLimitName(%q) = %v, want %v", c, got, want)
		}
	}
}

func FuzzValidLimitName(f *testing.F) {
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	for _, s := range []string{"build", "-x", "a:b", strings.Repeat("z", 128)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidLimitName(s), re.MatchString(s); got != want {
			t.Errorf("ValidLimitName(%q) = %v, want %v", s, got, want)
		}
	})
}

func TestCommandQuotes(t *testing.T) {
	h := Holder{Argv: []string{"sh", "-c", "echo 'hi' $X", ""}}
	if got, want := h.Command(), `sh -c 'echo '\''hi'\'' $X' ''`; got != want {
		t.Errorf("Command() = %s, want %s", got, want)
	}
	if got := (Holder{Argv: []string{"x"}, Label: "nightly"}).Command(); got != "nightly" {
		t.Errorf("label not used: %s", got)
	}
}

func TestCheckRequest(t *testing.T) {
	ok := EnqueueRequest{ID: "aZ09_-", Limit: "build", Slots: 2, TTL: time.Second}
	if err := ok.Check(); err != nil {
		t.Fatalf("%+v: %v", ok, err)
	}
	if err := CheckID(strings.Repeat("i", 64)); err != nil {
		t.Errorf("a 64-character id: %v", err)
	}
	for _, bad := range []func(*EnqueueRequest){
		func(r *EnqueueRequest) { r.ID = "" },
		func(r *EnqueueRequest) { r.ID = "../x" },
		func(r *EnqueueRequest) { r.ID = strings.Repeat("i", 65) },
		func(r *EnqueueRequest) { r.Limit = "a b" },
		func(r *EnqueueRequest) { r.Slots = -1 },
		func(r *EnqueueRequest) { r.TTL = 0 },
	} {
		r := ok
		bad(&r)
		if err := r.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v; want ErrInvalid", r, err)
		}
	}
}
