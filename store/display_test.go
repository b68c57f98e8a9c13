package store

import (
	"strconv"
	"strings"
	"testing"
)

func TestPrintable(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"make -j8 all", "make -j8 all"},
		{`grep 'a\|b' C:\build`, `grep 'a\|b' C:\build`}, // printable text is left alone, backslashes too
		{"nightly release — ünïcödé 日本語\u3000ok", "nightly release — ünïcödé 日本語\u3000ok"},
		{"nbsp\u00a0ok 🙂", "nbsp\u00a0ok 🙂"},
		{"a\x1b[2Jb", `"a\x1b[2Jb"`},
		{"x\nreaped 1234", `"x\nreaped 1234"`},
		{"cr\rover", `"cr\rover"`},
		{"tab\there", `"tab\there"`},
		{"nul\x00", `"nul\x00"`},
		{"del\x7f", `"del\x7f"`},
		{"c1 csi \u009b2J", `"c1 csi \u009b2J"`},
		{"nel\u0085", `"nel\u0085"`},
		{"bidi \u202egnp.exe", `"bidi \u202egnp.exe"`},
		{"isolate \u2066x\u2069", `"isolate \u2066x\u2069"`},
		{"line\u2028sep", `"line\u2028sep"`},
		{"bad \xff utf8", `"bad \xff utf8"`},
		{"soft\u00adhyphen", `"soft\u00adhyphen"`},
		{`"quoted"`, `"\"quoted\""`}, // a leading quote means quoted, always
		{`say "hi"`, `say "hi"`},
		{"a\x1b\\b\"", `"a\x1b\\b\""`},
	} {
		if got := Printable(c.in); got != c.want {
			t.Errorf("Printable(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

// Holder.Command stays the record's own text (the stores log it as is);
// display escapes it.
func TestHolderCommandRaw(t *testing.T) {
	h := Holder{Argv: []string{"printf", "\x1b[31m"}}
	if got := h.Command(); got != "printf '\x1b[31m'" {
		t.Errorf("Command() = %q", got)
	}
	if got := Printable(h.Command()); got != `"printf '\x1b[31m'"` {
		t.Errorf("Printable(Command()) = %s", got)
	}
}

// FuzzPrintable: whatever the input, the result is printable, and it is
// the input itself or a quoted form that unquotes to the input.
func FuzzPrintable(f *testing.F) {
	for _, s := range []string{"", "a", "\x1b[2J", "\"", "\"\x00", "\xff\xfe", "\u202e", "a\\x1b", "日本"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := Printable(s)
		if !IsPrintable(p) {
			t.Fatalf("Printable(%q) = %q holds a non-graphic character", s, p)
		}
		if strings.ContainsAny(p, "\n\r\t\x1b") {
			t.Fatalf("Printable(%q) = %q", s, p)
		}
		if p == s {
			if strings.HasPrefix(s, `"`) {
				t.Fatalf("Printable(%q) left a leading quote unquoted", s)
			}
			return
		}
		u, err := strconv.Unquote(p)
		if err != nil || u != s {
			t.Fatalf("Printable(%q) = %s: unquotes to %q, %v", s, p, u, err)
		}
	})
}

// TestNeedsQuotes: the table is strings.ContainsAny of the shell's
// special characters, on every byte and on longer text.
func TestNeedsQuotes(t *testing.T) {
	const special = " \t\n'\"\\$`!*?[]{}()<>|&;#~"
	for c := range 256 {
		for _, s := range []string{string(rune(c)), string([]byte{byte(c)}), "ab" + string([]byte{byte(c)}) + "cdefghij"} {
			if got, want := needsQuotes(s), strings.ContainsAny(s, special); got != want {
				t.Errorf("needsQuotes(%q) = %v, want %v", s, got, want)
			}
		}
	}
	if got := shellJoin([]string{"make", "", "it's", "a b", "é", "-j4"}); got != `make '' 'it'\''s' 'a b' é -j4` {
		t.Errorf("shellJoin = %s", got)
	}
}
