package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"
)

// noPreRun replaces the root's config loading for the generators: their
// output must not depend on the machine's config file or environment.
func noPreRun(*cobra.Command, []string) error { return nil }

// CompletionOptions are slotctl completion's flags and argument.
type CompletionOptions struct {
	Shell          string // bash, zsh, fish or powershell
	Output         string // "" or "-": standard output
	NoDescriptions bool
}

// completionShells are the shells slotctl writes completion scripts for.
var completionShells = []string{"bash", "zsh", "fish", "powershell"}

// newCompletionCmd replaces cobra's default completion command with one that
// can write to a file (-o), since go:generate has no shell redirection.
func newCompletionCmd(f *Factory, runF func(*CompletionOptions) error) *cobra.Command {
	o := &CompletionOptions{}
	cmd := &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Print the shell completion script for bash, zsh, fish or PowerShell",
		Long: `Print the shell's completion script to standard output, or to FILE with -o.
Completion covers commands, flags, limit names and ticket ids. The deb and
rpm packages install the bash, zsh and fish scripts; with go install or an
archive, put it where your shell looks for it (see the examples).`,
		Annotations: manPage(`Print the shell's completion script to standard output, or to FILE with -o.
Completion covers commands, flags, limit names (from the store and the config
file) and ticket ids (from the store).

The deb and rpm packages install the bash, zsh and fish scripts where those
shells look for them; with go install or an archive, set it up yourself:

  bash   source <(slotctl completion bash)     in ~/.bashrc, or
         slotctl completion bash -o ~/.local/share/bash-completion/completions/slotctl
  zsh    slotctl completion zsh -o "${fpath[1]}/_slotctl"
         (compinit must run in ~/.zshrc)
  fish   slotctl completion fish -o ~/.config/fish/completions/slotctl.fish
  PowerShell
         slotctl completion powershell | Out-String | Invoke-Expression
         in your profile

EXIT STATUS
  0    written
  64   unknown shell or bad flag
  73   FILE cannot be written`),
		Example: `  source <(slotctl completion bash)
  slotctl completion zsh -o "${fpath[1]}/_slotctl"
  slotctl completion fish --no-descriptions -o ~/.config/fish/completions/slotctl.fish
  slotctl completion powershell | Out-String | Invoke-Expression`,
		ValidArgs:         completionShells,
		PersistentPreRunE: noPreRun,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errArgs(cmd, "want one shell: bash, zsh, fish or powershell")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Shell = args[0]
			if !slices.Contains(completionShells, o.Shell) {
				return errArgs(cmd, "shell %q: want bash, zsh, fish or powershell", o.Shell)
			}
			if runF != nil {
				return runF(o)
			}
			return runCompletion(f, cmd.Root(), o)
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "write the script to `FILE` instead of standard output")
	cmd.Flags().BoolVar(&o.NoDescriptions, "no-descriptions", false, "leave out the descriptions of the suggestions")
	return cmd
}

// runCompletion writes root's completion script for o.Shell.
func runCompletion(f *Factory, root *cobra.Command, o *CompletionOptions) error {
	var buf bytes.Buffer
	var err error
	desc := !o.NoDescriptions
	switch o.Shell {
	case "bash":
		err = root.GenBashCompletionV2(&buf, desc)
	case "zsh":
		if desc {
			err = root.GenZshCompletion(&buf)
		} else {
			err = root.GenZshCompletionNoDesc(&buf)
		}
	case "fish":
		err = root.GenFishCompletion(&buf, desc)
	case "powershell":
		if desc {
			err = root.GenPowerShellCompletionWithDesc(&buf)
		} else {
			err = root.GenPowerShellCompletion(&buf)
		}
	default:
		return usageError("shell %q: want bash, zsh, fish or powershell", o.Shell)
	}
	if err != nil {
		return err
	}
	return writeOutput(f, o.Output, buf.Bytes())
}

// writeOutput writes b to the file named path (creating its directory), or
// to standard output if path is "" or "-".
func writeOutput(f *Factory, path string, b []byte) error {
	if path == "" || path == "-" {
		_, err := f.IO.Out.Write(b)
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return &ExitError{Code: exitCantCreate, Err: fmt.Errorf("write %s: %w", path, unwrapPathError(err))}
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return &ExitError{Code: exitCantCreate, Err: fmt.Errorf("write %s: %w", path, unwrapPathError(err))}
	}
	return nil
}

// exitCantCreate is sysexits' EX_CANTCREAT: an output file cannot be written.
const exitCantCreate = 73
