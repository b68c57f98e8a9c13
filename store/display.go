package store

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Printable returns text from the store (a label, host, user, command line,
// ticket id, limit name, evidence) as it may be shown on a terminal or
// written to a log (docs/leases.md §4.5): whatever a record holds, the result holds
// only graphic characters (strconv.IsGraphic: letters, marks, numbers,
// punctuation, symbols and spaces), so it can neither drive a terminal
// nor begin a line of output of its own.
//
// Text that is already printable is returned unchanged, backslashes and
// all. Any other text is returned as a Go double-quoted string
// (strconv.QuoteToGraphic): "\x1b[2J", "a\nb", "\u202e", "\xff", with its
// backslashes and quotes escaped. Text that begins with a double quote is
// quoted too, so the two forms cannot be confused: a field shown starting
// with " is quoted, and strconv.Unquote gives back its bytes.
func Printable(s string) string {
	if IsPrintable(s) && !strings.HasPrefix(s, `"`) {
		return s
	}
	return strconv.QuoteToGraphic(s)
}

// IsPrintable reports whether s is valid UTF-8 of graphic characters only
// (strconv.IsGraphic): no C0 or C1 control, DEL, line or paragraph
// separator, format character (bidi overrides, zero-width joiners) or
// unassigned code point.
func IsPrintable(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !strconv.IsGraphic(r) {
			return false
		}
		i += n
	}
	return true
}

// shellJoin renders argv the way a shell user would type it, for display only.
func shellJoin(argv []string) string {
	n := 0
	for _, a := range argv {
		n += len(a) + 3 // a space and the quotes
	}
	var b strings.Builder
	b.Grow(n) // ls joins every ticket's command: one allocation each
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a != "" && !needsQuotes(a) {
			b.WriteString(a)
			continue
		}
		b.WriteByte('\'')
		b.WriteString(strings.ReplaceAll(a, "'", `'\''`))
		b.WriteByte('\'')
	}
	return b.String()
}

// shellSpecial is the bytes a shell would read as more than a letter of a word.
var shellSpecial = [256]bool{' ': true, '\t': true, '\n': true, '\'': true, '"': true, '\\': true, '$': true, '`': true, '!': true,
	'*': true, '?': true, '[': true, ']': true, '{': true, '}': true, '(': true, ')': true, '<': true, '>': true, '|': true,
	'&': true, ';': true, '#': true, '~': true}

// needsQuotes is strings.ContainsAny(a, the shell's special characters),
// by a table: they are all ASCII, so no byte of a longer character matches.
func needsQuotes(a string) bool {
	for i := 0; i < len(a); i++ {
		if shellSpecial[a[i]] {
			return true
		}
	}
	return false
}
