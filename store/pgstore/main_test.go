package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
)

var dbs atomic.Int64

// testURL is a new empty database on $SLOTCTL_PG_URL's server.
func testURL(t *testing.T) string {
	base := os.Getenv("SLOTCTL_PG_URL")
	if base == "" {
		t.Skip("SLOTCTL_PG_URL not set")
	}
	conn := connect(t, base)
	name := fmt.Sprintf("pgstore_%d_%d", os.Getpid(), dbs.Add(1))
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := connect(t, base)
		c.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
	})
	return strings.Replace(base, "/postgres?", "/"+name+"?", 1)
}

func connect(t *testing.T, url string) *pgx.Conn {
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
