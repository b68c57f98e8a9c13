package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/slotctl/slotctl/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testURL is a new empty database.
func testURL(t *testing.T) string { return pgtest.URL(t) }

func connect(t *testing.T, url string) *pgx.Conn {
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
