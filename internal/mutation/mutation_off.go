//go:build !slotctl_mutations

package mutation

import (
	"errors"
	"strings"

	"github.com/slotctl/slotctl/internal/nobugs"
)

// Enabled reports whether this build can switch bugs on (the build tag
// slotctl_mutations).
const Enabled = false

// A Bug is one known defect that the design prevents. Without the tag it
// is a plain string, so that no type of this package is left in a binary.
type Bug = string

// A Set is the bugs switched on: without the tag, none, and Has is a
// constant false. It is a type of another package (see nobugs).
type Set = nobugs.Set

// has is Set.Has called from this package. Its inlinable body puts Has's
// body in this package's export data: without it a package that reaches
// nobugs.Set only through the alias above does not inline s.Has(b), and the
// code it guards stays in the binary (go1.26; TestNoMutationSymbols in
// cmd/internal/cli fails if that happens).
func has(s Set, b Bug) bool { return s.Has(b) }

// InStore is the part of s switched in the store: none.
func InStore(Set) Set { return Set{} }

// String lists the bugs switched on, comma-separated: none.
func String(Set) string { return "" }

// Parse reads a comma-separated list of bug names ("" is none). Without
// the tag any name is an error.
func Parse(list string) (Set, error) {
	if strings.Trim(list, ", ") != "" {
		return Set{}, errors.New("mutations need the build tag: go test -tags slotctl_mutations")
	}
	return Set{}, nil
}
