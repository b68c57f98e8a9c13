package jobserver

import (
	"strconv"
	"strings"
)

// MakeFlags is MAKEFLAGS for a jobserver client: old without its -j, --jobs
// and --jobserver-* words (an outer make's jobserver: a make refuses two
// --jobserver-auth), with -jN and --jobserver-auth=AUTH added before the
// command-line variables ("-- VAR=value") that old may end with. The other
// words, the leading cluster of one-letter flags ("ks") included, are kept
// as they were.
func MakeFlags(old string, n int, auth string) string {
	words := splitFlags(old)
	var keep, vars []string
	for i, w := range words {
		if w == "--" {
			vars = words[i:]
			break
		}
		if isJobFlag(w) {
			continue
		}
		keep = append(keep, w)
	}
	keep = append(keep, "-j"+strconv.Itoa(n), "--jobserver-auth="+auth)
	return strings.Join(append(keep, vars...), " ")
}

func isJobFlag(w string) bool {
	switch {
	case w == "-j", w == "--jobs":
		return true
	case strings.HasPrefix(w, "-j") && isDigits(w[2:]):
		return true
	case strings.HasPrefix(w, "--jobs="):
		return true
	case strings.HasPrefix(w, "--jobserver-auth="), strings.HasPrefix(w, "--jobserver-fds="), strings.HasPrefix(w, "--jobserver-style="):
		return true
	}
	return false
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// splitFlags splits MAKEFLAGS at unescaped spaces (make writes a space in
// a value as "\ "); the words keep their escapes.
func splitFlags(s string) []string {
	var words []string
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			b.WriteByte(c)
			i++
			b.WriteByte(s[i])
		case c == ' ' || c == '\t':
			if b.Len() > 0 {
				words = append(words, b.String())
				b.Reset()
			}
		default:
			b.WriteByte(c)
		}
	}
	if b.Len() > 0 {
		words = append(words, b.String())
	}
	return words
}
