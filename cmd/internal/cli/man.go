//go:build gendocs

// The man page generator is built only for go generate (-tags gendocs): the
// markdown-to-roff converter it needs compiles regular expressions at start-up,
// which every slotctl run would otherwise pay for.

package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// manDate is the date printed in the man pages' footer. It is a constant so
// that go generate gives the same pages on every machine and every day
// (CI fails when the checked-in pages are stale); bump it when the pages
// change for a release, or pass --date.
const manDate = "2026-11-29"

// extraCommands are the commands built only for go generate.
func extraCommands() []*cobra.Command { return []*cobra.Command{newManCmd()} }

// newManCmd generates the man pages from the command tree (hidden: it is
// for go generate, not for users).
func newManCmd() *cobra.Command {
	var dir, date string
	cmd := &cobra.Command{
		Use:               "man --dir DIR",
		Short:             "Write the man pages, one per command, to DIR",
		Hidden:            true,
		Args:              cobra.NoArgs,
		PersistentPreRunE: noPreRun,
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.Parse(time.DateOnly, date)
			if err != nil {
				return usageError("--date %q: want a date such as 2026-01-31", date)
			}
			return genManPages(cmd.Root(), dir, d)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "man", "directory to write the pages to")
	cmd.Flags().StringVar(&date, "date", manDate, "date in the pages' footer, YYYY-MM-DD")
	return cmd
}

// genManPages replaces the slotctl*.1 pages in dir with pages generated from
// root's tree by cobra's doc.GenManTree: stale pages of removed commands go too.
func genManPages(root *cobra.Command, dir string, date time.Time) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, root.Name()+"*.1"))
	if err != nil {
		return err
	}
	for _, p := range old {
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	prepareForMan(root)
	err = doc.GenManTree(root, &doc.GenManHeader{
		Section: "1",
		Date:    &date,
		Source:  "slotctl",
		Manual:  "slotctl manual",
	}, dir)
	if err != nil {
		return err
	}
	pages, err := filepath.Glob(filepath.Join(dir, root.Name()+"*.1"))
	if err != nil {
		return err
	}
	for _, p := range pages {
		if err := fixManPage(p); err != nil {
			return err
		}
	}
	return nil
}

// fixManPage moves go-md2man's ".nh" (no hyphenation) after ".TH", which
// turns hyphenation back on in groff, sets groff's HY register so that the
// end of an example (.EE) does not turn it on again, and adds ".ad l"
// (ragged right): flag names and paths read badly when split or spread out.
// It also drops the blank lines go-md2man leaves between paragraphs and
// tagged paragraphs, except in examples: in roff a blank line is a break
// and a blank line of its own, so that each .PP and .TP after one began
// with two; and writes each non-ASCII character as a groff escape
// (\[u00B1]), since man and groff read a page as Latin-1 unless told
// otherwise: "±" would come out as "Â±".
func fixManPage(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := strings.TrimPrefix(string(b), ".nh\n")
	th, rest, ok := strings.Cut(s, "\n")
	if !ok || !strings.HasPrefix(th, ".TH ") {
		return fmt.Errorf("%s: no .TH line where go-md2man puts it", path)
	}
	out := []string{th, ".nr HY 0", ".nh", ".ad l"}
	example := false
	for _, line := range strings.Split(rest, "\n") {
		switch {
		case line == ".EX":
			example = true
		case line == ".EE":
			example = false
		case line == "" && !example:
			continue
		}
		out = append(out, roffASCII(line))
	}
	return os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644)
}

// roffASCII writes each non-ASCII character of s as groff's \[uXXXX].
func roffASCII(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x80 {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, `\[u%04X]`, r)
		}
	}
	return b.String()
}

