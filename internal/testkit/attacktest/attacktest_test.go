//go:build linux

package attacktest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCast checks the stage itself: a member can write a 2770 directory and
// cannot delete root's file from a 3770 one; an outsider cannot enter;
// a snapshot notices a change.
func TestCast(t *testing.T) {
	e := New(t)
	shared := e.SharedDir("shared", Mode(0o2770))
	sticky := e.SharedDir("sticky", Mode(0o3770))
	e.Alice.Sh(t, shared, "echo hi > mine")
	if err := os.WriteFile(filepath.Join(sticky, "roots"), nil, 0o660); err != nil {
		t.Fatal(err)
	}
	r := Run(t, e.Alice.Command(sticky, nil, "rm", "-f", "roots"), 5e9)
	if r.Code == 0 {
		t.Fatalf("a member removed root's file from a sticky directory")
	}
	r = Run(t, e.Eve.Command(e.Base, nil, "ls", shared), 5e9)
	if r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
		t.Fatalf("an outsider listed the shared directory: %+v", r)
	}
	v := e.Targets(e.Bob)
	s := Take(t, v.All...)
	if err := os.WriteFile(v.Missing[1], nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ft := &testing.T{}
	s.Unchanged(ft)
	if !ft.Failed() {
		t.Fatal("a snapshot missed a created file")
	}
}
