package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/store"
)

// --- a bbolt file, read and patched by hand ---

// boltFile is a store file's bytes with the offsets a test patches. It reads
// the layout itself rather than through pagecheck.go, so that a mistake
// there cannot hide in the test.
type boltFile struct {
	b    []byte
	psz  int
	meta int // offset of the newer meta (a page header past page 0 or 1)
	old  int // offset of the older one
}

var le = binary.LittleEndian

func parseBoltFile(t testing.TB, b []byte) *boltFile {
	t.Helper()
	f := &boltFile{b: b, psz: int(le.Uint32(b[16+8:]))}
	f.meta, f.old = 16, f.psz+16
	if le.Uint64(b[f.psz+16+48:]) > le.Uint64(b[16+48:]) {
		f.meta, f.old = f.old, f.meta
	}
	return f
}

func (f *boltFile) u64(off int) uint64      { return le.Uint64(f.b[off:]) }
func (f *boltFile) put64(off int, v uint64) { le.PutUint64(f.b[off:], v) }
func (f *boltFile) off(id uint64) int       { return int(id) * f.psz }
func (f *boltFile) flags(id uint64) uint16  { return le.Uint16(f.b[f.off(id)+8:]) }
func (f *boltFile) count(id uint64) int     { return int(le.Uint16(f.b[f.off(id)+10:])) }
func (f *boltFile) root(meta int) uint64    { return f.u64(meta + 16) }
func (f *boltFile) freelist() uint64        { return f.u64(f.meta + 32) }
func (f *boltFile) hwm(meta int) uint64     { return f.u64(meta + 40) }

// elem is the offset of element i of page id.
func (f *boltFile) elem(id uint64, i int) int { return f.off(id) + 16 + 16*i }

// child is branch page id's element i's child page.
func (f *boltFile) child(id uint64, i int) uint64 { return f.u64(f.elem(id, i) + 8) }

// seal recomputes the checksum of the meta at offset meta.
func (f *boltFile) seal(meta int) {
	h := fnv.New64a()
	h.Write(f.b[meta : meta+56])
	f.put64(meta+56, h.Sum64())
}

// value returns the offset and size of the value of key in the tree at
// page root, searching every leaf.
func (f *boltFile) value(t testing.TB, root uint64, key string) (off, size int) {
	t.Helper()
	var found func(id uint64) bool
	found = func(id uint64) bool {
		for i := range f.count(id) {
			e := f.elem(id, i)
			if f.flags(id) == 0x01 {
				if found(f.child(id, i)) {
					return true
				}
				continue
			}
			pos, ksize, vsize := int(le.Uint32(f.b[e+4:])), int(le.Uint32(f.b[e+8:])), int(le.Uint32(f.b[e+12:]))
			if string(f.b[e+pos:e+pos+ksize]) == key {
				off, size = e+pos+ksize, vsize
				return true
			}
		}
		return false
	}
	if !found(root) {
		t.Fatalf("no key %q under page %d", key, root)
	}
	return off, size
}

// bucket returns the offset of the bucket header of the bucket at path
// (top-level name, then sub-bucket names).
func (f *boltFile) bucket(t testing.TB, path ...string) int {
	t.Helper()
	root := f.root(f.meta)
	var off int
	for _, name := range path {
		off, _ = f.value(t, root, name)
		root = f.u64(off)
		if root == 0 && name != path[len(path)-1] {
			t.Fatalf("bucket %s is inline", name)
		}
	}
	return off
}

// branches returns the branch pages of the tree at root, by depth (the root at 0).
func (f *boltFile) branches(root uint64) [][]uint64 {
	var levels [][]uint64
	var walk func(id uint64, depth int)
	walk = func(id uint64, depth int) {
		if f.flags(id) != 0x01 {
			return
		}
		for len(levels) <= depth {
			levels = append(levels, nil)
		}
		levels[depth] = append(levels[depth], id)
		for i := range f.count(id) {
			walk(f.child(id, i), depth+1)
		}
	}
	walk(root, 0)
	return levels
}

