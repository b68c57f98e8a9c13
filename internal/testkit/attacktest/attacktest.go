//go:build linux

// Package attacktest sets the stage for tests of docs/leases.md §4.5 (trust): a
// throwaway group, two of its members and an outsider, shared directories
// made as the packages make them, commands run as any of them, and
// snapshots of files outside the store that an attack must leave alone.
//
// Users and groups are bare numeric ids, never written to /etc/passwd or
// /etc/group: the kernel needs no entry to run a process as them, so there is
// nothing to clean up but files. Every test needs root (CI runs as root);
// outside CI it is skipped without root, in CI it fails.
package attacktest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A User is a throwaway identity.
type User struct {
	Name   string // for messages only
	Uid    uint32
	Gid    uint32   // primary group
	Groups []uint32 // supplementary groups
	Home   string   // a 0700 directory of its own
}

// Env is one test's cast: Alice and Bob are members of Group, Eve is not.
// Root is the real root, as the packaged reaper used to run. Reaper is a
// system user in Group, as the packaged reaper runs now (slotctl-reap),
// with no capability unless a test grants it one (setpriv).
type Env struct {
	Group           uint32
	Alice, Bob, Eve User
	Reaper          User
	Root            User
	Base            string // a 0755 root-owned directory that holds everything below
	t               testing.TB
}

// RequireRoot skips (or, in CI, fails) a test that is not run as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("the attack suite needs root (CI runs as root)")
	}
	t.Skip("the attack suite needs root")
}

// New makes the cast for one test. Ids are drawn at random from a range no
// real account uses, so that parallel test binaries do not collide.
func New(t testing.TB) *Env {
	t.Helper()
	RequireRoot(t)
	base, err := os.MkdirTemp("", "slotctl-attack-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	id := uint32(3_000_000_000 + rand.N(125_000_000)*8)
	e := &Env{Group: id, Base: base, t: t}
	mk := func(name string, uid uint32, groups ...uint32) User {
		home := filepath.Join(base, "home-"+name)
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(home, int(uid), int(uid)); err != nil {
			t.Fatal(err)
		}
		return User{Name: name, Uid: uid, Gid: uid, Groups: groups, Home: home}
	}
	e.Alice = mk("alice", id+1, id)
	e.Bob = mk("bob", id+2, id)
	e.Eve = mk("eve", id+3)
	e.Reaper = mk("reaper", id+4, id)
	e.Root = User{Name: "root", Uid: 0, Gid: 0, Groups: []uint32{id}, Home: base}
	return e
}

// SharedDir makes a directory owned by root and the group with mode (e.g.
// 0o2770 as the packages made it before, 0o3770 as they make it now, with the sticky bit).
func (e *Env) SharedDir(name string, mode fs.FileMode) string {
	e.t.Helper()
	dir := filepath.Join(e.Base, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Chown(dir, 0, int(e.Group)); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Chmod(dir, mode.Perm()|goMode(mode)); err != nil {
		e.t.Fatal(err)
	}
	return dir
}

func goMode(m fs.FileMode) fs.FileMode {
	return m & (fs.ModeSetgid | fs.ModeSetuid | fs.ModeSticky)
}

// Mode turns a Unix mode such as 0o3770 into an fs.FileMode.
func Mode(unix uint32) fs.FileMode {
	m := fs.FileMode(unix & 0o777)
	if unix&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if unix&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if unix&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Command is name args run as u, in dir, with a minimal environment (PATH,
// HOME) plus env.
func (u User) Command(dir string, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + u.Home, "LC_ALL=C"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
		Uid: u.Uid, Gid: u.Gid, Groups: u.Groups, NoSetGroups: false,
	}}
	return cmd
}

// Result is what a command did.
type Result struct {
	Code           int // exit code; -1 if killed, or if it did not finish in time
	Stdout, Stderr string
	TimedOut       bool
}

// Run runs cmd to the end, killing it after timeout: an attack may hang
// its victim, and a test must say so rather than hang itself.
func Run(t testing.TB, cmd *exec.Cmd, timeout time.Duration) Result {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var r Result
	select {
	case err := <-done:
		r.Code = exitCode(err)
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		r.Code, r.TimedOut = -1, true
	}
	r.Stdout, r.Stderr = out.String(), errb.String()
	return r
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -1
		}
		return ee.ExitCode()
	}
	return -1
}

