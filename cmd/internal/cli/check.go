package cli

// The checks that several commands make of their input, written once so
// that every command says the same thing about the same mistake (docs/leases.md §7:
// one line naming the input and what would be accepted).

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/store"
)

// limitNameWant is what a limit name may be: [A-Za-z0-9][A-Za-z0-9._:-]{0,127}.
const limitNameWant = "want 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit"

// checkLimitName refuses a bad limit name; what names the input in the
// message ("--limit", "limit", "limit name").
func checkLimitName(what, name string) error {
	if store.ValidLimitName(name) {
		return nil
	}
	return usageError("%s %q: %s", what, name, limitNameWant)
}

// checkLimitNames is checkLimitName for each of names (positional LIMIT arguments).
func checkLimitNames(what string, names []string) error {
	for _, n := range names {
		if err := checkLimitName(what, n); err != nil {
			return err
		}
	}
	return nil
}

// Output formats of the data commands' -o flag.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
)

// addOutputFlag adds -o/--output, table by default, to a data command.
func addOutputFlag(cmd *cobra.Command, p *string, usage string) {
	cmd.Flags().StringVarP(p, "output", "o", outTable, usage)
}

// checkOutput refuses an -o that is not one of formats.
func checkOutput(o string, formats ...string) error {
	for _, f := range formats {
		if o == f {
			return nil
		}
	}
	return usageError("-o %q: want %s", o, orList(formats))
}

// orList is "a", "a or b", "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
