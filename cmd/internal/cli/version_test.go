package cli

import "testing"

// go install ...@main stamps no commit; its pseudo-version names one.
func TestPseudoVersion(t *testing.T) {
	for _, c := range []struct{ v, rev, date string }{
		{"v0.0.0-20261129182144-bb471878d94c", "bb471878d94c", "2026-11-29T18:21:44Z"},
		{"v1.2.4-0.20261129182144-bb471878d94c", "bb471878d94c", "2026-11-29T18:21:44Z"},
		{"v1.3.0-rc.1.0.20261129182144-bb471878d94c", "bb471878d94c", "2026-11-29T18:21:44Z"},
		{"v1.2.3", "", ""},
		{"v0.0.0-20261399999999-bb471878d94c", "", ""}, // no such time
		{"(devel)", "", ""},
	} {
		rev, date, ok := pseudoVersion(c.v)
		if rev != c.rev || date != c.date || ok != (c.rev != "") {
			t.Errorf("pseudoVersion(%q) = %q, %q, %v; want %q, %q", c.v, rev, date, ok, c.rev, c.date)
		}
	}
}
