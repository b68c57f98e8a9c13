package cli

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/slotctl/slotctl/gate/jobserver"
)

// autoJobserverStyle picks the style the command's client reads.
const autoJobserverStyle = "auto"

// jobClient is a jobserver client slotctl knows by its command's name,
// with the version it says it is (known false when it would not say).
type jobClient struct {
	name         string // "make", "cargo", "ninja"; "" for any other command
	major, minor int
	known        bool
}

func (c jobClient) String() string {
	if !c.known {
		return c.name
	}
	return fmt.Sprintf("%s %d.%d", c.name, c.major, c.minor)
}

func (c jobClient) atLeast(major, minor int) bool {
	return c.major > major || c.major == major && c.minor >= minor
}

// clientStyles are the styles each client reads, by version, as far as
// they were tried (docs/jobserver.md, "Styles"). A client that reads
// neither runs its own jobs beside the limit's: the limit would not bound
// the build at all.
//   - make: --jobserver-auth=R,W from 4.2 (before it, --jobserver-fds);
//     fifo: from 4.4 (4.3 stops at once on it).
//   - ninja: fifo only, from 1.13 (before it, no jobserver client).
//   - cargo: the pipe style in every version; the fifo style is ignored by
//     cargo 1.65 (Debian 12: it ran its own -j beside a one-slot limit) and
//     read by 1.95; the versions between were not tried, so the fifo style
//     is handed to cargo only from 1.95.
func (c jobClient) reads(s jobserver.Style) (ok, sure bool) {
	if !c.known {
		return true, false
	}
	switch c.name {
	case "make":
		if s == jobserver.FIFO {
			return c.atLeast(4, 4), true
		}
		return c.atLeast(4, 2), true
	case "ninja":
		return s == jobserver.FIFO && c.atLeast(1, 13), true
	case "cargo":
		return s == jobserver.Pipe || c.atLeast(1, 95), true
	}
	return true, false
}

// clientNames are the commands whose version is asked for, by the name
// they run under.
var clientNames = map[string]string{"make": "make", "gmake": "make", "cargo": "cargo", "ninja": "ninja"}

// clientVersion finds the version in the first line of --version: "GNU
// Make 4.3", "cargo 1.65.0", "cargo 1.95.0 (f2d3ce0bd 2026-03-21)",
// "1.12.1" (ninja).
var clientVersion = regexp.MustCompile(`(?:^|\s)(\d+)\.(\d+)`)

// probeJobClient asks the command at path, run as argv0, for its version
// when its name is one of clientNames: one short run of "path --version",
// bounded, before the run takes its slot. A command that does not answer
// in time or says something else is taken as unknown.
func probeJobClient(ctx context.Context, argv0, path string) jobClient {
	name := clientNames[filepath.Base(argv0)]
	if name == "" {
		return jobClient{}
	}
	c := jobClient{name: name}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		return c
	}
	line, _, _ := bytes.Cut(out, []byte("\n"))
	m := clientVersion.FindSubmatch(line)
	if m == nil {
		return c
	}
	c.major, _ = strconv.Atoi(string(m[1]))
	c.minor, _ = strconv.Atoi(string(m[2]))
	c.known = true
	return c
}

// probeTimeout bounds the --version run: a loaded machine starts cargo's
// rustup proxy in well under that.
const probeTimeout = 5 * time.Second

// chooseJobserverStyle settles the style: auto takes the pipe style when
// the client reads it and else the fifo style; a style the client is known
// not to read is refused before the run waits (exit 64), since the build
// would run its own jobs beside the limit's.
func chooseJobserverStyle(requested string, c jobClient) (jobserver.Style, error) {
	if requested != autoJobserverStyle {
		s := jobserver.Style(requested)
		if ok, sure := c.reads(s); !ok && sure {
			return "", usageError("--jobserver-style %s: %s does not read it (%s): use %s", requested, c, clientNeeds(c.name, s), otherStyle(c, s))
		}
		return s, nil
	}
	for _, s := range []jobserver.Style{jobserver.Pipe, jobserver.FIFO} {
		if ok, _ := c.reads(s); ok {
			return s, nil
		}
	}
	return "", usageError("--jobserver: %s reads no jobserver slotctl can be (%s): it would run its own jobs beside the limit's; upgrade it, or run it without --jobserver", c, clientNeeds(c.name, ""))
}

// clientNeeds says which versions of a client read a style ("" for any).
func clientNeeds(name string, s jobserver.Style) string {
	switch {
	case name == "make" && s == jobserver.FIFO:
		return "GNU make reads the fifo style from 4.4"
	case name == "make":
		return "GNU make reads the pipe style from 4.2"
	case name == "ninja" && s == jobserver.Pipe:
		return "ninja reads only the fifo style"
	case name == "ninja":
		return "ninja reads the fifo style from 1.13"
	case name == "cargo":
		return "cargo 1.65 ignores the fifo style; it is handed to cargo from 1.95"
	}
	return ""
}

// otherStyle is the advice for a refused style: the other one when the
// client reads it, else to leave the flag out.
func otherStyle(c jobClient, refused jobserver.Style) string {
	other := jobserver.Pipe
	if refused == jobserver.Pipe {
		other = jobserver.FIFO
	}
	if ok, _ := c.reads(other); ok {
		return "--jobserver-style " + string(other)
	}
	return "a newer " + c.name + ", or no --jobserver"
}
