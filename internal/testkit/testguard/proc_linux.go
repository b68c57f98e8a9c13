//go:build linux

package testguard

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// find reads every process's environment for the mark (or a mark below
// it); a zombie's environment reads empty, so the dead are not listed.
func find(mark string) []Proc {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	want := []byte(Var + "=" + mark)
	self := os.Getpid()
	var found []Proc
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + n + "/environ")
		if err != nil || !carries(env, want) {
			continue
		}
		argv, _ := os.ReadFile("/proc/" + n + "/cmdline")
		found = append(found, Proc{Pid: pid, Argv: strings.TrimSpace(strings.ReplaceAll(string(argv), "\x00", " "))})
	}
	return found
}

// carries reports whether env (NUL-separated) holds want as a whole entry,
// or want followed by a '.' (a scope below it).
func carries(env, want []byte) bool {
	for len(env) > 0 {
		entry, rest, _ := bytes.Cut(env, []byte{0})
		if bytes.HasPrefix(entry, want) && (len(entry) == len(want) || entry[len(want)] == '.') {
			return true
		}
		env = rest
	}
	return false
}

func kill(mark string) []Proc {
	return sweep(mark, find, func(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL) })
}
