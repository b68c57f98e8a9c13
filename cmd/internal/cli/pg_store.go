package cli

// The PostgreSQL store. Like the etcd client, the PostgreSQL driver (and
// the TLS it brings) is linked in only by slotctl-etcd, which registers it
// (RegisterPostgres, with cmd/internal/pgcli); slotctl hands postgres://
// stores to slotctl-etcd (etcd_dispatch.go).

import (
	"errors"
	"strings"
	"time"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// PostgresOpener opens a postgres:// store: its URL (libpq's form), how
// long a step may wait for the store's lock, and the judge that proves
// holders dead on this host. Nothing is sent yet.
type PostgresOpener func(url string, timeout time.Duration, judge store.Judge) (store.Store, error)

// postgresOpen is the registered driver; nil in slotctl.
var postgresOpen PostgresOpener

// RegisterPostgres links the PostgreSQL driver in. Call it before Main.
func RegisterPostgres(o PostgresOpener) { postgresOpen = o }

// isPostgresURL reports whether a store URL names PostgreSQL.
func isPostgresURL(url string) bool {
	return strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://")
}

// openPostgres opens a postgres:// store, or hands the command to
// slotctl-etcd. The password comes from the URL, PGPASSWORD or ~/.pgpass,
// as for psql; its judge kills nobody (a shared store's records never
// authorise a kill).
func (f *Factory) openPostgres(g *globalOptions, url string) (store.Store, error) {
	if postgresOpen == nil {
		return nil, execEtcdHelper(url)
	}
	st, err := postgresOpen(url, g.StoreTimeout, proc.Dead)
	if errors.Is(err, store.ErrInvalid) {
		return nil, &ExitError{Code: exitUsage, Err: err}
	}
	return st, err
}