// aLeaf returns a leaf page of the tree at root.
func (f *boltFile) aLeaf(root uint64) uint64 {
	for f.flags(root) == 0x01 {
		root = f.child(root, 0)
	}
	return root
}

// appendPage adds a page at the high-water mark of the newer meta (raising
// it and resealing the meta) and returns its id; the page holds a copy of
// page from.
func (f *boltFile) appendPage(from uint64) uint64 {
	id := f.hwm(f.meta)
	end := f.off(id + 1)
	if len(f.b) < end {
		f.b = append(f.b, make([]byte, end-len(f.b))...)
	}
	copy(f.b[f.off(id):end], f.b[f.off(from):f.off(from+1)])
	f.put64(f.off(id), id)
	le.PutUint32(f.b[f.off(id)+12:], 0) // no overflow
	f.put64(f.meta+40, id+1)
	f.seal(f.meta)
	return id
}

// --- the hostile files ---

// hostileBase is a store with deep enough trees to patch: limit "x" with 300
// tickets (t0 has fence 1), and 200 limits with 123-character names of one
// ticket each, whose queue sub-buckets are inline.
func hostileBase(t testing.TB, path string) { hostileBaseOn(t, path, newClock()) }

func hostileBaseOn(t testing.TB, path string, clock Clock) {
	t.Helper()
	s, err := New(path, Options{Clock: clock, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		mustEnqueue(t, s, req(fmt.Sprintf("t%d", i), "x", 1))
	}
	for i := range 200 {
		mustEnqueue(t, s, req(fmt.Sprintf("u%d", i), longLimit(i), 1))
	}
}

func longLimit(i int) string { return strings.Repeat("l", 120) + fmt.Sprintf("%03d", i) }

// hostileCases patch the base file. corrupt false: the file must still work.
var hostileCases = []struct {
	name    string
	corrupt bool
	patch   func(t testing.TB, f *boltFile)
}{
	{"intact", false, func(t testing.TB, f *boltFile) {}},
	{"branch child is the branch itself", true, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		f.put64(f.elem(r, 0)+8, r)
	}},
	{"branch child is its grandparent", true, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		lv := f.branches(r)
		if len(lv) < 2 {
			t.Fatalf("queue's tree has %d levels of branches, want 2", len(lv))
		}
		f.put64(f.elem(lv[1][len(lv[1])-1], 0)+8, r)
	}},
	{"two branches share a child", true, func(t testing.TB, f *boltFile) {
		lv := f.branches(queueBranch(t, f))
		if len(lv) < 2 || len(lv[1]) < 2 {
			t.Fatalf("queue's tree has too few branches: %v", lv)
		}
		f.put64(f.elem(lv[1][1], 0)+8, f.child(lv[1][0], 0))
	}},
	{"two elements of a branch share a child", true, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		f.put64(f.elem(r, 1)+8, f.child(r, 0))
	}},
	{"branch child past the high-water mark", true, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		f.put64(f.elem(r, 0)+8, f.hwm(f.meta)+3)
	}},
	{"branch child is a meta page", true, func(t testing.TB, f *boltFile) {
		f.put64(f.elem(queueBranch(t, f), 0)+8, 1)
	}},
	{"branch child is the freelist page", true, func(t testing.TB, f *boltFile) {
		f.put64(f.elem(queueBranch(t, f), 0)+8, f.freelist())
	}},
	{"page names another page", true, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		f.put64(f.off(r), r+1)
	}},
	{"truncated branch: no elements", true, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		le.PutUint16(f.b[f.off(r)+10:], 0)
	}},
	{"truncated branch: a key past the page", true, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		le.PutUint32(f.b[f.elem(r, f.count(r)-1)+4:], uint32(f.psz))
	}},
	{"branch count past the page", true, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		le.PutUint16(f.b[f.off(r)+10:], 0xFFFF)
	}},
	{"leaf count past the page", true, func(t testing.TB, f *boltFile) {
		l := f.aLeaf(queueBranch(t, f))
		le.PutUint16(f.b[f.off(l)+10:], 0xFFFF)
	}},
	{"leaf value past the page", true, func(t testing.TB, f *boltFile) {
		l := f.aLeaf(queueBranch(t, f))
		le.PutUint32(f.b[f.elem(l, 0)+12:], 1<<30)
	}},
	{"leaf overflow past the high-water mark", true, func(t testing.TB, f *boltFile) {
		l := f.aLeaf(queueBranch(t, f))
		le.PutUint32(f.b[f.off(l)+12:], 1<<31)
	}},
	{"sub-bucket root is the root page", true, func(t testing.TB, f *boltFile) {
		f.put64(f.bucket(t, "queue", "x"), f.root(f.meta))
	}},
	{"sub-bucket root is its parent's root", true, func(t testing.TB, f *boltFile) {
		f.put64(f.bucket(t, "queue", "x"), queueBranch(t, f))
	}},
	{"sub-bucket root past the file", true, func(t testing.TB, f *boltFile) {
		f.put64(f.bucket(t, "queue", "x"), 1<<40)
	}},
	{"inline bucket is a branch of itself", true, func(t testing.TB, f *boltFile) {
		v := f.bucket(t, "queue", longLimit(7))
		if f.u64(v) != 0 {
			t.Fatal("limit 7's queue bucket is not inline")
		}
		p := v + 16 // the inline page: flags branch, its one element's child page 0, the inline page itself
		le.PutUint16(f.b[p+8:], 0x01)
		le.PutUint16(f.b[p+10:], 1)
		f.put64(p+16+8, 0)
	}},
	{"a bucket of the root is a value", true, func(t testing.TB, f *boltFile) {
		off, _ := f.value(t, f.root(f.meta), string(bucketTombs))
		le.PutUint32(f.b[off-rootKeyLen(f, string(bucketTombs)):], 0) // its element's flags
	}},
	{"freelist with a huge count", true, func(t testing.TB, f *boltFile) {
		p := f.off(f.freelist())
		le.PutUint16(f.b[p+10:], 0xFFFF)
		f.put64(p+16, 1<<28) // 2 GiB of ids
	}},
	{"freelist lists a page in use", true, func(t testing.TB, f *boltFile) {
		p := f.off(f.freelist())
		n := int(le.Uint16(f.b[p+10:]))
		if n == 0 || n == 0xFFFF {
			t.Fatalf("freelist has %d entries", n)
		}
		f.put64(p+16, queueBranch(t, f))
	}},
	{"pages nest 70 deep", true, func(t testing.TB, f *boltFile) {
		v := f.bucket(t, "queue")
		next := f.u64(v)
		for range 70 { // a chain of one-child branches down to the real root
			id := f.appendPage(next)
			p := f.off(id)
			le.PutUint16(f.b[p+8:], 0x01)
			le.PutUint16(f.b[p+10:], 1)
			le.PutUint32(f.b[p+16:], 16) // key: the first 8 bytes after the element (any non-empty key)
			le.PutUint32(f.b[p+16+4:], 8)
			f.put64(p+16+8, next)
			next = id
		}
		f.put64(v, next)
	}},
	{"newer meta points at garbage, checksum valid", true, func(t testing.TB, f *boltFile) {
		id := f.appendPage(2)
		p := f.b[f.off(id):f.off(id+1)]
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 16; i < len(p); i++ {
			p[i] = byte(rng.Uint32())
		}
		for i := range 100 { // small offsets and ids that land inside the file
			e := p[16+16*i:]
			le.PutUint32(e, uint32(rng.IntN(64)))
			le.PutUint32(e[4:], uint32(1+rng.IntN(16)))
			le.PutUint64(e[8:], uint64(2+rng.IntN(int(id-1))))
		}
		le.PutUint16(p[8:], 0x01)
		le.PutUint16(p[10:], 100)
		le.PutUint32(p[12:], 0)
		f.put64(f.meta+16, id)
		f.seal(f.meta)
	}},
	{"newer meta torn, older meta's tree has a cycle", true, func(t testing.TB, f *boltFile) {
		// The older meta (the one bbolt falls back to) gets a root that is its own child.
		r := queueBranch(t, f)
		id := f.appendPage(r)
		f.put64(f.elem(id, 0)+8, id)
		f.put64(f.old+16, id)
		f.put64(f.old+40, id+1)
		f.seal(f.old)
		f.b[f.meta+56] ^= 0xFF // the newer meta's checksum fails
	}},
	{"older meta's tree has a cycle, newer meta intact", false, func(t testing.TB, f *boltFile) {
		r := queueBranch(t, f)
		id := f.appendPage(r)
		f.put64(f.elem(id, 0)+8, id)
		f.put64(f.old+16, id)
		f.seal(f.old)
	}},
}

