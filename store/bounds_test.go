package store

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestRequestTextBounds: every text a request stores has a bound, and a
// request over one is refused with ErrInvalid before anything is written.
func TestRequestTextBounds(t *testing.T) {
	base := func() EnqueueRequest {
		return EnqueueRequest{ID: "t1", Limit: "x", Slots: 1, TTL: time.Minute,
			Holder: Holder{Host: "h", User: "u", BootID: strings.Repeat("b", 36), Pid: 1, Argv: []string{"make"}, Label: "l", URL: "https://ci/1"}}
	}
	if err := base().Check(); err != nil {
		t.Fatalf("the base request: %v", err)
	}
	long := func(n int) string { return strings.Repeat("a", n) }
	cases := map[string]func(r *EnqueueRequest){
		"host":              func(r *EnqueueRequest) { r.Holder.Host = long(MaxHost + 1) },
		"user":              func(r *EnqueueRequest) { r.Holder.User = long(MaxUser + 1) },
		"boot id":           func(r *EnqueueRequest) { r.Holder.BootID = long(MaxBootID + 1) },
		"label":             func(r *EnqueueRequest) { r.Holder.Label = long(MaxLabel + 1) },
		"command line":      func(r *EnqueueRequest) { r.Holder.Argv = []string{"sh", "-c", long(MaxCommand)} },
		"many arguments":    func(r *EnqueueRequest) { r.Holder.Argv = make([]string, MaxCommand+1) },
		"url":               func(r *EnqueueRequest) { r.Holder.URL = long(MaxURL + 1) },
		"key":               func(r *EnqueueRequest) { r.Key = long(MaxKey + 1) },
		"slots over limits": func(r *EnqueueRequest) { r.Limits, r.Weight, r.Slots = []string{"x", "y"}, MaxSlots, MaxSlots },
	}
	for name, change := range cases {
		r := base()
		change(&r)
		if err := r.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s over its bound: Check = %v, want ErrInvalid", name, err)
		}
	}
	r := base()
	r.Holder.Host, r.Holder.Label, r.Holder.Argv = long(MaxHost), long(MaxLabel), []string{long(MaxCommand - 1)}
	if err := r.Check(); err != nil {
		t.Errorf("every field at its bound: %v", err)
	}
}

// TestCutArgv: a command line over MaxCommand is kept cut, marked, within
// the bound, and never split inside a character.
func TestCutArgv(t *testing.T) {
	short := []string{"make", "-j8"}
	if got := CutArgv(short); len(got) != 2 || got[0] != "make" {
		t.Errorf("CutArgv(%q) = %q, want it unchanged", short, got)
	}
	for _, argv := range [][]string{
		{"sh", "-c", strings.Repeat("x", 10000)},
		{"sh", "-c", strings.Repeat("é", 5000)},
		make([]string, 10000),
		{strings.Repeat("y", MaxCommand)},
	} {
		got := CutArgv(argv)
		if n := CommandBytes(got); n > MaxCommand {
			t.Errorf("cut command line of %d bytes: want at most %d", n, MaxCommand)
		}
		if got[len(got)-1] != "…" {
			t.Errorf("cut command line does not end with …: %q", got[len(got)-1])
		}
		for _, a := range got {
			if !utf8.ValidString(a) {
				t.Errorf("argument %q was cut inside a character", a)
			}
		}
		if err := CheckHolder(Holder{Argv: got}); err != nil {
			t.Errorf("a cut command line is refused: %v", err)
		}
	}
}

// TestEventTextBounds: an event's text is bounded as a ticket's is.
func TestEventTextBounds(t *testing.T) {
	for name, e := range map[string]Event{
		"host":     {Host: strings.Repeat("h", MaxHost+1)},
		"user":     {User: strings.Repeat("u", MaxUser+1)},
		"evidence": {Evidence: strings.Repeat("e", MaxEvidence+1)},
	} {
		if err := CheckEventText(e); !errors.Is(err, ErrInvalid) {
			t.Errorf("event %s over its bound: %v, want ErrInvalid", name, err)
		}
	}
	// A command line stored whole (as records written before MaxCommand
	// have it) still reads.
	long := Holder{Argv: []string{strings.Repeat("c", 8*MaxCommand)}}
	if err := CheckEventText(Event{Command: long.Command()}); err != nil {
		t.Errorf("an event of a long command line: %v", err)
	}
	if err := CheckStoredHolder(long); err != nil {
		t.Errorf("a stored holder of a long command line: %v", err)
	}
}
