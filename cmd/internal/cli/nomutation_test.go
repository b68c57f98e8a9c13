package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/internal/testkit/longtest"
)

// A symbol names the bug switches if "mutation" starts a word in it: not
// crypto/des.permutationFunction, which slotctl-etcd links.
var mutationWord = regexp.MustCompile(`(?i)\bmutation`)

// The test-only bug switches (internal/mutation) exist only in a build with
// the tag slotctl_mutations. The released binaries, built as
// .goreleaser.yaml builds them but with their symbol table kept (no -s -w),
// have no symbol that names them, and none of the guarded code: no bug's
// name is left in the binary, since each one is only the argument of a
// Has that is compiled out. Built with the tag, the same checks see both
// (the checks can fail).
func TestNoMutationSymbols(t *testing.T) {
	longtest.Skip(t, "builds slotctl three times")
	dir := t.TempDir()
	for _, c := range []struct {
		main, tags string
		want       bool // mutation symbols and code in it
	}{
		{"slotctl", "", false},
		{"slotctl-etcd", "grpcnotrace", false},
		{"slotctl", "slotctl_mutations", true},
	} {
		bin := filepath.Join(dir, c.main+"-"+c.tags)
		build := exec.Command("go", "build", "-trimpath", "-tags", c.tags, "-o", bin, "../../../cmd/"+c.main)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", build, err, out)
		}
		syms, err := exec.Command("go", "tool", "nm", bin).Output()
		if err != nil {
			t.Fatalf("go tool nm %s: %v", bin, err)
		}
		var named []string
		for _, line := range strings.Split(string(syms), "\n") {
			if mutationWord.MatchString(line) {
				named = append(named, strings.TrimSpace(line))
			}
		}
		if got := len(named) > 0; got != c.want {
			t.Errorf("%s (tags %q): symbols naming mutation: %v, want %v: %q", c.main, c.tags, got, c.want, named)
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, b := range mutation.All() {
			if bytes.Contains(data, []byte(b)) {
				left = append(left, string(b))
			}
		}
		if got := len(left) > 0; got != c.want {
			t.Errorf("%s (tags %q): guarded mutation code in it: %v, want %v: bug names %q", c.main, c.tags, got, c.want, left)
		}
	}
}