// rootKeyLen is how far the element's flags of key in the root page lie
// before its value: bbolt.value returns the value's offset, the element is
// found again here.
func rootKeyLen(f *boltFile, key string) int {
	r := f.root(f.meta)
	for i := range f.count(r) {
		e := f.elem(r, i)
		pos, ksize := int(le.Uint32(f.b[e+4:])), int(le.Uint32(f.b[e+8:]))
		if string(f.b[e+pos:e+pos+ksize]) == key {
			return pos + ksize
		}
	}
	panic("no key " + key + " in the root page")
}

// queueBranch is the root page of the queue bucket, which must be a branch.
func queueBranch(t testing.TB, f *boltFile) uint64 {
	t.Helper()
	r := f.u64(f.bucket(t, "queue"))
	if f.flags(r) != 0x01 {
		t.Fatalf("the queue bucket's root page %d is not a branch (flags %#x)", r, f.flags(r))
	}
	return r
}

// hostileOps are every operation of the store that opens its file.
var hostileOps = []struct {
	name string
	run  func(ctx context.Context, s *Store) error
}{
	{"Get", func(ctx context.Context, s *Store) error { _, err := s.Get(ctx, "t0"); return err }},
	{"Snapshot", func(ctx context.Context, s *Store) error { _, err := s.Snapshot(ctx); return err }},
	{"Snapshot(x)", func(ctx context.Context, s *Store) error { _, err := s.Snapshot(ctx, "x"); return err }},
	{"Events", func(ctx context.Context, s *Store) error { _, err := s.Events(ctx, "", 10); return err }},
	{"Reap(dry run)", func(ctx context.Context, s *Store) error {
		_, err := s.Reap(ctx, store.ReapOptions{DryRun: true})
		return err
	}},
	{"Reap", func(ctx context.Context, s *Store) error { _, err := s.Reap(ctx, store.ReapOptions{}); return err }},
	{"Enqueue", func(ctx context.Context, s *Store) error { _, err := s.Enqueue(ctx, req("new1", "x", 1)); return err }},
	{"Renew", func(ctx context.Context, s *Store) error {
		_, err := s.Renew(ctx, store.Ticket{ID: "t0", Limit: "x", Fence: 1}, testTTL)
		return err
	}},
	{"SetChild", func(ctx context.Context, s *Store) error {
		_, err := s.SetChild(ctx, store.Ticket{ID: "t0", Limit: "x", Fence: 1}, 4242, 99)
		return err
	}},
	{"Release", func(ctx context.Context, s *Store) error {
		_, err := s.Release(ctx, store.Ticket{ID: "t0", Fence: 1}, store.Released)
		return err
	}},
	{"SetLimit", func(ctx context.Context, s *Store) error { _, err := s.SetLimit(ctx, "x", 3); return err }},
	{"RemoveLimit", func(ctx context.Context, s *Store) error { return s.RemoveLimit(ctx, "x", true) }},
}

