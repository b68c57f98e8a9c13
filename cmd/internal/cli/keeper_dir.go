package cli

// The keepers' directories after their keepers: release removes the one it
// released; a keeper that ended otherwise (--max-hold, --bind-pid, a lost
// lease, SIGKILL) cannot be relied on to remove its own, so every acquire
// and release sweeps this user's slotctl-UID of the directories whose
// processes are all provably gone (docs/acquire.md, Where things live).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
)

// The files that name the processes using a keeper's directory.
const (
	acquireID = "acquire.id" // acquire and the keeper's slotctl run
	keeperID  = "keeper.id"  // the keeper and its slotctl run
)

// keeperDirPrefix begins the name of every keeper's directory in the base.
const keeperDirPrefix = "acquire-"

// keeperFiles are the names slotctl makes in a keeper's directory: all that
// is removed from it (the .tmp ones are left by a crash mid-write).
var keeperFiles = []string{keeperSocket, keeperReady, keeperLog, acquireID, keeperID, acquireID + ".tmp", keeperID + ".tmp"}

// writeKeeperID records in dir, as file name, the processes that use the
// directory, with the boot they run in. It is written whole under another
// name, then renamed: a sweeper reads all of it or none.
func writeKeeperID(dir, name string, ms []proc.Marker) error {
	var b strings.Builder
	b.WriteString("boot " + proc.BootID() + "\n")
	for _, m := range ms {
		b.WriteString("process " + m.String() + "\n")
	}
	tmp := filepath.Join(dir, name+".tmp")
	// O_EXCL: never through a link left at that name.
	w, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("record the keeper's processes: %w", err)
	}
	_, err = io.WriteString(w, b.String())
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("record the keeper's processes: %w", err)
	}
	return nil
}

// parseKeeperID reads an id file: "boot ID", then one "process
// PID:START:PIDNS" line or more, each line ended.
func parseKeeperID(b []byte) (boot string, ms []proc.Marker, err error) {
	if !bytes.HasSuffix(b, []byte("\n")) {
		return "", nil, errors.New("not a whole file")
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	boot, ok := strings.CutPrefix(lines[0], "boot ")
	if !ok || boot == "" || len(lines) < 2 {
		return "", nil, errors.New("want a boot line and a process line or more")
	}
	for _, l := range lines[1:] {
		v, ok := strings.CutPrefix(l, "process ")
		if !ok {
			return "", nil, fmt.Errorf("line %q", l)
		}
		m, err := proc.ParseMarker(v)
		if err != nil {
			return "", nil, fmt.Errorf("line %q: %w", l, err)
		}
		ms = append(ms, m)
	}
	return boot, ms, nil
}

// keeperDirEnded reports whether every process named by the id files of
// the keeper's directory open at dfd is provably gone: on this boot and in
// this pid namespace, each has exited or its pid names another process now
// (its start time differs), the proof slotctl judges holders by. No id
// file, one that cannot be read whole, another boot's (another machine may
// share the directory) or another pid namespace's: not proved.
func keeperDirEnded(dfd int) bool {
	boot, ns := proc.BootID(), proc.PidNS()
	if boot == "unknown-boot" || ns == 0 {
		return false
	}
	found := false
	for _, name := range []string{acquireID, keeperID} {
		b, err := readAt(dfd, name)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return false
		}
		idBoot, ms, err := parseKeeperID(b)
		if err != nil || idBoot != boot {
			return false
		}
		for _, m := range ms {
			if m.PidNS != ns || proc.Identify(m.Pid, m.Start) == proc.Alive {
				return false
			}
		}
		found = true
	}
	return found
}

// readAt reads the small regular file name in the directory open at dfd,
// not through a symbolic link.
func readAt(dfd int, name string) ([]byte, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errors.New("not a regular file")
	}
	return io.ReadAll(io.LimitReader(f, 4096))
}

// openPrivateAt opens the directory name in the directory open at pfd
// (pfd may be unix.AT_FDCWD), not through a symbolic link, and only if it
// is this user's and nobody else may open it.
func openPrivateAt(pfd int, name string) (int, error) {
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 {
		unix.Close(fd)
		return -1, errors.New("not a private directory of this user's")
	}
	return fd, nil
}

// removeKeeperDirAt removes the keeper's directory name, open at dfd, from
// the directory open at pfd: the files slotctl makes there, then the
// directory if nothing else is left in it.
func removeKeeperDirAt(pfd, dfd int, name string) {
	for _, f := range keeperFiles {
		_ = unix.Unlinkat(dfd, f, 0) // a link's self, never its target
	}
	_ = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
}

// sweepKeeperDirs removes, from base (this user's slotctl-UID, checked
// private), the keepers' directories whose processes are all provably
// gone. Entries that are not such a directory of this user's are left, and
// symbolic links are never followed.
func sweepKeeperDirs(base string) {
	bfd, err := openPrivateAt(unix.AT_FDCWD, base)
	if err != nil {
		return
	}
	d := os.NewFile(uintptr(bfd), base)
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, name := range names {
		if !strings.HasPrefix(name, keeperDirPrefix) {
			continue
		}
		dfd, err := openPrivateAt(bfd, name)
		if err != nil {
			continue
		}
		if keeperDirEnded(dfd) {
			removeKeeperDirAt(bfd, dfd, name)
		}
		unix.Close(dfd)
	}
}

// sweepEndedKeepers is sweepKeeperDirs on this user's base in $TMPDIR,
// when there is one and it is private.
func sweepEndedKeepers(f *Factory) {
	if base := keeperBasePath(f); checkPrivateDir(base) == nil {
		sweepKeeperDirs(base)
	}
}
