package cli

// The help pages. Every command takes the --etcd-* flags (the root's
// persistent flags), but they only matter for an etcd store: --help leaves
// them out of its flag lists and 'slotctl help store' lists them, with the
// other ways to set them. They are hidden only while a help page is
// printed, so that they parse, complete and configure as any other flag.

import (
	"fmt"
	"strings"

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

// setHelp gives root's tree its help pages: cobra's, without the --etcd-*
// flags, and the store topic's own.
func setHelp(root *cobra.Command) {
	cobraHelp := root.HelpFunc()
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
		cobraHelp(c, args)
	})
}

// newStoreTopic is 'slotctl help store': a help topic (it runs nothing)
// that lists the store flags with where else they can be set.
func newStoreTopic() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Where the leases are kept; the flags for an etcd store's TLS, credentials and timeouts",
		Long: `The store holds the limits and their tickets. --store names it, else
SLOTCTL_STORE, else the config file's store:
  PATH, bolt://PATH    a bbolt file, for the jobs of one host
  etcd://HOST:PORT[,HOST:PORT...][/PREFIX]
                       an etcd cluster, for the jobs of many hosts
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
