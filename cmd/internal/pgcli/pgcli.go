// Package pgcli links the PostgreSQL store into the command: slotctl-etcd
// (and the command's tests) register Open with cli.RegisterPostgres.
// cmd/slotctl does not import it and hands postgres:// stores to
// slotctl-etcd.
package pgcli

import (
	"context"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/pgstore"
)

// Open opens the store at url; nothing is sent until its first step.
func Open(url string, timeout time.Duration, judge store.Judge) (store.Store, error) {
	return pgstore.Open(context.Background(), url, pgstore.Options{Timeout: timeout, Judge: judge})
}
