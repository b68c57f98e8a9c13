package cli

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// sharedStoreDir is the system-wide store directory: when it exists (the
// package creates it, group slotctl, mode 3770), every user's jobs share it.
const sharedStoreDir = "/var/lib/slotctl"

// defaultStorePath is docs/leases.md §5's default: the shared directory if present,
// else the user's own state directory.
func (f *Factory) defaultStorePath() string {
	if st, err := os.Stat(sharedStoreDir); err == nil && st.IsDir() {
		return filepath.Join(sharedStoreDir, "slots.db")
	}
	state := f.Getenv("XDG_STATE_HOME")
	if state == "" {
		// The factory's HOME: os.UserHomeDir would read the process's
		// (the same on Linux, where it is all that function reads).
		state = filepath.Join(f.Getenv("HOME"), ".local", "state")
	}
	return filepath.Join(state, "slotctl", "slots.db")
}

// openStore resolves the --store URL (docs/leases.md §5) into a store. Nothing is
// opened yet: the bbolt file is opened per operation. Its judge proves
// holders dead and signals nobody.
func (f *Factory) openStore(g *globalOptions) (store.Store, error) { return f.openJudged(g, false) }

// openReaper is openStore for slotctl reap, the only command whose judge
// may kill what is left of a dead holder's job: on a bbolt store, with the
// owner's job marker as its authority (docs/leases.md §4.3). An etcd store
// keeps no markers on this machine, so its judge kills nobody.
func (f *Factory) openReaper(g *globalOptions) (store.Store, error) { return f.openJudged(g, true) }

func (f *Factory) openJudged(g *globalOptions, reaper bool) (store.Store, error) {
	url := g.Store
	var path string
	dflt := false // only the default location's directory is made
	switch {
	case url == "":
		path = f.defaultStorePath()
		dflt = true
	case strings.HasPrefix(url, "bolt://"):
		path = strings.TrimPrefix(url, "bolt://")
	case strings.HasPrefix(url, "etcd://"):
		return f.openEtcd(g, url)
	case isPostgresURL(url):
		return f.openPostgres(g, url)
	case strings.Contains(url, "://"):
		scheme, _, _ := strings.Cut(url, "://")
		return nil, usageError("store %q: unknown scheme %q: want PATH, bolt://PATH, etcd://HOST:PORT[/PREFIX] or postgres://USER@HOST/DB", url, scheme)
	default:
		path = url
	}
	if path == "" {
		return nil, usageError("store %q: empty path: want PATH, bolt://PATH, etcd://HOST:PORT[/PREFIX] or postgres://USER@HOST/DB", url)
	}
	if !reaper {
		return boltstore.New(path, boltstore.Options{Timeout: g.StoreTimeout, Clock: f.StoreClock, Dead: proc.Dead, Keep: proc.JobRunning, Alive: proc.SupervisorAlive, MakeDir: dflt})
	}
	var jd proc.Judge // its authority is the store's, known once the store is
	st, err := boltstore.New(path, boltstore.Options{Timeout: g.StoreTimeout, Clock: f.StoreClock, MakeDir: dflt, Keep: proc.JobRunning, Alive: proc.SupervisorAlive,
		Dead: func(t store.Ticket, act bool) (string, bool) { return jd.Dead(t, act) }})
	if err != nil {
		return nil, err
	}
	jd.Authority = st.JobAuthority
	return st, nil
}

// etcdFlags are the --etcd-* flags, one per etcd.* setting but the
// password (which only comes from SLOTCTL_ETCD_PASSWORD or a file).
var etcdFlags = []struct {
	name, usage string
	isBool      bool // --etcd-NAME alone means true
}{
	{"dial-timeout", "etcd: how long to wait for the cluster to answer at all, a `DURATION` (default --store-timeout)", false},
	{"request-timeout", "etcd: how long to wait for each request, a `DURATION` (default --store-timeout)", false},
	{"cacert", "etcd: CA bundle (PEM `FILE`) that signed the cluster's certificates; turns TLS on", false},
	{"cert", "etcd: client certificate (PEM `FILE`), with --etcd-key", false},
	{"key", "etcd: client certificate's private key (PEM `FILE`)", false},
	{"username", "etcd: `USER` name (env SLOTCTL_ETCD_USERNAME; password from SLOTCTL_ETCD_PASSWORD)", false},
	{"password-file", "etcd: `FILE` holding the password (instead of SLOTCTL_ETCD_PASSWORD); mode 0600 or 0400, 0640 or 0440 to share it with its group", false},
	{"insecure-credentials", "etcd: send the username and password without TLS, in clear text (refused otherwise)", true},
}

// addEtcdFlags registers the --etcd-* flags on a command's flag set (the
// root's persistent flags). loadConfig gives them precedence over the
// config file and environment. They are store flags: 'slotctl help store'
// lists them, the other help pages leave them out (help.go).
func addEtcdFlags(fs *pflag.FlagSet) {
	for _, fl := range etcdFlags {
		if fl.isBool {
			fs.Bool("etcd-"+fl.name, false, fl.usage)
		} else {
			fs.String("etcd-"+fl.name, "", fl.usage)
		}
		_ = fs.SetAnnotation("etcd-"+fl.name, storeFlagAnnotation, []string{"etcd"})
	}
}

// etcdStoreGiven reports whether the command line or the environment plainly
// names a store that slotctl-etcd serves (etcd or PostgreSQL), before any parsing: --store etcd://... (or
// --store=etcd://...) before a "--", else SLOTCTL_STORE=etcd://... when no
// --store is given. The config file is not read: false is "cannot tell yet".
func etcdStoreGiven(args []string, getenv func(string) string) bool {
	store, given := "", false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if v, ok := strings.CutPrefix(a, "--store="); ok {
			store, given = v, true
		} else if a == "--store" && i+1 < len(args) {
			store, given = args[i+1], true
			i++
		}
	}
	if !given {
		store = getenv("SLOTCTL_STORE")
	}
	return strings.HasPrefix(store, "etcd://") || isPostgresURL(store)
}
