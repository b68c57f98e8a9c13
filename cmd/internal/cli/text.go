package cli

// Text from the store on its way out (docs/leases.md §4.5): a record may hold any
// bytes, written by a member of the store's group or an older slotctl, and
// what slotctl prints from it must never drive a terminal or forge a line
// of output (root's ls, the reaper's journal). Every field of a record is
// shown through store.Printable where it is printed; the functions here are
// the nets under that (one per kind of output) and the check of --label.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/slotctl/slotctl/store"
)

// shortID is a ticket id as shown to people: its first 8 bytes, printable.
func shortID(id string) string { return store.Printable(short(id)) }

// escapeControls is the net under every message slotctl prints on stderr:
// a newline becomes a space (a message is one line) and any other
// non-graphic character its Go escape (\x1b, \u202e), so that a message
// that quotes stored text without store.Printable still cannot carry it raw.
// Printable text, the normal case, is returned as it is.
func escapeControls(s string) string {
	if store.IsPrintable(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\n':
			b.WriteByte(' ')
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !strconv.IsGraphic(r):
			q := strconv.QuoteRuneToGraphic(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// checkLabel refuses a --label that is not printable text (docs/leases.md §7: bad
// input is refused where it enters, not stored for others to show). What
// older or hostile writers stored is escaped on output all the same.
func checkLabel(label string) error {
	if !store.IsPrintable(label) {
		return usageError("--label %s: want printable text (no control characters, no invalid UTF-8)", strconv.QuoteToGraphic(label))
	}
	if len(label) > maxLabel {
		return usageError("--label of %d bytes: want at most %d", len(label), maxLabel)
	}
	return nil
}

// maxLabel bounds --label: a line in ls, not a document.
const maxLabel = store.MaxLabel

// jsonEscaper writes JSON with every character that is not graphic as a
// \u escape: encoding/json escapes C0 controls, U+2028 and U+2029, but
// writes DEL, C1 controls (U+0085, U+009B: a CSI to some terminals), bidi
// overrides and other format characters raw. The value decoded is the
// same; only the bytes that reach a terminal change. Outside strings, JSON
// has only ASCII, so any such character is inside a string.
type jsonEscaper struct{ w io.Writer }

func (j jsonEscaper) Write(p []byte) (int, error) {
	if _, err := j.w.Write(escapeJSON(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

func escapeJSON(p []byte) []byte {
	i := 0
	for i < len(p) && p[i] < 0x7f {
		i++
	}
	if i == len(p) {
		return p // ASCII without DEL: the normal case
	}
	out := bytes.NewBuffer(make([]byte, 0, len(p)+32))
	out.Write(p[:i])
	for i < len(p) {
		c := p[i]
		if c < 0x7f {
			out.WriteByte(c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(p[i:])
		// An invalid byte (encoding/json never writes one) decodes as U+FFFD,
		// which is graphic: it is written as the replacement character.
		if !strconv.IsGraphic(r) {
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(out, `\u%04x\u%04x`, r1, r2)
			} else {
				fmt.Fprintf(out, `\u%04x`, r)
			}
		} else if r == utf8.RuneError && n == 1 {
			out.WriteString("\ufffd")
		} else {
			out.Write(p[i : i+n])
		}
		i += n
	}
	return out.Bytes()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(jsonEscaper{w})
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(jsonEscaper{w}).Encode(v)
}
