package cli

// The keeper's guards that need no slotctl binary: who it obeys (the
// kernel's peer credentials on a real socket), who release obeys, and
// which of its directories a later acquire or release may remove.

import (
	"bytes"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// A testKeeper is serveKeeper on a socket in a private directory of its
// own (short: a socket's path is bounded), as a keeper of some uid.
type testKeeper struct {
	sock     string
	ln       *net.UnixListener
	requests chan *net.UnixConn
	done     chan struct{} // closed once serveKeeper has returned
	log      bytes.Buffer
}

func startTestKeeper(t *testing.T, uid int) *testKeeper {
	t.Helper()
	dir, err := os.MkdirTemp("", "keeper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := &testKeeper{sock: filepath.Join(dir, keeperSocket), requests: make(chan *net.UnixConn), done: make(chan struct{})}
	if k.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: k.sock, Net: "unix"}); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(k.done)
		serveKeeper(k.ln, &logger{w: &k.log}, k.requests, uid)
	}()
	t.Cleanup(func() { k.stop() })
	return k
}

// stop closes the keeper's socket and returns its log once it has stopped.
func (k *testKeeper) stop() string {
	_ = k.ln.Close()
	<-k.done
	return k.log.String()
}

// TestKeeperRefusesAnotherUser: the keeper reads the uid of whoever
// connects from the kernel (SO_PEERCRED) and obeys only its user. A keeper
// whose user is another uid than this test's closes this test's release
// request unanswered and says so in its log; one whose user is this test's
// obeys it.
func TestKeeperRefusesAnotherUser(t *testing.T) {
	me := os.Getuid()
	k := startTestKeeper(t, me+1)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: k.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The keeper may have hung up already (the write then fails): it
	// judges the connection, not the request.
	_, _ = io.WriteString(c, "release\n")
	answer := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(c) // until the keeper closes the connection
		answer <- string(b)
	}()
	select {
	case r := <-k.requests:
		r.Close()
		t.Fatalf("a keeper of uid %d obeyed a release from uid %d", me+1, me)
	case a := <-answer:
		if a != "" {
			t.Errorf("the refused connection was answered %q, want it closed unanswered", a)
		}
	}
	if log, want := k.stop(), "refused a connection from uid "+strconv.Itoa(me); !strings.Contains(log, want) {
		t.Errorf("the keeper's log %q does not say %q", log, want)
	}

	own := startTestKeeper(t, me)
	type asked struct {
		r   keeperReply
		err error
	}
	got := make(chan asked, 1)
	go func() {
		r, c, err := askKeeperOf(own.sock, me)
		if c != nil {
			c.Close()
		}
		got <- asked{r, err}
	}()
	r := <-own.requests
	const id = "0123456789abcdef0123456789abcdef"
	if _, err := io.WriteString(r, `{"ticket":"`+id+`","store":"bolt:///x"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if a := <-got; a.err != nil || a.r.Ticket != id {
		t.Errorf("release asking a keeper of its own user: %+v", a)
	}
}

// TestReleaseRefusesAnotherUsersKeeper: release reads the uid of the
// process listening on the keeper's socket from the kernel and asks only
// its own user's keeper. Expecting another uid than the listener's, it
// hangs up before asking anything.
func TestReleaseRefusesAnotherUsersKeeper(t *testing.T) {
	me := os.Getuid()
	k := startTestKeeper(t, me)
	got := make(chan error, 1)
	go func() {
		_, c, err := askKeeperOf(k.sock, me+1)
		if c != nil {
			c.Close()
		}
		got <- err
	}()
	select {
	case r := <-k.requests:
		r.Close()
		t.Fatalf("release expecting uid %d's keeper asked uid %d's", me+1, me)
	case err := <-got:
		want := "listened on by uid " + strconv.Itoa(me) + ", not this user's " + strconv.Itoa(me+1)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("askKeeper: %v; want an error saying %q", err, want)
		}
	}
}

// TestPeerUID: the peer's uid is the kernel's record of it, here this
// process's own on both ends of a socket pair.
func TestPeerUID(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		fc, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if uid, err := peerUID(fc.(*net.UnixConn)); err != nil || uid != os.Getuid() {
			t.Errorf("peerUID = %d, %v; want %d", uid, err, os.Getuid())
		}
		fc.Close()
	}
}

// deadMarker is the marker of a process that has run and exited (a real
// one: started, identified, killed and reaped).
func deadMarker(t *testing.T) proc.Marker {
	t.Helper()
	sleep := exec.Command("sleep", "1000")
	sleep.Env = append(os.Environ(), testguard.Test(t).Env())
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	start, err := proc.StartTime(sleep.Process.Pid)
	_ = sleep.Process.Kill()
	_ = sleep.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return proc.Marker{Pid: sleep.Process.Pid, Start: start, PidNS: proc.PidNS()}
}

// idFile is an id file's text naming ms on boot.
func idFile(boot string, ms ...proc.Marker) string {
	s := "boot " + boot + "\n"
	for _, m := range ms {
		s += "process " + m.String() + "\n"
	}
	return s
}

// makeKeeperDir makes dir, mode 0700, holding files (name: text; a text
// beginning "->" makes a symbolic link to the rest).
func makeKeeperDir(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		var err error
		if target, ok := strings.CutPrefix(text, "->"); ok {
			err = os.Symlink(target, filepath.Join(dir, name))
		} else {
			err = os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeeperDirEnded: a keeper's directory is ended only when its id files
// are whole and name processes of this boot and pid namespace that are all
// provably gone (exited, or their pid now another process's).
func TestKeeperDirEnded(t *testing.T) {
	boot := proc.BootID()
	self, ok := proc.SelfMarker()
	if !ok || boot == "unknown-boot" {
		t.Skip("no process identity to prove with here")
	}
	dead := deadMarker(t)
	reused := proc.Marker{Pid: self.Pid, Start: self.Start + 1, PidNS: self.PidNS}
	otherNS := dead
	otherNS.PidNS++
	base := t.TempDir()
	elsewhere := filepath.Join(base, "elsewhere")
	if err := os.WriteFile(elsewhere, []byte(idFile(boot, dead)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		files map[string]string
		ended bool
	}{
		{"acquire's processes exited", map[string]string{acquireID: idFile(boot, dead), keeperLog: "x"}, true},
		{"all gone, the keeper's too", map[string]string{acquireID: idFile(boot, dead, reused), keeperID: idFile(boot, reused, dead)}, true},
		{"only the keeper's record", map[string]string{keeperID: idFile(boot, dead)}, true},
		{"no record", map[string]string{keeperLog: "x"}, false},
		{"one process alive", map[string]string{acquireID: idFile(boot, dead, self)}, false},
		{"the keeper alive", map[string]string{acquireID: idFile(boot, dead), keeperID: idFile(boot, self)}, false},
		{"another boot", map[string]string{acquireID: idFile("another-boot", dead)}, false},
		{"another pid namespace", map[string]string{acquireID: idFile(boot, otherNS)}, false},
		{"cut short", map[string]string{acquireID: strings.TrimSuffix(idFile(boot, dead), "\n")}, false},
		{"no process", map[string]string{acquireID: idFile(boot)}, false},
		{"malformed", map[string]string{acquireID: idFile(boot, dead) + "process 12\n"}, false},
		{"one record malformed", map[string]string{acquireID: idFile(boot, dead), keeperID: "?\n"}, false},
		{"a symbolic link", map[string]string{acquireID: "->" + elsewhere}, false},
	} {
		dir := filepath.Join(base, strings.ReplaceAll(c.name, " ", "-"))
		makeKeeperDir(t, dir, c.files)
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := keeperDirEnded(fd); got != c.ended {
			t.Errorf("%s: ended = %v, want %v", c.name, got, c.ended)
		}
		unix.Close(fd)
	}
}

// TestSweepKeeperDirs: the sweep removes the keepers' directories that
// have ended, and in them only the files slotctl makes; it leaves what is
// not a private directory named acquire-* (a symbolic link to one, one
// others may open, another name), and a directory with files of another's.
func TestSweepKeeperDirs(t *testing.T) {
	boot := proc.BootID()
	self, ok := proc.SelfMarker()
	if !ok || boot == "unknown-boot" {
		t.Skip("no process identity to prove with here")
	}
	dead := idFile(boot, deadMarker(t))
	root := t.TempDir()
	base := filepath.Join(root, "slotctl-"+strconv.Itoa(os.Getuid()))
	if err := os.Mkdir(base, 0o700); err != nil {
		t.Fatal(err)
	}
	all := map[string]string{}
	for _, f := range keeperFiles {
		all[f] = "x"
	}
	all[acquireID], all[keeperID] = dead, dead
	makeKeeperDir(t, filepath.Join(base, "acquire-ended"), all)
	makeKeeperDir(t, filepath.Join(base, "acquire-extra"), map[string]string{acquireID: dead, keeperLog: "x", "notes": "mine"})
	makeKeeperDir(t, filepath.Join(base, "acquire-alive"), map[string]string{acquireID: idFile(boot, self), keeperLog: "x"})
	makeKeeperDir(t, filepath.Join(base, "acquire-open"), map[string]string{acquireID: dead})
	if err := os.Chmod(filepath.Join(base, "acquire-open"), 0o755); err != nil {
		t.Fatal(err)
	}
	makeKeeperDir(t, filepath.Join(base, "other-ended"), map[string]string{acquireID: dead})
	outside := filepath.Join(root, "outside")
	makeKeeperDir(t, outside, map[string]string{acquireID: dead, keeperLog: "x"})
	if err := os.Symlink(outside, filepath.Join(base, "acquire-link")); err != nil {
		t.Fatal(err)
	}

	sweepKeeperDirs(base)

	names := func(dir string) []string {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, e := range entries {
			n = append(n, e.Name())
		}
		return n
	}
	if got, want := names(base), []string{"acquire-alive", "acquire-extra", "acquire-link", "acquire-open", "other-ended"}; !slices.Equal(got, want) {
		t.Errorf("left in the base: %q, want %q", got, want)
	}
	if got, want := names(filepath.Join(base, "acquire-extra")), []string{"notes"}; !slices.Equal(got, want) {
		t.Errorf("left of an ended keeper's directory holding another file: %q, want %q", got, want)
	}
	if got, want := names(filepath.Join(base, "acquire-alive")), []string{acquireID, keeperLog}; !slices.Equal(got, want) {
		t.Errorf("left of a live keeper's directory: %q, want %q", got, want)
	}
	if got, want := names(outside), []string{acquireID, keeperLog}; !slices.Equal(got, want) {
		t.Errorf("left in the directory a link in the base points to: %q, want %q", got, want)
	}
}
