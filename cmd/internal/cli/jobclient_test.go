package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slotctl/slotctl/gate/jobserver"
)

// TestChooseJobserverStyle: auto takes the style the client reads; a style
// it is known not to read is refused with one line that says which
// versions read it and what to use instead.
func TestChooseJobserverStyle(t *testing.T) {
	v := func(name string, major, minor int) jobClient { return jobClient{name, major, minor, true} }
	for _, c := range []struct {
		requested string
		client    jobClient
		want      jobserver.Style
		refusal   string
	}{
		{"auto", v("make", 4, 3), jobserver.Pipe, ""},
		{"auto", v("make", 4, 4), jobserver.Pipe, ""},
		{"auto", v("make", 4, 1), "", "--jobserver: make 4.1 reads no jobserver slotctl can be (GNU make reads the pipe style from 4.2): it would run its own jobs beside the limit's; upgrade it, or run it without --jobserver"},
		{"auto", v("ninja", 1, 13), jobserver.FIFO, ""},
		{"auto", v("ninja", 1, 12), "", "--jobserver: ninja 1.12 reads no jobserver slotctl can be (ninja reads the fifo style from 1.13): it would run its own jobs beside the limit's; upgrade it, or run it without --jobserver"},
		{"auto", v("cargo", 1, 65), jobserver.Pipe, ""},
		{"auto", jobClient{name: "ninja"}, jobserver.Pipe, ""}, // would not say its version: as any command
		{"auto", jobClient{}, jobserver.Pipe, ""},
		{"fifo", v("make", 4, 3), "", "--jobserver-style fifo: make 4.3 does not read it (GNU make reads the fifo style from 4.4): use --jobserver-style pipe"},
		{"fifo", v("make", 4, 4), jobserver.FIFO, ""},
		{"fifo", v("cargo", 1, 65), "", "--jobserver-style fifo: cargo 1.65 does not read it (cargo 1.65 ignores the fifo style; it is handed to cargo from 1.95): use --jobserver-style pipe"},
		{"fifo", v("cargo", 1, 95), jobserver.FIFO, ""},
		{"pipe", v("ninja", 1, 13), "", "--jobserver-style pipe: ninja 1.13 does not read it (ninja reads only the fifo style): use --jobserver-style fifo"},
		{"pipe", v("make", 4, 1), "", "--jobserver-style pipe: make 4.1 does not read it (GNU make reads the pipe style from 4.2): use a newer make, or no --jobserver"},
		{"fifo", jobClient{}, jobserver.FIFO, ""}, // any other command: as asked
		{"pipe", jobClient{name: "make"}, jobserver.Pipe, ""},
	} {
		got, err := chooseJobserverStyle(c.requested, c.client)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if got != c.want || msg != c.refusal {
			t.Errorf("chooseJobserverStyle(%s, %v) = %q, %q; want %q, %q", c.requested, c.client, got, msg, c.want, c.refusal)
		}
	}
}

// TestProbeJobClient reads the first line of --version as each client
// writes it, and takes a command that fails or says nothing useful as
// unknown.
func TestProbeJobClient(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, out string
		want      jobClient
	}{
		{"make", "GNU Make 4.3\nBuilt for x86_64-pc-linux-gnu\nCopyright (C) 1988-2020", jobClient{"make", 4, 3, true}},
		{"gmake", "GNU Make 4.4.1", jobClient{"make", 4, 4, true}},
		{"cargo", "cargo 1.65.0", jobClient{"cargo", 1, 65, true}},
		{"cargo", "cargo 1.95.0 (f2d3ce0bd 2026-03-21)", jobClient{"cargo", 1, 95, true}},
		{"ninja", "1.12.1", jobClient{"ninja", 1, 12, true}},
		{"ninja", "not a version", jobClient{name: "ninja"}},
		{"sh", "5.2", jobClient{}},
	} {
		path := filepath.Join(dir, c.name)
		script := "#!/bin/sh\nprintf '%s\\n' '" + strings.ReplaceAll(c.out, "\n", "' '") + "'\n"
		if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		if got := probeJobClient(context.Background(), c.name, path); got != c.want {
			t.Errorf("%s printing %q: %+v, want %+v", c.name, c.out, got, c.want)
		}
	}
	fail := filepath.Join(dir, "failing")
	if err := os.WriteFile(fail, []byte("#!/bin/sh\necho 'GNU Make 4.4'; exit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := probeJobClient(context.Background(), "make", fail); got.known {
		t.Errorf("a make whose --version fails: %+v, want its version unknown", got)
	}
}
