package cli

// The help pages. A command's --help fits a screen above its flags: a
// short description (its Long), a pointer to its man page, the usage, a
// few examples, the flags. What the man page says beyond that (the whole
// description, the exit codes, more examples) is the command's man
// annotation (manPage), which only the man page generator reads.
//
// Every command takes the --etcd-* flags (the root's persistent flags),
// but they only matter for an etcd store: --help leaves them out of its
// flag lists and 'slotctl help store' lists them, with the other ways to
// set them. They are hidden only while a help page is printed, so that
// they parse, complete and configure as any other flag.

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// storeFlagAnnotation marks a flag listed by 'slotctl help store' instead
// of the help pages' flag lists (pflag's per-flag annotations).
const storeFlagAnnotation = "slotctl_store_flag"

// isStoreFlag reports whether fl is one of the --etcd-* flags.
func isStoreFlag(fl *pflag.Flag) bool {
	_, ok := fl.Annotations[storeFlagAnnotation]
	return ok
}

// storeFlags are the flags 'slotctl help store' lists, from the root's
// persistent flags: --store and --store-timeout, then the --etcd-* flags.
func storeFlags(root *cobra.Command) *pflag.FlagSet {
	fs := pflag.NewFlagSet("store", pflag.ContinueOnError)
	fs.SortFlags = false
	pf := root.PersistentFlags()
	fs.AddFlag(pf.Lookup("store"))
	fs.AddFlag(pf.Lookup("store-timeout"))
	pf.VisitAll(func(fl *pflag.Flag) {
		if isStoreFlag(fl) {
			fs.AddFlag(fl)
		}
	})
	return fs
}

// manAnnotation is the key of a command's man annotation: the text its
// man page has beyond its --help. It is plain text like a Long: the
// description, if the page's is more than the Long's; then "EXIT STATUS"
// and the exit codes, one a line ("  64   usage error"), a line indented
// further going on with the code above it; then, optionally, "EXAMPLES"
// and examples for the man page only, added to the command's Example.
const manAnnotation = "slotctl_man"

// manPage is the Annotations of a command whose man page says text beyond
// its --help.
func manPage(text string) map[string]string { return map[string]string{manAnnotation: text} }

// manSections splits a command's man annotation: the page's description
// (the Long when the annotation has none), its EXIT STATUS block and its
// own examples.
func manSections(c *cobra.Command) (desc, exit, examples string) {
	desc, exit = cutSection(c.Annotations[manAnnotation], "EXIT STATUS")
	exit, examples = cutSection(exit, "EXAMPLES")
	if strings.TrimSpace(desc) == "" {
		desc = c.Long
	}
	return desc, exit, examples
}

// cutSection cuts text at the line that is title alone.
func cutSection(text, title string) (before, after string) {
	if rest, ok := strings.CutPrefix(text, title+"\n"); ok {
		return "", rest
	}
	before, after, _ = strings.Cut(text, "\n"+title+"\n")
	return strings.TrimRight(before, "\n"), after
}

// manPageName is the name of c's man page: "slotctl-limit-set".
func manPageName(c *cobra.Command) string { return strings.ReplaceAll(c.CommandPath(), " ", "-") }

// setHelp gives root's tree its help pages: cobra's, with a pointer to the
// man page after the description and without the --etcd-* flags, and the
// store topic's own.
func setHelp(root *cobra.Command) {
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		var hidden []*pflag.Flag
		root.PersistentFlags().VisitAll(func(fl *pflag.Flag) {
			if isStoreFlag(fl) && !fl.Hidden {
				fl.Hidden = true
				hidden = append(hidden, fl)
			}
		})
		defer func() {
			for _, fl := range hidden {
				fl.Hidden = false
			}
		}()
		w := c.OutOrStdout()
		desc := c.Long
		if desc == "" {
			desc = c.Short
		}
		fmt.Fprintln(w, strings.TrimRightFunc(desc, unicode.IsSpace))
		if _, ok := c.Annotations[manAnnotation]; ok {
			fmt.Fprintf(w, "Exit status and more: man %s\n", manPageName(c))
		}
		fmt.Fprintln(w)
		if c.Runnable() || c.HasSubCommands() {
			fmt.Fprint(w, c.UsageString())
		}
	})
}

// newStoreTopic is 'slotctl help store': a help topic (it runs nothing)
// that lists the store flags with where else they can be set.
func newStoreTopic() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Where the leases are kept (a file, etcd, PostgreSQL); the flags for an etcd store's TLS, credentials and timeouts",
		Long: `The store holds the limits and their tickets. --store names it, else
SLOTCTL_STORE, else the config file's store:
  PATH, bolt://PATH    a bbolt file, for the jobs of one host
  etcd://HOST:PORT[,HOST:PORT...][/PREFIX]
                       an etcd cluster, for the jobs of many hosts
  postgres://USER@HOST/DB[?sslmode=...]
                       a PostgreSQL database, for the jobs of many hosts;
                       the password from PGPASSWORD or ~/.pgpass
The default is /var/lib/slotctl/slots.db if /var/lib/slotctl exists, else
$XDG_STATE_HOME/slotctl/slots.db.

An etcd store's TLS, credentials and timeouts come from the --etcd-* flags,
which every command takes, else from the config file's etcd section
(etcd.cacert, etcd.username, ...); the user name from SLOTCTL_ETCD_USERNAME
before the file. The password comes only from SLOTCTL_ETCD_PASSWORD or the
password file.`,
	}
	cmd.SetHelpFunc(func(c *cobra.Command, _ []string) {
		w := c.OutOrStdout()
		fmt.Fprintf(w, "%s\n\nStore flags:\n%s", strings.TrimSpace(c.Long), storeFlags(c.Root()).FlagUsages())
	})
	return cmd
}
