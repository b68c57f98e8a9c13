// Package nobugs is what internal/mutation's Set is in a build without the
// tag slotctl_mutations (every build but the mutation tests'): no bug
// switched on, and Has a constant false, so the compiler drops the code it
// guards.
//
// It lives outside internal/mutation because a struct field's type stays in
// a binary's type data, with its exported methods (the linker keeps those
// of any type reflection can reach): a Set of package mutation would leave
// "mutation" symbols in the released binary. This type is all that
// remains of the switches there: an empty struct with one method.
package nobugs

// Set switches no bug on.
type Set struct{}

// Has reports whether bug is switched on: never.
func (Set) Has(bug string) bool { return false }
