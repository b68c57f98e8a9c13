package cli

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

// versionInfo is the stamped version, or what the Go toolchain recorded
// when built with go install (no ldflags).
func (f *Factory) versionInfo() (version, commit, date string) {
	version, commit, date = f.Version, f.Commit, f.Date
	if bi, ok := debug.ReadBuildInfo(); ok {
		if version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && commit == "":
				commit = s.Value
			case s.Key == "vcs.time" && date == "":
				date = s.Value
			}
		}
	}
	if commit != "" && date != "" {
		// A release build: nothing to read from the version.
	} else if rev, when, ok := pseudoVersion(version); ok {
		// go install ...@main (or a commit): no VCS stamp, but the
		// pseudo-version names the commit (a 12-digit prefix) and its time.
		if commit == "" {
			commit = rev
		}
		if date == "" {
			date = when
		}
	}
	if version == "" {
		version = "devel"
	}
	if commit == "" {
		commit = "unknown"
	}
	if date == "" {
		date = "unknown"
	}
	return version, commit, date
}

func (f *Factory) versionString() string {
	v, c, d := f.versionInfo()
	return fmt.Sprintf("slotctl %s (commit %s, built %s, %s)", v, c, d, runtime.Version())
}

// VersionOptions is what slotctl version prints.
type VersionOptions struct {
	Version string // "slotctl v1.2.3 (commit ..., built ..., go1.26)"
}

func newVersionCmd(f *Factory, runF func(*VersionOptions) error) *cobra.Command {
	o := &VersionOptions{}
	return &cobra.Command{
		Use:   "version",
		Short: "Print slotctl's version, commit, build date and Go version",
		Long: `Print slotctl's version, the commit it was built from, the build date and
the Go version, as slotctl --version does. A release build has them stamped
in; a binary built with go install reports the module version and what the
Go toolchain recorded.`,
		Annotations: manPage(`EXIT STATUS
  0    printed`),
		Example: `  slotctl version
  slotctl --version`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Version = f.versionString()
			if runF != nil {
				return runF(o)
			}
			_, err := fmt.Fprintln(f.IO.Out, o.Version)
			return err
		},
	}
}

// pseudoVersionTail is the end of a Go pseudo-version: -/.yyyymmddhhmmss-rev.
// Compiled on first use, not at start-up: every command computes the
// version string, and a release build never needs it.
var pseudoVersionTail = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`[-.](\d{14})-([0-9a-f]{12})(\+incompatible)?$`)
})

// pseudoVersion reads the commit prefix and commit time (UTC, RFC 3339) from
// a pseudo-version such as v0.0.0-20261129182144-bb471878d94c.
func pseudoVersion(v string) (rev, date string, ok bool) {
	m := pseudoVersionTail().FindStringSubmatch(v)
	if m == nil {
		return "", "", false
	}
	t, err := time.Parse("20060102150405", m[1])
	if err != nil {
		return "", "", false
	}
	return m[2], t.UTC().Format(time.RFC3339), true
}
