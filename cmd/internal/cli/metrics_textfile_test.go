package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestWriteTextfileAtomic rewrites a file with two contents of different
// sizes while readers read it: every read is one of them, whole. A plain
// os.WriteFile (truncate, then write) fails this at once.
func TestWriteTextfileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "slotctl.prom")
	a := bytes.Repeat([]byte("a"), 1<<20)
	b := bytes.Repeat([]byte("b"), 1<<19+7)
	if err := writeTextfile(path, a); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var bad atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				got, err := os.ReadFile(path)
				if err != nil || !(bytes.Equal(got, a) || bytes.Equal(got, b)) {
					bad.Add(1)
				}
			}
		}()
	}
	for i := range 100 {
		data := a
		if i%2 == 0 {
			data = b
		}
		if err := writeTextfile(path, data); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Errorf("%d reads saw a partial file", n)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("files left in the directory: %v", entries)
	}
}

// TestWriteTextfileFailure: a failed write leaves the old file and no
// temporary one (here: the rename fails, PATH being a non-empty directory).
func TestWriteTextfileFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "slotctl.prom")
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := writeTextfile(path, []byte("new\n"))
	if code := exitCode(err); code != exitUsage {
		t.Errorf("exit %d (%v), want 64", code, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary file left behind: %v", entries)
	}
	// Mode 0644 whatever the umask.
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	p2 := filepath.Join(dir, "m.prom")
	if err := writeTextfile(p2, []byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p2); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v %v, want 0644", fi.Mode(), err)
	}
}