// prepareForMan rewrites the tree's help for the man pages (the process
// exits after writing them). cobra's pages put DESCRIPTION first and then
// the flags as tab-indented paragraphs; here each page gets the sections of
// man-pages(7) in their usual order, all in its Long: DESCRIPTION (the man
// annotation's, else the Long: help.go), OPTIONS and GLOBAL OPTIONS as
// tagged paragraphs (with the argument's name and the default), the root's
// STORE OPTIONS, EXIT STATUS from the annotation's plain-text block, then
// ENVIRONMENT and FILES where the command has them. cobra adds EXAMPLE
// (with the annotation's examples) and SEE ALSO.
func prepareForMan(root *cobra.Command) {
	var all []*cobra.Command
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		all = append(all, c)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	// Every page is written before any flag is hidden: hiding the root's
	// persistent flags would drop them from the subcommands' GLOBAL OPTIONS.
	longs := make([]string, len(all))
	for i, c := range all {
		c.InitDefaultHelpFlag()
		desc, exit, examples := manSections(c)
		if desc == "" {
			desc = c.Short
		}
		if examples != "" {
			c.Example = strings.TrimRight(c.Example, "\n") + "\n\n" + strings.TrimRight(examples, "\n")
		}
		var b strings.Builder
		b.WriteString(manText(desc))
		// The --etcd-* flags are the root page's STORE OPTIONS only.
		writeManFlags(&b, "OPTIONS", "", flagsWhere(c.NonInheritedFlags(), notStoreFlag))
		if c.HasParent() {
			writeManFlags(&b, "GLOBAL OPTIONS", "", flagsWhere(c.InheritedFlags(), notStoreFlag))
			b.WriteString("\nThe etcd store's own options (**--etcd-**...): STORE OPTIONS in **slotctl**(1).\n")
		} else if topic := storeTopicOf(c); topic != nil {
			writeManFlags(&b, "STORE OPTIONS", manText(topic.Long), flagsWhere(c.NonInheritedFlags(), isStoreFlag))
		}
		if exit != "" {
			b.WriteString("\n# EXIT STATUS\n" + manExitStatus(exit))
		}
		if extra := manExtra[c.CommandPath()]; extra != "" {
			b.WriteString("\n" + extra)
		}
		longs[i] = b.String()
	}
	for i, c := range all {
		c.DisableAutoGenTag = true
		c.Long = longs[i]
		if c.HasAvailableSubCommands() {
			c.Use += " COMMAND"
		}
		if !c.DisableFlagsInUseLine && c.HasAvailableFlags() && !strings.Contains(c.Use, "[flags]") {
			c.Use += " [flags]"
		}
		// Hidden from cobra's own OPTIONS sections, shown in ours.
		c.LocalFlags().VisitAll(func(fl *pflag.Flag) { fl.Hidden = true })
	}
}

// exitLine is one line of an EXIT STATUS block: "  64   usage error".
var exitLine = regexp.MustCompile(`^\s*([0-9]+(?:\s*/\s*[0-9]+)?)\s{2,}(.*)$`)

// manExitStatus turns the plain-text EXIT STATUS block of a command into a
// tagged paragraph per code. A line indented further than the codes
// ("       disagrees with the limit") goes on with the code above it; other
// lines are paragraphs of their own.
func manExitStatus(block string) string {
	type entry struct{ code, text string }
	var entries []entry
	for _, line := range strings.Split(block, "\n") {
		text := strings.TrimSpace(line)
		last := len(entries) - 1
		switch m := exitLine.FindStringSubmatch(line); {
		case text == "":
		case m != nil:
			entries = append(entries, entry{strings.Join(strings.Fields(m[1]), " "), m[2]})
		case last >= 0 && entries[last].code != "" && strings.HasPrefix(line, "    "):
			entries[last].text += " " + text
		default:
			entries = append(entries, entry{"", text})
		}
	}
	var b strings.Builder
	for _, e := range entries {
		if e.code != "" {
			fmt.Fprintf(&b, "**%s**\n: %s\n\n", e.code, mdEscape(e.text))
		} else {
			fmt.Fprintf(&b, "%s\n\n", mdEscape(e.text))
		}
	}
	return b.String()
}

