package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// badInputScripts are the scripts of bad input (docs/leases.md §7).
var badInputScripts = []string{"bad_input_*.txtar", "config_errors.txtar", "ls_errors.txtar", "etcd_bad_input.txtar", "usage_unknown_command.txtar"}

// TestBadInputScriptsAssertOneLine keeps the bad-input scripts honest: every
// slotctl that they expect to fail is followed, among the checks of its
// output, by stderr -count=1 '^.' (docs/leases.md §7: exactly one line on stderr, a
// hint, if any, in that line). The scripts then fail wherever slotctl
// prints a second line.
func TestBadInputScriptsAssertOneLine(t *testing.T) {
	failing := regexp.MustCompile(`^exitcode [1-9][0-9]* (exec )?slotctl\b`)
	check := regexp.MustCompile(`^(! )?(stderr|stdout|exists|cmp)\b`)
	const oneLine = `stderr -count=1 '^.'`
	var files []string
	for _, pat := range badInputScripts {
		m, err := filepath.Glob(filepath.Join("testdata", "script", pat))
		if err != nil || len(m) == 0 {
			t.Fatalf("no script matches %s (%v)", pat, err)
		}
		files = append(files, m...)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if !failing.MatchString(l) {
				continue
			}
			ok := false
			for _, c := range lines[i+1:] {
				if !check.MatchString(c) {
					break
				}
				ok = ok || c == oneLine
			}
			if !ok {
				t.Errorf("%s:%d: %s\n\tis not followed by %s", file, i+1, l, oneLine)
			}
		}
	}
}