// TestHostilePages runs every store operation on store files whose page
// structure a member of the store's group rewrote (docs/leases.md §4.5): each must end
// within seconds, without a crash or a runaway allocation, in an error
// wrapping ErrCorrupt that names the file. Each case runs in a child process,
// since a stack overflow or an exhausted memory is fatal to the process.
func TestHostilePages(t *testing.T) {
	if name := os.Getenv("BOLTSTORE_HOSTILE_CASE"); name != "" {
		for _, c := range hostileCases {
			if c.name == name {
				if os.Getenv("BOLTSTORE_HOSTILE_PAGEWISE") != "" {
					readWhole = 0 // the walk a large store gets: one read per page
				}
				hostileChild(t, os.Getenv("BOLTSTORE_HOSTILE_BASE"), c.corrupt, c.patch)
				return
			}
		}
		t.Fatalf("no case %q", name)
	}
	base := filepath.Join(t.TempDir(), "base.db")
	hostileBase(t, base)
	for i, c := range hostileCases {
		for k, read := range []string{"whole", "pagewise"} {
			if !longtest.Enabled() && k != i%2 {
				continue // the fast suite reads each case one way, alternating
			}
			t.Run(c.name+"/"+read, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHostilePages$", "-test.count=1", "-test.v")
				cmd.Env = append(os.Environ(), "BOLTSTORE_HOSTILE_CASE="+c.name, "BOLTSTORE_HOSTILE_BASE="+base)
				if read == "pagewise" {
					cmd.Env = append(cmd.Env, "BOLTSTORE_HOSTILE_PAGEWISE=1")
				}
				out, err := cmd.CombinedOutput()
				if err != nil {
					lines := strings.Split(string(out), "\n")
					if len(lines) > 40 {
						lines = lines[:40]
					}
					t.Fatalf("the child process failed or crashed (%v):\n%s", err, strings.Join(lines, "\n"))
				}
				for _, l := range strings.Split(string(out), "\n") {
					if _, what, ok := strings.Cut(l, "Reap(dry run): "); ok {
						t.Logf("Reap(dry run): %s", what)
					}
				}
			})
		}
	}
}

