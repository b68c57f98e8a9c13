package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackagedUnitsLeaveOthersIPC: no packaged unit sets RemoveIPC=. When a
// unit stops, systemd removes every System V and POSIX IPC object owned by
// the unit's user or group, whoever made it: the reaper's Group=slotctl
// would take those of every member whose primary group is slotctl, the
// metrics unit's Group=prometheus those of the node exporter. Each unit has
// an IPC namespace of its own instead.
func TestPackagedUnitsLeaveOthersIPC(t *testing.T) {
	units, err := filepath.Glob("../../../packaging/systemd/*.service")
	if err != nil || len(units) == 0 {
		t.Fatalf("no packaged units: %v", err)
	}
	for _, unit := range units {
		b, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		private := false
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
			if !ok || strings.HasPrefix(k, "#") {
				continue
			}
			switch strings.TrimSpace(k) {
			case "RemoveIPC":
				if v := strings.ToLower(strings.TrimSpace(v)); v != "" && v != "no" && v != "false" && v != "off" && v != "0" {
					t.Errorf("%s: %s: stopping the unit removes the IPC objects of everyone of its user and group", filepath.Base(unit), line)
				}
			case "PrivateIPC":
				private = strings.TrimSpace(v) == "yes"
			}
		}
		if !private {
			t.Errorf("%s: no PrivateIPC=yes", filepath.Base(unit))
		}
	}
}
