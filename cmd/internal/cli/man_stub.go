//go:build !gendocs

package cli

import "github.com/spf13/cobra"

// extraCommands: the man page generator is only built with -tags gendocs (see man.go).
func extraCommands() []*cobra.Command { return nil }