// manText turns plain help text into markdown that go-md2man renders as
// written: paragraphs stay paragraphs, and indented lines (tables, commands)
// stay preformatted instead of being joined into the paragraph.
func manText(text string) string {
	lines := strings.Split(text, "\n")
	var b strings.Builder
	for i, line := range lines {
		indented := strings.HasPrefix(line, "  ")
		prevIndented := i > 0 && strings.HasPrefix(lines[i-1], "  ")
		switch {
		case indented:
			if !prevIndented {
				b.WriteString("\n")
			}
			b.WriteString("    " + line + "\n")
		default:
			if prevIndented && strings.TrimSpace(line) != "" {
				b.WriteString("\n")
			}
			b.WriteString(mdEscape(line) + "\n")
		}
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// manArgNames name the argument of string and int flags in the man pages.
var manArgNames = map[string]string{
	"limit": "NAME", "store": "URL", "config": "FILE", "label": "TEXT", "wait": "DURATION", "progress-every": "DURATION",
	"on-lost": "kill|continue", "output": "FORMAT", "n": "N", "slots": "N", "weight": "N", "busy-exit-code": "CODE",
}

// storeTopicOf is root's help topic 'store' (help.go), nil if none.
func storeTopicOf(root *cobra.Command) *cobra.Command {
	for _, c := range root.Commands() {
		if c.Name() == "store" && c.IsAdditionalHelpTopicCommand() {
			return c
		}
	}
	return nil
}

func notStoreFlag(fl *pflag.Flag) bool { return !isStoreFlag(fl) }

// flagsWhere is the flags of fs that keep says to keep.
func flagsWhere(fs *pflag.FlagSet, keep func(*pflag.Flag) bool) *pflag.FlagSet {
	out := pflag.NewFlagSet(fs.Name(), pflag.ContinueOnError)
	fs.VisitAll(func(fl *pflag.Flag) {
		if keep(fl) {
			out.AddFlag(fl)
		}
	})
	return out
}

// writeManFlags writes flags as a titled section of tagged paragraphs:
// "-l, --limit NAME" and the usage, with the default if it says something.
// The section begins with intro, markdown, if not empty.
func writeManFlags(b *strings.Builder, title, intro string, flags *pflag.FlagSet) {
	var items []string
	flags.VisitAll(func(fl *pflag.Flag) {
		if fl.Hidden || fl.Deprecated != "" || fl.Name == "help" {
			return
		}
		name, usage := pflag.UnquoteUsage(fl)
		if n, ok := manArgNames[fl.Name]; ok && !strings.Contains(fl.Usage, "`") {
			name = n
		} else if name != "" {
			name = strings.ToUpper(name)
		}
		var tag strings.Builder
		if fl.Shorthand != "" && fl.ShorthandDeprecated == "" {
			fmt.Fprintf(&tag, "**-%s**, ", fl.Shorthand)
		}
		fmt.Fprintf(&tag, "**--%s**", fl.Name)
		switch {
		case fl.Value.Type() == "bool":
		case fl.NoOptDefVal != "":
			fmt.Fprintf(&tag, "[=*%s*]", mdEscape(name))
		case name != "":
			fmt.Fprintf(&tag, " *%s*", mdEscape(name))
		}
		usage = mdEscape(usage)
		switch fl.DefValue {
		case "", "0", "0s", "false", "[]":
		default:
			def := mdEscape(fl.DefValue)
			switch {
			case strings.Contains(usage, "default"):
			case strings.HasSuffix(usage, ")"):
				usage = strings.TrimSuffix(usage, ")") + "; default " + def + ")"
			default:
				usage += " (default " + def + ")"
			}
		}
		items = append(items, tag.String()+"\n: "+usage+"\n")
	})
	if len(items) == 0 {
		return
	}
	b.WriteString("\n# " + title + "\n")
	if intro != "" {
		b.WriteString(intro + "\n")
	}
	b.WriteString(strings.Join(items, "\n"))
}

// orderedItem is the start of a line that markdown reads as a numbered list.
var orderedItem = regexp.MustCompile(`^[0-9]+\. `)

// mdEscape keeps markdown from reading plain help text as markup.
func mdEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, "*", `\*`, "_", `\_`, "`", "\\`", "<", `\<`, "[", `\[`)
	s = r.Replace(s)
	// A line starting "1. " or "- " would become a list, "#" a heading.
	if t := strings.TrimLeft(s, " "); strings.HasPrefix(t, "#") || strings.HasPrefix(t, "- ") || strings.HasPrefix(t, "+ ") || orderedItem.MatchString(t) {
		s = `\` + s
	}
	return s
}

// manExtra are sections only the man pages carry, by command path.
var manExtra = map[string]string{
	"slotctl": `# ENVIRONMENT
**SLOTCTL\_STORE**, **SLOTCTL\_CONFIG**, **SLOTCTL\_TTL**, **SLOTCTL\_STORE\_TIMEOUT**
: the store URL, config file, lease TTL and store timeout, as --store, --config, --ttl and --store-timeout; flags take precedence

**SLOTCTL\_ETCD\_USERNAME**, **SLOTCTL\_ETCD\_PASSWORD**
: credentials for an etcd store

**NO\_COLOR**
: plain, uncoloured tables even on a terminal

**XDG\_CONFIG\_HOME**, **XDG\_STATE\_HOME**
: where the per-user config file and store are looked for

# FILES
*/var/lib/slotctl/slots.db*
: the shared store, used when */var/lib/slotctl* exists (the packages create it: group slotctl, mode 3770: setgid and sticky, the store's files pre-created by root; users who share limits join the group)

*$XDG\_STATE\_HOME/slotctl/slots.db* (default *~/.local/state/slotctl/slots.db*)
: the per-user store, used otherwise

*$XDG\_CONFIG\_HOME/slotctl/config.yaml* (default *~/.config/slotctl/config.yaml*), then */etc/slotctl/config.yaml*
: the config file: store, ttl, store-timeout, limits (sizes of limits created by run), etcd
`,
	"slotctl run": `# ENVIRONMENT
COMMAND runs with these variables added:

**SLOTCTL\_LIMIT**
: the limit's name

**SLOTCTL\_TICKET**
: the ticket id (slotctl release and slotctl ls show it)

**SLOTCTL\_FENCE**
: a number that grows with every ticket of the store, for downstream systems to refuse a stale holder

**SLOTCTL\_SLOT**
: the slot index, 0 to SLOTS-1, unique among the limit's holders

**SLOTCTL\_STORE**
: the store's URL
`,
}
