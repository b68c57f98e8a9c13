package cli

import (
	"context"
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/slotctl/slotctl/gate/holder"
	"github.com/slotctl/slotctl/gate/jobserver"
	"github.com/slotctl/slotctl/store"
)

// defaultJobserverStyle is auto: the style the command's client reads
// (jobclient.go). Of the two, the pipe style is taken when both are read:
// every make since 4.2 and every cargo read it, while GNU make 4.3 (Debian
// 12, Ubuntu 22.04 and 24.04) stops at once on a fifo and cargo 1.65
// ignores one.
const defaultJobserverStyle = autoJobserverStyle

func addJobserverFlags(cmd *cobra.Command, o *RunOptions) {
	fl := cmd.Flags()
	fl.BoolVar(&o.Jobserver, "jobserver", false, "be COMMAND's GNU make jobserver: its parallel jobs are extra slots of the limit (run make without -j)")
	fl.StringVar(&o.JobserverStyle, "jobserver-style", defaultJobserverStyle, "how COMMAND finds the jobserver: auto (what make, cargo or ninja reads), pipe (make 4.2+, cargo) or fifo (make 4.4+, cargo 1.95+, ninja 1.13+)")
	fl.IntVar(&o.JobserverMax, "jobserver-max", 0, "most slots the job takes, its first included, and make's -j (default: the limit's size, at most the host's CPUs)")
	_ = cmd.RegisterFlagCompletionFunc("jobserver-style", cobra.FixedCompletions([]string{"auto", "pipe", "fifo"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("jobserver-max", cobra.NoFileCompletions)
}

// resolveJobserver checks the jobserver flags (docs/leases.md §7: one line
// naming the input and what would be accepted).
func (o *RunOptions) resolveJobserver(cmd *cobra.Command) error {
	fl := cmd.Flags()
	switch o.JobserverStyle {
	case autoJobserverStyle, string(jobserver.Pipe), string(jobserver.FIFO):
	default:
		return usageError("--jobserver-style %s: want auto, pipe or fifo", quoteInput(o.JobserverStyle))
	}
	if fl.Changed("jobserver-max") && (o.JobserverMax < 1 || o.JobserverMax > store.MaxSlots) {
		return usageError("--jobserver-max %d: want 1..%d (the most slots the job takes; default: the limit's size, at most the host's CPUs)", o.JobserverMax, store.MaxSlots)
	}
	if !o.Jobserver {
		for _, name := range []string{"jobserver-style", "jobserver-max"} {
			if fl.Changed(name) {
				return usageError("--%s needs --jobserver", name)
			}
		}
		o.JobserverStyle = "" // no jobserver, no style
		return nil
	}
	if fl.Changed("weight") && o.Weight != 1 {
		return usageError("--weight %d with --jobserver: the jobserver sizes the weight; bound it with --jobserver-max", o.Weight)
	}
	return nil
}

// startJobserved starts COMMAND with slotctl as its jobserver: the server
// runs while the child does, and its Drain stops the server once the job's
// group is gone, before the holder releases the ticket (drain before
// release; the release frees every slot the ticket took). jobCtx ends when
// the lease is lost, and the server with it.
func startJobserved(jobCtx context.Context, f *Factory, st store.Store, log *logger, o *RunOptions, path string, env []string, t store.Ticket) (holder.Child, error) {
	js, err := jobserver.Open(jobCtx, jobserver.Config{
		Store: st, Ticket: t, Max: o.JobserverMax, Cap: f.cpus(), Style: jobserver.Style(o.JobserverStyle),
		Logf: log.verbose,
	})
	if err != nil {
		return nil, fmt.Errorf("start the jobserver: %w", err)
	}
	env = append(env, "MAKEFLAGS="+js.MakeFlags(f.Getenv("MAKEFLAGS")))
	c, err := startChildFiles(f, path, o.Argv, env, log, js.ChildFiles())
	js.CloseChildFiles()
	if err != nil {
		js.Close()
		return nil, err
	}
	log.verbose("jobserver: %s style, up to %s (-j%d)", o.JobserverStyle, plural(js.Max(), "slot"), js.Max())
	js.Start(jobCtx)
	return &jobservedChild{child: c, js: js, log: log}, nil
}

// jobservedChild is the child of a --jobserver run: the jobserver stops
// when the child is drained.
type jobservedChild struct {
	*child
	js  *jobserver.Server
	log *logger
}

// Close implements holder.Child: the job is gone, then the jobserver.
func (c *jobservedChild) Close() {
	c.child.Close()
	c.js.Close()
	st := c.js.Stats()
	c.log.verbose("jobserver: took up to %s, %d taken and %d given back", plural(st.MaxWeight, "slot"), st.Grown, st.Shrunk)
}

// cpus is how many CPUs this process may run on: the bound of a build's
// jobs unless --jobserver-max says otherwise (docs/leases.md §2.1 item 12).
func (f *Factory) cpus() int {
	if f.CPUs != nil {
		return f.CPUs()
	}
	return runtime.NumCPU() // the CPUs of the process's affinity mask
}
