package cli

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestEscapeJSON(t *testing.T) {
	for _, s := range []string{"plain", "del\x7f", "nel\u0085 csi\u009b", "bidi\u202e", "tag\U000E0041", "ünï 日本 🙂", "bad\xff", "\x1b[2J\n\r\t"} {
		var b bytes.Buffer
		if err := writeJSONLine(&b, map[string]string{"v": s}); err != nil {
			t.Fatal(err)
		}
		for _, r := range b.String() {
			if r == 0x7f || r >= 0x80 && r < 0xa0 || r == 0x202e || r == 0xE0041 || r < 0x20 && r != '\n' {
				t.Errorf("%q: raw %U in %q", s, r, b.String())
			}
		}
		var got map[string]string
		if err := json.Unmarshal(b.Bytes(), &got); err != nil {
			t.Fatalf("%q: %s: %v", s, b.String(), err)
		}
		want := s
		if s == "bad\xff" {
			want = "bad\ufffd" // encoding/json's own replacement
		}
		if got["v"] != want {
			t.Errorf("%q: decodes to %q", s, got["v"])
		}
	}
	if got := string(escapeJSON([]byte(`{"v":"ünï"}`))); got != `{"v":"ünï"}` {
		t.Errorf("graphic text changed: %s", got)
	}
}

func TestEscapeControls(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain 'text' \\ ok", "plain 'text' \\ ok"},
		{"a\nb", "a b"},
		{"a\x1b[2Jb\r", `a\x1b[2Jb\r`},
		{"bidi\u202e", `bidi\u202e`},
		{"bad\xffbyte", `bad\xffbyte`},
	} {
		if got := escapeControls(c.in); got != c.want {
			t.Errorf("escapeControls(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
