package boltstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// A job marker is the evidence that the authority to kill what is left of a
// job comes from (docs/leases.md §4.3): a ticket in the store can be
// written back by any member after its job ended, and a daemon that job
// left behind still carries its ticket, so the store alone never
// authorises a kill. The supervisor leaves <id>.job, holding the
// SLOTCTL_SUPERVISOR marker it gives the job, in its user's own bells
// directory (<store>.bells/<uid>/, which only that user and root can
// write) when the job is admitted, and removes it after the release. A
// reaper kills an orphaned job only while that file is there, in the
// directory of the uid the job's processes run as, owned by that uid, and
// names the supervisor they name.
//
// A supervisor that dies without releasing leaves its marker behind: that
// is the point (its job was never released). The removal of its ticket
// (a reap, an expiry, an operator's release) removes it too, where the
// remover may (root, or the owner; another member may not write the
// owner's directory): with no ticket it has nothing left to authorise.

// markSuffix ends a marker's name: never a ticket id (store.CheckID), so
// never a bell, and the bell sweep leaves it alone.
const markSuffix = ".job"

// maxMark bounds what is read of a marker: PID:START:PIDNS and a newline.
const maxMark = 80

// MarkJob leaves the marker of ticket id's job, whose processes name
// supervisor m, in this user's bells directory, and returns the function
// that removes it (to be called once the ticket is released).
func (s *Store) MarkJob(id string, m proc.Marker) (unmark func(), err error) {
	if err := store.CheckID(id); err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(s) // its cleanup closes the bells directory
	if err := s.fds.acquire(s.path); err != nil {
		return nil, err
	}
	defer s.fds.release()
	ufd, dir, err := s.ownBellDir()
	if err != nil {
		return nil, fmt.Errorf("job marker: %w", err)
	}
	name := id + markSuffix
	path := filepath.Join(dir, name)
	// The directory is this user's alone: nobody else can have put a file
	// here. Whatever is in the way (a stale marker) is replaced.
	_ = unix.Unlinkat(ufd, name, 0)
	fd, err := openat(ufd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		unix.Close(ufd)
		return nil, fmt.Errorf("job marker: %w", pathError(path, err))
	}
	_, err = unix.Write(fd, []byte(m.String()+"\n"))
	if err == nil {
		err = unix.Fchmod(fd, 0o600) // the umask may have narrowed it, never widened: keep it the owner's
	}
	unix.Close(fd)
	if err != nil {
		_ = unix.Unlinkat(ufd, name, 0)
		unix.Close(ufd)
		return nil, fmt.Errorf("job marker: %w", pathError(path, err))
	}
	return func() {
		_ = unix.Unlinkat(ufd, name, 0)
		unix.Close(ufd)
	}, nil
}

// JobAuthority reads the marker of ticket id in uid's bells directory: the
// supervisor it names, when the directory is uid's, and the marker a
// regular file of uid's with one link, read without following a symlink.
// It is a proc.Judge's Authority.
func (s *Store) JobAuthority(uid int, id string) (proc.Marker, bool) {
	if uid < 0 || store.CheckID(id) != nil {
		return proc.Marker{}, false
	}
	defer runtime.KeepAlive(s)
	if s.fds.acquire(s.path) != nil {
		return proc.Marker{}, false
	}
	defer s.fds.release()
	bells, err := s.bellsDir(false)
	if err != nil {
		return proc.Marker{}, false
	}
	ufd, err := openDirAt(bells, strconv.Itoa(uid))
	if err != nil {
		return proc.Marker{}, false
	}
	defer unix.Close(ufd)
	var st unix.Stat_t
	if unix.Fstat(ufd, &st) != nil || int(st.Uid) != uid {
		return proc.Marker{}, false
	}
	fd, err := openRegular(ufd, id+markSuffix, unix.O_RDONLY, &st)
	if err != nil {
		return proc.Marker{}, false
	}
	if int(st.Uid) != uid {
		unix.Close(fd)
		return proc.Marker{}, false
	}
	f := os.NewFile(uintptr(fd), id+markSuffix)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMark+1))
	if err != nil || len(b) > maxMark {
		return proc.Marker{}, false
	}
	m, err := proc.ParseMarker(strings.TrimSuffix(string(b), "\n"))
	return m, err == nil
}

// ownBellDir opens (and makes) this user's own bells directory, checked to
// be the user's and given its mode: the directory's descriptor, and its
// path for messages.
func (s *Store) ownBellDir() (int, string, error) {
	bells, err := s.bellsDir(true)
	if err != nil {
		return -1, "", err
	}
	uid := euid()
	name := strconv.Itoa(uid)
	path := filepath.Join(bellDir(s.path), name)
	ufd, err := openDirAt(bells, name)
	if errors.Is(err, unix.ENOENT) {
		err = unix.Mkdirat(bells, name, 0o700)
		if err == nil || errors.Is(err, unix.EEXIST) {
			ufd, err = openDirAt(bells, name)
		}
	}
	if err != nil {
		return -1, "", pathError(path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(ufd, &st); err != nil {
		unix.Close(ufd)
		return -1, "", pathError(path, err)
	}
	if int(st.Uid) != uid {
		unix.Close(ufd)
		return -1, "", fmt.Errorf("directory %s belongs to uid %d, not to this user (uid %d)", path, st.Uid, uid)
	}
	dirMode := uint32(0o700)
	if s.mode&0o060 != 0 {
		dirMode = 0o750 | uint32(st.Mode)&unix.S_ISGID
	}
	if uint32(st.Mode)&0o7777 != dirMode {
		if err := unix.Fchmod(ufd, dirMode); err != nil {
			unix.Close(ufd)
			return -1, "", pathError(path, err)
		}
	}
	return ufd, path, nil
}
