package cli

// Tests of the checked-in man pages (man/*.1): go generate writes them from
// the command tree (man.go, -tags gendocs) and .ci/package fails when they
// are stale, so these are the pages the command tree gives. groff renders
// each one as man does; groff is required under CI=true (.ci/run installs
// Debian's groff-base).
//
//	go test ./cmd/internal/cli -run 'ManPage'

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// manDir is the checked-in man pages' directory.
const manDir = "../../../man"

// needTool is the path of a program a test runs; without it the test
// skips, or fails under CI (CI=true), whose .ci/run installs debPackage.
func needTool(t *testing.T, tool, debPackage string) string {
	t.Helper()
	path, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed; .ci/run installs Debian's %s package for it", tool, debPackage)
		}
		t.Skipf("%s not installed (apt-get install %s); CI requires it", tool, debPackage)
	}
	return path
}

// manCommands are the commands that have a man page, by the page's file
// name: the root and every command a user can run or list (as cobra's
// doc.GenManTree walks them).
func manCommands(t *testing.T) map[string]*cobra.Command {
	f, _, _ := flagsFactory(t)
	pages := map[string]*cobra.Command{}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		pages[manPageName(c)+".1"] = c
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() && !sub.IsAdditionalHelpTopicCommand() {
				walk(sub)
			}
		}
	}
	walk(newRootCmdWith(f, runFs{}))
	return pages
}

// TestManPagesRender renders every man page with groff as man does, with
// every warning on (-ww), and fails on anything groff says on stderr: a
// stray control line, an unknown escape, a character it cannot read. It
// checks that there is one page per command, each in ASCII, and that each
// page's EXIT STATUS section renders each code as an entry of its own,
// with the whole of its description and nothing else (no paragraph cut
// off it).
func TestManPagesRender(t *testing.T) {
	groff := needTool(t, "groff", "groff-base")
	cmds := manCommands(t)
	files, err := filepath.Glob(filepath.Join(manDir, "*.1"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no man pages in %s: %v", manDir, err)
	}
	var names []string
	for _, file := range files {
		names = append(names, filepath.Base(file))
	}
	for name, c := range cmds {
		if _, exit, _ := manSections(c); strings.TrimSpace(exit) == "" {
			t.Errorf("%q has no EXIT STATUS (its man annotation: help.go)", c.CommandPath())
		}
		if !slices.Contains(names, name) {
			t.Errorf("no man page %s for %q: run go generate ./...", name, cmds[name].CommandPath())
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			c := cmds[name]
			if c == nil {
				t.Fatalf("%s is the page of no command: run go generate ./...", name)
			}
			page, err := os.ReadFile(filepath.Join(manDir, name))
			if err != nil {
				t.Fatal(err)
			}
			// man and groff read a page as Latin-1 unless told otherwise: a
			// UTF-8 "±" would come out as "Â±", without a warning.
			if i := bytes.IndexFunc(page, func(r rune) bool { return r >= 0x80 }); i >= 0 {
				t.Errorf("byte %d: a character that is not ASCII, not a groff escape (\\[u00B1])", i)
			}
			var stdout, stderr bytes.Buffer
			// -P-cbou: plain text, no bold, underline or overstrike.
			cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-P-cbou", filepath.Join(manDir, name))
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("groff: %v\n%s", err, stderr.String())
			}
			if stderr.Len() != 0 {
				t.Errorf("groff warns:\n%s", stderr.String())
			}
			_, exit, _ := manSections(c)
			want := exitEntriesOf(exit)
			got := renderedSection(stdout.String(), "EXIT STATUS")
			if !slices.Equal(got, want) {
				t.Errorf("EXIT STATUS renders as\n\t%s\nwant one entry per code (a code and all of its text) and per paragraph:\n\t%s",
					strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
			}
		})
	}
}

// exitEntriesOf reads a command's EXIT STATUS block as the man page
// should render it, one string per entry, its words single-spaced: a line
// that starts with a code starts an entry ("64 usage error: ..."), a line
// indented further than the codes goes on with the entry above it, and any
// other line is a paragraph of its own.
func exitEntriesOf(block string) []string {
	var entries []string
	coded := false // the last entry has a code
	for _, line := range strings.Split(block, "\n") {
		words := strings.Fields(line)
		switch {
		case len(words) == 0:
		case isExitCode(words[0]):
			entries, coded = append(entries, strings.Join(words, " ")), true
		case coded && strings.HasPrefix(line, "    "):
			entries[len(entries)-1] += " " + strings.Join(words, " ")
		default:
			entries, coded = append(entries, strings.Join(words, " ")), false
		}
	}
	return entries
}

// isExitCode reports whether s is an exit status: digits only.
func isExitCode(s string) bool {
	return strings.Trim(s, "0123456789") == "" && s != ""
}

// renderedSection is the section of a page rendered by groff, one string
// per entry (the lines between blank lines: a paragraph, or a tagged
// paragraph's tag and text), its words single-spaced.
func renderedSection(page, title string) []string {
	// groff may draw ASCII as typographic characters on a UTF-8 terminal.
	page = strings.NewReplacer("\u2010", "-", "\u2212", "-", "\u2019", "'", "\u2018", "'").Replace(page)
	var entries []string
	in, next := false, true // in the section; the next words start an entry
	for _, line := range strings.Split(page, "\n") {
		if line != "" && line[0] != ' ' { // a heading
			in, next = line == title, true
			continue
		}
		words := strings.Join(strings.Fields(line), " ")
		switch {
		case !in:
		case words == "":
			next = true
		case next:
			entries, next = append(entries, words), false
		default:
			entries[len(entries)-1] += " " + words
		}
	}
	return entries
}