// hostileChild patches a copy of base and runs every operation on a fresh
// copy of the result, each bounded in time and in what it allocates.
func hostileChild(t *testing.T, base string, corrupt bool, patch func(testing.TB, *boltFile)) {
	// A runaway allocation fails here instead of taking the machine's memory;
	// a stack overflow (fatal) comes sooner than at Go's 1 GB default.
	if err := unix.Setrlimit(unix.RLIMIT_DATA, &unix.Rlimit{Cur: 3 << 30, Max: 3 << 30}); err != nil {
		t.Logf("setrlimit: %v", err)
	}
	debug.SetMaxStack(256 << 20)
	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	f := parseBoltFile(t, b)
	patch(t, f)
	for _, op := range hostileOps {
		path := filepath.Join(t.TempDir(), "slots.db")
		if err := os.WriteFile(path, f.b, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(path, Options{Clock: newClock(), Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		err, alloc, took, ok := bounded(5*time.Second, func() error {
			return safely(t, op.name, func() error { return op.run(context.Background(), s) })
		})
		if !ok {
			t.Fatalf("%s did not return within %s", op.name, took)
		}
		t.Logf("%s: %v (%s, %d KiB allocated)", op.name, err, took.Round(time.Microsecond), alloc>>10)
		if alloc > 64<<20 {
			t.Errorf("%s allocated %d MiB", op.name, alloc>>20)
		}
		if !corrupt {
			if errors.Is(err, store.ErrCorrupt) {
				t.Errorf("%s on a sound file: %v", op.name, err)
			}
			continue
		}
		if !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", op.name, err)
		} else if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q does not name the file", op.name, err)
		}
	}
}

// bounded runs fn in a goroutine and waits at most d for it. It returns fn's
// error, the bytes allocated meanwhile, how long it took, and false if fn
// did not return in time (its goroutine is left running).
func bounded(d time.Duration, fn func() error) (err error, alloc uint64, took time.Duration, ok bool) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err = <-done:
	case <-time.After(d):
		return nil, 0, time.Since(start), false
	}
	took = time.Since(start)
	runtime.ReadMemStats(&after)
	return err, after.TotalAlloc - before.TotalAlloc, took, true
}

