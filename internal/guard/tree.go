//go:build linux

package guard

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// signalTree sends sig to every running descendant of root and returns how
// many it signalled. Each is signalled through a pidfd opened first and
// then checked to be root's descendant still, so a pid that was freed and
// handed to an unrelated process meanwhile is never hit.
func signalTree(root int, sig syscall.Signal) int {
	return signalTreeIf(root, sig, nil)
}

// signalTreeIf is signalTree for the descendants that match (nil: all),
// checked after the pidfd is opened.
func signalTreeIf(root int, sig syscall.Signal, match func(pid int) bool) int {
	n := 0
	for _, pid := range descendants(root) {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			if errors.Is(err, unix.ENOSYS) && descends(pid, root) && (match == nil || match(pid)) {
				// A kernel before 5.3: the check and the signal are apart.
				if unix.Kill(pid, sig) == nil {
					n++
				}
			}
			continue
		}
		if descends(pid, root) && (match == nil || match(pid)) && unix.PidfdSendSignal(fd, sig, nil, 0) == nil {
			n++
		}
		unix.Close(fd)
	}
	return n
}

// descendants lists the running (not exited) processes below root.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	kids := map[int][]int{}
	live := map[int]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, ok := stat(pid)
		if !ok {
			continue
		}
		kids[ppid] = append(kids[ppid], pid)
		live[pid] = state != 'Z' && state != 'X'
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range kids[p] {
			if live[c] {
				out = append(out, c)
			}
			queue = append(queue, c)
		}
	}
	return out
}

// descends reports whether pid is below root now.
func descends(pid, root int) bool {
	for range 4096 {
		ppid, _, ok := stat(pid)
		switch {
		case !ok || ppid <= 0:
			return false
		case ppid == root:
			return true
		}
		pid = ppid
	}
	return false
}

// stat reads a process's parent and state from /proc/PID/stat; the
// command name may hold spaces and parentheses, so fields count from the
// last ')'.
func stat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(string(f[1]))
	return ppid, f[0][0], err == nil
}

// carries reports whether process pid has kv in its environment.
func carries(pid int, kv string) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	for e := range bytes.SplitSeq(env, []byte{0}) {
		if string(e) == kv {
			return true
		}
	}
	return false
}
