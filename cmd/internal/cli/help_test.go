package cli

// Tests of the help pages: what --help shows, and 'slotctl help store'.

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// helpPaths are the command lines of every command's help page.
func helpPaths(t *testing.T) [][]string {
	f, _, _ := flagsFactory(t)
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				walk(sub, append(path[:len(path):len(path)], sub.Name()))
			}
		}
	}
	walk(newRootCmdWith(f, runFs{}), nil)
	return paths
}

// helpOf runs slotctl ARGS... and returns stdout; it must exit 0.
func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	f, out, errOut := flagsFactory(t)
	if code := mainWith(context.Background(), args, f, runFs{}); code != 0 || errOut.Len() != 0 {
		t.Fatalf("slotctl %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	return out.String()
}

// etcdFlagNames are the --etcd-* flags.
func etcdFlagNames() []string {
	var names []string
	for _, fl := range etcdFlags {
		names = append(names, "--etcd-"+fl.name)
	}
	return names
}

// TestHelpStoreFlags: the --etcd-* flags are left out of every help page's
// flag lists, which point to 'slotctl help store' instead (in --store's
// line); that page lists each of them; and they still complete.
func TestHelpStoreFlags(t *testing.T) {
	for _, path := range helpPaths(t) {
		out := helpOf(t, append(path, "--help")...)
		if strings.Contains(out, "--etcd-") {
			t.Errorf("slotctl %s --help lists etcd flags:\n%s", strings.Join(path, " "), out)
		}
		if !strings.Contains(out, "slotctl help store") {
			t.Errorf("slotctl %s --help does not point to slotctl help store:\n%s", strings.Join(path, " "), out)
		}
	}
	store := helpOf(t, "help", "store")
	if !strings.Contains(store, "\nStore flags:\n") {
		t.Errorf("slotctl help store has no Store flags section:\n%s", store)
	}
	for _, name := range append(etcdFlagNames(), "--store ", "--store-timeout ") {
		if !strings.Contains(store, name) {
			t.Errorf("slotctl help store does not list %s:\n%s", name, store)
		}
	}
	if !strings.Contains(helpOf(t, "--help"), "slotctl store ") {
		t.Errorf("slotctl --help does not list the store help topic")
	}
	completed, _, stderr := compRun(t, newLsEnv(t).env, "run", "--etcd-")
	compNoExtraStderr(t, stderr)
	for _, name := range etcdFlagNames() {
		if !slices.ContainsFunc(completed, func(c string) bool { return strings.HasPrefix(c, name+"\t") }) {
			t.Errorf("slotctl run --etcd-<Tab> does not offer %s: %q", name, completed)
		}
	}
}

// TestHelpHidesStoreFlagsOnlyForTheHelp: the --etcd-* flags are hidden
// while a help page is printed, and only then.
func TestHelpHidesStoreFlagsOnlyForTheHelp(t *testing.T) {
	f, _, _ := flagsFactory(t)
	root := newRootCmdWith(f, runFs{})
	root.SetArgs([]string{"run", "--help"})
	root.SetOut(&bytes.Buffer{})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := 0
	root.PersistentFlags().VisitAll(func(fl *pflag.Flag) {
		if isStoreFlag(fl) {
			n++
			if fl.Hidden {
				t.Errorf("--%s is still hidden after a help page", fl.Name)
			}
		}
	})
	if n != len(etcdFlags) {
		t.Errorf("%d store flags, want the %d --etcd-* flags", n, len(etcdFlags))
	}
}

// TestHelpFitsAboveFlags: every --help starts with a short description, so
// that its usage line is on the first screen, then at most a handful of
// examples before the flags; the rest is its man page's.
func TestHelpFitsAboveFlags(t *testing.T) {
	const usageBy, maxExamples = 12, 5
	for _, path := range helpPaths(t) {
		name := strings.Join(append([]string{"slotctl"}, path...), " ")
		lines := strings.Split(helpOf(t, append(path, "--help")...), "\n")
		usage := slices.Index(lines, "Usage:")
		if usage < 0 || usage >= usageBy {
			t.Errorf("%s --help: Usage: on line %d, want it within the first %d:\n%s", name, usage+1, usageBy, strings.Join(lines, "\n"))
		}
		examples, in := 0, false
		for _, line := range lines {
			switch {
			case line == "Examples:":
				in = true
			case line != "" && line[0] != ' ': // the next section
				in = false
			case in && strings.TrimSpace(line) != "" && !strings.HasPrefix(strings.TrimSpace(line), "#"):
				examples++
			}
		}
		if examples > maxExamples {
			t.Errorf("%s --help: %d examples, want at most %d (more go in its man annotation)", name, examples, maxExamples)
		}
	}
}