// TestCheckPagesAcceptsBboltFiles: every file bbolt writes passes, through a
// workload that grows, splits, merges and empties trees and sub-buckets two
// levels down, with keys and values now and then longer than a page; and so
// does the tree of the older meta page, which bbolt falls back to when the
// newer one is torn. bbolt's own consistency check agrees on both.
func TestCheckPagesAcceptsBboltFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "slots.db")
	rng := rand.New(rand.NewPCG(7, 7))
	check := func(step int, boltCheck bool) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		torn := parseBoltFile(t, b)
		torn.b = append([]byte(nil), b...)
		torn.b[torn.meta+56] ^= 0xFF // bbolt reads the older meta's tree
		for _, c := range []struct {
			name string
			b    []byte
		}{{"newer meta", b}, {"older meta", torn.b}} {
			p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".db")
			if err := os.WriteFile(p, c.b, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			err = checkPages(f, p)
			f.Close()
			if err != nil {
				t.Fatalf("step %d, %s: %v", step, c.name, err)
			}
			if !boltCheck {
				continue
			}
			db, err := bolt.Open(p, 0o600, &bolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			err = db.View(func(tx *bolt.Tx) error {
				for err := range tx.Check() {
					return err
				}
				return nil
			})
			db.Close()
			if err != nil {
				t.Fatalf("step %d, %s: bbolt's check: %v", step, c.name, err)
			}
		}
	}
	key := func() []byte {
		k := fmt.Appendf(nil, "k%05d", rng.IntN(2000))
		if rng.IntN(20) == 0 {
			k = append(k, make([]byte, rng.IntN(6000))...) // past a page
		}
		return k
	}
	for step := range longtest.Pick(61, 201) {
		db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(func(tx *bolt.Tx) error {
			top, err := tx.CreateBucketIfNotExists(fmt.Appendf(nil, "b%d", rng.IntN(4)))
			if err != nil {
				return err
			}
			sub, err := top.CreateBucketIfNotExists(fmt.Appendf(nil, "s%d", rng.IntN(20)))
			if err != nil {
				return err
			}
			if rng.IntN(3) == 0 {
				if sub, err = sub.CreateBucketIfNotExists(fmt.Appendf(nil, "n%d", rng.IntN(3))); err != nil {
					return err
				}
			}
			switch rng.IntN(6) {
			case 0:
				if err := top.DeleteBucket(fmt.Appendf(nil, "s%d", rng.IntN(20))); !errors.Is(err, berrors.ErrBucketNotFound) {
					return err
				}
				return nil
			case 1:
				c := sub.Cursor()
				for k, v := c.First(); k != nil; k, v = c.Next() {
					if v != nil && rng.IntN(3) > 0 {
						if err := c.Delete(); err != nil {
							return err
						}
					}
				}
				return nil
			default:
				for range rng.IntN(200) {
					v := make([]byte, rng.IntN(3)*rng.IntN(3000)) // now and then a value past a page
					if err := sub.Put(key(), v); err != nil {
						return err
					}
				}
				return nil
			}
		})
		db.Close()
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if step%5 == 0 {
			check(step, step%25 == 0)
		}
	}
}

// BenchmarkCheckPages is the page check that every operation now runs
// before bbolt opens the file: on a store of one limit with two tickets (the
// usual one) and on one of 10,000 tickets in 100 limits.
func BenchmarkCheckPages(b *testing.B) {
	small := filepath.Join(b.TempDir(), "small.db")
	s, err := New(small, Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := s.Enqueue(context.Background(), req(id, "x", 1)); err != nil {
			b.Fatal(err)
		}
	}
	big := filepath.Join(b.TempDir(), "10k.db")
	bench10k(b, big)
	for _, c := range []struct{ name, path string }{{"small", small}, {"tickets=10000", big}} {
		b.Run(c.name, func(b *testing.B) {
			f, err := os.Open(c.path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			st, _ := f.Stat()
			var read int64
			b.ReportAllocs()
			for b.Loop() {
				m, ok := readMeta(f, st.Size())
				if !ok {
					b.Fatal("no meta")
				}
				if read, err = walkPages(f, st.Size(), m); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(read)/1e6, "MB-read/op")
			b.ReportMetric(float64(st.Size())/1e6, "MB-file")
		})
	}
}
