package store

import (
	"regexp"
	"strings"
	"testing"
)

// TestValidLimitName checks the hand-written check against SPEC §7's regexp.
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