// Sh runs a shell script as u in dir and fails the test unless it exits 0:
// the member's part of an attack, which must itself succeed.
func (u User) Sh(t testing.TB, dir, script string) string {
	t.Helper()
	r := Run(t, u.Command(dir, nil, "sh", "-ec", script), 30*time.Second)
	if r.Code != 0 {
		t.Fatalf("as %s in %s: %s: exit %d: %s%s", u.Name, dir, script, r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// A Snapshot records the state of files that an attack aims at, to check
// afterwards that nothing created, changed, chmodded or deleted them.
type Snapshot struct {
	paths []string
	state map[string]string
}

// Take records each path's state (absent, or type, mode, owner, size and
// content hash), without following a final symlink.
func Take(t testing.TB, paths ...string) *Snapshot {
	t.Helper()
	s := &Snapshot{paths: paths, state: map[string]string{}}
	for _, p := range paths {
		s.state[p] = describe(p)
	}
	return s
}

// Unchanged fails the test for every path whose state differs now.
func (s *Snapshot) Unchanged(t testing.TB) {
	t.Helper()
	for _, p := range s.paths {
		if now := describe(p); now != s.state[p] {
			t.Errorf("%s changed: was %s, now %s", p, s.state[p], now)
		}
	}
}

func describe(p string) string {
	st, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "absent"
	}
	if err != nil {
		return "error: " + err.Error()
	}
	sys := st.Sys().(*syscall.Stat_t)
	d := fmt.Sprintf("%s uid=%d gid=%d size=%d", st.Mode(), sys.Uid, sys.Gid, st.Size())
	if st.Mode().IsRegular() {
		b, err := os.ReadFile(p)
		if err == nil {
			d += fmt.Sprintf(" sha256=%x", sha256.Sum256(b))
		}
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(p)
		d += " -> " + target
	}
	return d
}

// Victims is a set of files outside any store, as an attacker would aim
// at: one that does not exist, an empty one and one with content, each in
// root's own 0700 directory and in a member's 0700 home.
type Victims struct {
	Missing, Empty, Full []string // root's first, then the member's
	All                  []string
}

// Targets makes the victims of an attack on u's home and root's private
// directory.
func (e *Env) Targets(u User) Victims {
	e.t.Helper()
	rootDir := filepath.Join(e.Base, "root-private")
	if err := os.MkdirAll(rootDir, 0o700); err != nil {
		e.t.Fatal(err)
	}
	var v Victims
	for _, d := range []struct {
		dir string
		uid uint32
	}{{rootDir, 0}, {u.Home, u.Uid}} {
		missing := filepath.Join(d.dir, "profile-missing")
		empty := filepath.Join(d.dir, "empty")
		full := filepath.Join(d.dir, "secret")
		for _, f := range []struct {
			p    string
			data string
		}{{empty, ""}, {full, "do not touch\n"}} {
			if err := os.WriteFile(f.p, []byte(f.data), 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
				e.t.Fatal(err)
			}
			if err := os.Chown(f.p, int(d.uid), int(d.uid)); err != nil {
				e.t.Fatal(err)
			}
		}
		v.Missing = append(v.Missing, missing)
		v.Empty = append(v.Empty, empty)
		v.Full = append(v.Full, full)
	}
	v.All = append(append(append(v.All, v.Missing...), v.Empty...), v.Full...)
	return v
}

// Quote is a path as a shell word.
func Quote(p string) string { return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'" }

// Install copies the executable src to a 0755 directory under Base that
// every user of the cast can reach, and returns its path: a test binary or
// a built slotctl sits in the go tool's private directories otherwise.
func (e *Env) Install(src, name string) string {
	e.t.Helper()
	bin := filepath.Join(e.Base, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		e.t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		e.t.Fatal(err)
	}
	dst := filepath.Join(bin, name)
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		e.t.Fatal(err)
	}
	return dst
}
