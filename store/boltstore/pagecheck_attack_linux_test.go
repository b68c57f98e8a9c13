//go:build linux

package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/testkit/attacktest"
	"github.com/slotctl/slotctl/store"
)

// TestAttackHostilePages is a hostile store file as an attack: Alice, a member
// of the store's group, rewrites the page structure of the shared store file
// with her own write access; root (as the reaper, `ls` and completion run)
// and Bob, another member, then use the store. Each of them must get
// ErrCorrupt naming the file from every operation, within seconds, instead
// of dying of a stack overflow or of exhausted memory, or hanging, with the
// store's lock held. The victims run as child processes (the test binary,
// re-executed as root and as Bob), since those deaths are fatal.
func TestAttackHostilePages(t *testing.T) {
	if path := os.Getenv("BOLTSTORE_VICTIM_STORE"); path != "" {
		victim(t, path)
		return
	}
	e := attacktest.New(t)
	bin := e.Install(os.Args[0], "boltstore.test")
	base := filepath.Join(t.TempDir(), "base.db")
	hostileBase(t, base)
	clean, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{
		"branch child is the branch itself",   // a stack overflow
		"inline bucket is a branch of itself", // a hang, its stack of pages growing
		"freelist with a huge count",          // 2 GiB allocated, then out of memory
		"newer meta torn, older meta's tree has a cycle",
	} {
		t.Run(name, func(t *testing.T) {
			dir := e.SharedDir(strings.NewReplacer(" ", "-", "'", "").Replace(name), attacktest.Mode(0o2770))
			path := filepath.Join(dir, "slots.db")
			// The store as the members' runs made it: Bob's file, the group's to write.
			if err := os.WriteFile(path, clean, 0o660); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(path, int(e.Bob.Uid), int(e.Group)); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, 0o660); err != nil {
				t.Fatal(err)
			}
			// Alice crafts the pages in her home and writes them over the store, in place.
			f := parseBoltFile(t, append([]byte(nil), clean...))
			for _, c := range hostileCases {
				if c.name == name {
					c.patch(t, f)
				}
			}
			crafted := filepath.Join(e.Alice.Home, "crafted.db")
			if err := os.WriteFile(crafted, f.b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(crafted, int(e.Alice.Uid), int(e.Alice.Gid)); err != nil {
				t.Fatal(err)
			}
			e.Alice.Sh(t, dir, "dd if="+attacktest.Quote(crafted)+" of=slots.db conv=notrunc status=none")
			for _, u := range []attacktest.User{e.Root, e.Bob} {
				cmd := u.Command(dir, []string{"BOLTSTORE_VICTIM_STORE=" + path, "TMPDIR=" + u.Home},
					bin, "-test.run=^TestAttackHostilePages$", "-test.count=1", "-test.v")
				r := attacktest.Run(t, cmd, time.Minute)
				if r.TimedOut || r.Code != 0 {
					out := strings.Split(r.Stdout+r.Stderr, "\n")
					if len(out) > 30 {
						out = out[:30]
					}
					t.Errorf("as %s: exit %d (timed out: %v):\n%s", u.Name, r.Code, r.TimedOut, strings.Join(out, "\n"))
					continue
				}
				if i := strings.Index(r.Stdout, "Reap: "); i >= 0 {
					t.Logf("as %s: %s", u.Name, strings.SplitN(r.Stdout[i:], "\n", 2)[0])
				}
			}
		})
	}
}

// victim runs every operation of the store on the file at path, as the
// user this process runs as: each must fail with ErrCorrupt naming the
// file, within 5 s and without a runaway allocation.
func victim(t *testing.T, path string) {
	if err := unix.Setrlimit(unix.RLIMIT_DATA, &unix.Rlimit{Cur: 3 << 30, Max: 3 << 30}); err != nil {
		t.Logf("setrlimit: %v", err)
	}
	debug.SetMaxStack(256 << 20)
	s, err := New(path, Options{Clock: newClock(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range hostileOps {
		err, alloc, took, ok := bounded(5*time.Second, func() error {
			return safely(t, op.name, func() error { return op.run(context.Background(), s) })
		})
		if !ok {
			t.Fatalf("%s did not return within %s", op.name, took)
		}
		fmt.Printf("uid %d: %s: %v (%s, %d KiB)\n", os.Getuid(), op.name, err, took.Round(time.Microsecond), alloc>>10)
		switch {
		case alloc > 64<<20:
			t.Errorf("%s allocated %d MiB", op.name, alloc>>20)
		case !errors.Is(err, store.ErrCorrupt):
			t.Errorf("%s: err = %v, want ErrCorrupt", op.name, err)
		case !strings.Contains(err.Error(), path):
			t.Errorf("%s: error %q does not name the file", op.name, err)
		}
	}
}
