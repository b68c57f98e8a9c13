package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// sharedStoreDir is the system-wide store directory: when it exists (the
// package creates it, group slotctl, mode 2770), every user's jobs share it.
const sharedStoreDir = "/var/lib/slotctl"

// defaultStorePath is SPEC §5's default: the shared directory if present,
// else the user's own state directory.
func (f *Factory) defaultStorePath() string {
	if st, err := os.Stat(sharedStoreDir); err == nil && st.IsDir() {
		return filepath.Join(sharedStoreDir, "slots.db")
	}
	state := f.Getenv("XDG_STATE_HOME")
	if state == "" {
		home := f.Getenv("HOME")
		if home == "" {
			home, _ = os.UserHomeDir()
		}
		state = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(state, "slotctl", "slots.db")
}

// openStore resolves the --store URL (SPEC §5) into a store. Nothing is
// opened yet: the bbolt file is opened per operation.
func (f *Factory) openStore(g *globalOptions) (store.Store, error) {
	url := g.Store
	var path string
	switch {
	case url == "":
		path = f.defaultStorePath()
	case strings.HasPrefix(url, "bolt://"):
		path = strings.TrimPrefix(url, "bolt://")
	case strings.HasPrefix(url, "etcd://"):
		return nil, usageError("store %q: the etcd backend is not in this build yet; use a path or bolt://PATH", url)
	case strings.Contains(url, "://"):
		scheme, _, _ := strings.Cut(url, "://")
		return nil, usageError("store %q: unknown scheme %q: want PATH, bolt://PATH or etcd://HOST:PORT[/PREFIX]", url, scheme)
	default:
		path = url
	}
	if path == "" {
		return nil, usageError("store %q: empty path: want PATH, bolt://PATH or etcd://HOST:PORT[/PREFIX]", url)
	}
	return boltstore.New(path, boltstore.Options{Timeout: g.StoreTimeout, Clock: f.StoreClock, Dead: proc.Dead})
}
