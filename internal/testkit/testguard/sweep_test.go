package testguard

import (
	"slices"
	"testing"
)

// TestSweepNeedsTwoEmptyScans: Kill's loop, fed scripted scans, goes on
// past one empty scan (a process mid-exec reads as empty once) and stops at
// the second in a row; each process found is signalled every time it is
// seen, and returned once.
func TestSweepNeedsTwoEmptyScans(t *testing.T) {
	a, b := Proc{Pid: 101, Argv: "a"}, Proc{Pid: 102, Argv: "b"}
	for _, c := range []struct {
		name    string
		scans   [][]Proc
		signals []int
		found   []Proc
	}{
		{"reappears after one empty scan", [][]Proc{{a}, {}, {b}, {}, {}}, []int{101, 102}, []Proc{a, b}},
		{"empty first", [][]Proc{{}, {a}, {}, {}}, []int{101}, []Proc{a}},
		{"seen twice", [][]Proc{{a}, {a, b}, {}, {}}, []int{101, 101, 102}, []Proc{a, b}},
		{"nothing", [][]Proc{{}, {}}, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			scan := func(mark string) []Proc {
				if mark != "m" {
					t.Errorf("scanned %q, want the scope's mark m", mark)
				}
				calls++
				if calls > len(c.scans) {
					t.Fatalf("scan %d: Kill scans on after two empty scans in a row", calls)
				}
				return c.scans[calls-1]
			}
			var signals []int
			found := sweep("m", scan, func(pid int) { signals = append(signals, pid) })
			if calls != len(c.scans) {
				t.Errorf("Kill scanned %d times, want %d (it stops at the second empty scan in a row)", calls, len(c.scans))
			}
			if !slices.Equal(signals, c.signals) {
				t.Errorf("signalled %v, want %v", signals, c.signals)
			}
			if !slices.Equal(found, c.found) {
				t.Errorf("returned %v, want %v", found, c.found)
			}
		})
	}
}
