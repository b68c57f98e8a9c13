package storetest_test

import (
	"os"
	"testing"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// TestMain kills whatever the tests started that outlived them.
func TestMain(m *testing.M) { os.Exit(testguard.Main(m)) }
