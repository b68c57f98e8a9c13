package boltstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// --- helpers ---

const testTTL = 10 * time.Second

func newClock() *FakeClock {
	return NewFakeClock(Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()})
}

// newTestStore returns a store on a new file in a private temp dir.
func newTestStore(t testing.TB, opts Options) (*Store, *FakeClock, string) {
	t.Helper()
	clock, _ := opts.Clock.(*FakeClock)
	if clock == nil {
		clock = newClock()
		opts.Clock = clock
	}
	path := filepath.Join(t.TempDir(), "slots.db")
	s, err := New(path, opts)
	if err != nil {
		t.Fatalf("New(%s): %v", path, err)
	}
	return s, clock, path
}

func req(id, limit string, slots int) store.EnqueueRequest {
	return store.EnqueueRequest{ID: id, Limit: limit, Slots: slots, TTL: testTTL,
		Holder: store.Holder{Host: "h", Pid: 42, Argv: []string{"sleep", "1"}}}
}

func mustEnqueue(t testing.TB, s *Store, r store.EnqueueRequest) store.Ticket {
	t.Helper()
	tk, err := s.Enqueue(context.Background(), r)
	if err != nil {
		t.Fatalf("Enqueue(%s in %s): %v", r.ID, r.Limit, err)
	}
	return tk
}

// safely runs fn and turns a panic into a test error: no input may make the store panic.
func safely(t testing.TB, what string, fn func() error) (err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s panicked: %v", what, r)
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn()
}

// rawUpdate edits the bbolt file directly, bypassing the store.
func rawUpdate(t testing.TB, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("bolt.Open(%s): %v", path, err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatalf("raw update of %s: %v", path, err)
	}
}

// rawView reads the bbolt file directly.
func rawView(t testing.TB, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, ReadOnly: true})
	if err != nil {
		t.Fatalf("bolt.Open(%s): %v", path, err)
	}
	defer db.Close()
	if err := db.View(fn); err != nil {
		t.Fatalf("raw view of %s: %v", path, err)
	}
}

// events reads the event log in order.
func events(t testing.TB, path string) []eventRec {
	t.Helper()
	var out []eventRec
	rawView(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketEvents).ForEach(func(k, v []byte) error {
			var e eventRec
			if err := decode(v, &e); err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
	})
	return out
}

func tombstoned(t testing.TB, path, id string) (inTombs, inOrder bool) {
	t.Helper()
	rawView(t, path, func(tx *bolt.Tx) error {
		inTombs = tx.Bucket(bucketTombs).Get([]byte(id)) != nil
		return tx.Bucket(bucketTombQ).ForEach(func(_, v []byte) error {
			if string(v) == id {
				inOrder = true
			}
			return nil
		})
	})
	return inTombs, inOrder
}

func withUmask(t *testing.T, mask int) {
	old := unix.Umask(mask)
	t.Cleanup(func() { unix.Umask(old) })
}

func perm(t *testing.T, path string) fs.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat: %v", err)
	}
	return st.Mode().Perm()
}

// --- corrupt files ---

// corruptOps are every store operation, run against a store whose file holds
// a ticket "t0" (fence 1) in limit "x".
func corruptOps() []struct {
	name string
	run  func(ctx context.Context, s *Store) error
} {
	return []struct {
		name string
		run  func(ctx context.Context, s *Store) error
	}{
		{"Get", func(ctx context.Context, s *Store) error { _, err := s.Get(ctx, "t0"); return err }},
		{"Snapshot", func(ctx context.Context, s *Store) error { _, err := s.Snapshot(ctx); return err }},
		{"SnapshotLimit", func(ctx context.Context, s *Store) error { _, err := s.Snapshot(ctx, "x"); return err }},
		{"Enqueue", func(ctx context.Context, s *Store) error { _, err := s.Enqueue(ctx, req("new1", "x", 1)); return err }},
		{"Renew", func(ctx context.Context, s *Store) error {
			_, err := s.Renew(ctx, store.Ticket{ID: "t0", Limit: "x", Fence: 1}, testTTL)
			return err
		}},
		{"Release", func(ctx context.Context, s *Store) error {
			_, err := s.Release(ctx, store.Ticket{ID: "t0", Fence: 1}, store.Released)
			return err
		}},
		{"SetLimit", func(ctx context.Context, s *Store) error { _, err := s.SetLimit(ctx, "x", 3); return err }},
		{"RemoveLimit", func(ctx context.Context, s *Store) error { return s.RemoveLimit(ctx, "x", true) }},
	}
}

// checkCorrupt runs every operation on a fresh copy of the file content and
// wants an error wrapping ErrCorrupt that names the file.
func checkCorrupt(t *testing.T, content []byte) { checkCorruptFor(t, content, nil) }

// checkCorruptFor is checkCorrupt where only the operations named in want
// (all when nil) must fail; the others must merely not crash.
func checkCorruptFor(t *testing.T, content []byte, want []string) {
	t.Helper()
	for _, op := range corruptOps() {
		path := filepath.Join(t.TempDir(), "slots.db")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(path, Options{Clock: newClock(), Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		err = safely(t, op.name, func() error { return op.run(context.Background(), s) })
		if want != nil && !slices.Contains(want, op.name) {
			if err != nil && !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("%s: err = %v, want success or ErrCorrupt", op.name, err)
			}
			continue
		}
		if !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%s on corrupt file: err = %v, want ErrCorrupt", op.name, err)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q does not name the file %s", op.name, err, path)
		}
	}
}

// validFile returns the bytes of a store file holding n tickets in limit "x",
// the first of which is "t0" with fence 1.
func validFile(t *testing.T, n int) []byte {
	t.Helper()
	s, _, path := newTestStore(t, Options{NoSync: true})
	for i := range n {
		mustEnqueue(t, s, req(fmt.Sprintf("t%d", i), "x", 1))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCorruptRandomJunk(t *testing.T) {
	for _, size := range []int{1, 100, 4096, 3 * 4096, 64 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			junk := make([]byte, size)
			rand.Read(junk)
			checkCorrupt(t, junk)
		})
	}
}

// inChild runs the test body in a child process when the file content may
// make bbolt fault (SIGBUS, SIGSEGV on its memory map): that is fatal for the
// process, so a crash there fails this test instead of killing the suite.
func inChild(t *testing.T, name string, body func(t *testing.T)) {
	t.Helper()
	if os.Getenv("BOLTSTORE_TEST_CHILD") == name {
		body(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "BOLTSTORE_TEST_CHILD="+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.Split(string(out), "\n")
		if len(lines) > 30 {
			lines = lines[:30]
		}
		t.Fatalf("%s: the child process failed or crashed (%v):\n%s", name, err, strings.Join(lines, "\n"))
	}
}

func TestCorruptTruncated(t *testing.T) {
	inChild(t, "truncated", func(t *testing.T) {
		for _, n := range []int{1, 100} {
			t.Run(fmt.Sprint(n), func(t *testing.T) {
				b := validFile(t, n)
				// Half of the pages in use: bbolt grows a file in steps,
				// and the half of a file may hold every page in use.
				meta, psz := metaPage(b)
				used := int(binary.LittleEndian.Uint64(b[meta+40:])) * psz // the high-water mark
				checkCorrupt(t, b[:min(len(b), used)/2])
			})
		}
	})
}

// Pages other than the two meta pages carry no checksum: a few flipped bits
// there give page ids that bbolt follows into its memory map unchecked.
// metaPage returns the offset of the newer meta page's meta and the page size.
func metaPage(b []byte) (meta, psz int) {
	le := binary.LittleEndian
	const hdr = 16 // page header: id, flags, count, overflow
	psz = int(le.Uint32(b[hdr+8:]))
	meta = hdr
	if le.Uint64(b[psz+hdr+48:]) > le.Uint64(b[hdr+48:]) {
		meta = psz + hdr
	}
	return meta, psz
}

// pointBucketPastFile rewrites, in a valid store file, the root page id of
// top-level bucket name to one far past the end of the file. The meta pages,
// and so the file's size check, stay valid.
func pointBucketPastFile(t *testing.T, b []byte, name string) {
	t.Helper()
	le := binary.LittleEndian
	meta, psz := metaPage(b)
	root := int(le.Uint64(b[meta+16:]))
	p := b[root*psz:]
	if flags := le.Uint16(p[8:]); flags != 0x02 { // a leaf page
		t.Fatalf("root page %d has flags %#x, want a leaf", root, flags)
	}
	for i := range int(le.Uint16(p[10:])) {
		e := p[16+16*i:] // leaf element: flags, pos, ksize, vsize
		pos, ksize := int(le.Uint32(e[4:])), int(le.Uint32(e[8:]))
		if string(e[pos:pos+ksize]) != name {
			continue
		}
		v := e[pos+ksize:] // bucket header: root page id, sequence
		if le.Uint64(v) == 0 {
			t.Fatalf("bucket %s is inline; write more records", name)
		}
		le.PutUint64(v, 1<<24) // 64 GiB into the file: past any mapping
		return
	}
	t.Fatalf("no bucket %s in the root page", name)
}

// inflateFreelist makes the freelist page claim far more free page ids than it
// holds; bbolt copies them while opening the file for writing.
func inflateFreelist(t *testing.T, b []byte) {
	t.Helper()
	le := binary.LittleEndian
	meta, psz := metaPage(b)
	p := b[int(le.Uint64(b[meta+32:]))*psz:]
	if flags := le.Uint16(p[8:]); flags != 0x10 {
		t.Fatalf("freelist page has flags %#x", flags)
	}
	le.PutUint16(p[10:], 0xFFFF) // the real count follows in the first element
	le.PutUint64(p[16:], 1<<20)  // 8 MiB of ids: past the mapping of this small file
}

func TestCorruptPages(t *testing.T) {
	inChild(t, "pages", func(t *testing.T) {
		t.Run("bucket root past the file", func(t *testing.T) {
			b := validFile(t, 10)
			pointBucketPastFile(t, b, string(bucketQueue))
			checkCorrupt(t, b)
		})
		t.Run("freelist count", func(t *testing.T) {
			b := validFile(t, 10)
			inflateFreelist(t, b)
			// One more page makes the file shorter than bbolt's power-of-two
			// mapping, so the read past its end faults every time.
			b = append(b, make([]byte, 4096)...)
			// Reads do not load the freelist; every write does.
			checkCorruptFor(t, b, []string{"Enqueue", "Renew", "Release", "SetLimit", "RemoveLimit"})
		})
	})
}

func TestCorruptFormatVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "slots.db")
	if err := os.WriteFile(path, validFile(t, 2), 0o600); err != nil {
		t.Fatal(err)
	}
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyFormat, []byte("3")) })
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkCorrupt(t, b)
	// The error names the format and what this slotctl reads.
	s, err := New(path, Options{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "t0"); err == nil || !strings.Contains(err.Error(), `store format "3": this slotctl reads formats 1 and 2`) {
		t.Errorf("Get of a format 3 store: %v, want it to name format 3 and the formats read", err)
	}
}

// manyIDs is n distinct ticket ids.
func manyIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%d", i)
	}
	return ids
}

func TestCorruptRecords(t *testing.T) {
	ticketV3, _ := json.Marshal(map[string]any{"v": 3, "id": "t0", "limit": "x", "state": "held", "fence": 1})
	// A ticket a request could not have written (docs/leases.md §4.5: records are
	// checked as strictly as requests; an id from the file names a bell).
	ticket := func(change map[string]any) []byte {
		m := map[string]any{"v": 1, "id": "t0", "limit": "x", "state": "held", "fence": 1, "slot": 0,
			"ttl_ns": int64(testTTL), "deadline_boot": "b1", "deadline_mono_ns": int64(time.Hour), "holder": map[string]any{"host": "h", "pid": 1}}
		for k, v := range change {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return b
	}
	// A ticket of limits x and y and weight 2 as version 2 writes it.
	ticket2 := func(change map[string]any) []byte {
		m := map[string]any{"v": 2, "id": "t0", "limit": "x", "limits": []string{"x", "y"}, "weight": 2, "state": "held", "fence": 1, "slot": 0,
			"indexes": map[string][]int{"x": {0, 1}, "y": {0, 1}}, "ttl_ns": int64(testTTL), "deadline_boot": "b1", "deadline_mono_ns": int64(time.Hour),
			"holder": map[string]any{"host": "h", "pid": 1}}
		for k, v := range change {
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		b, _ := json.Marshal(m)
		return b
	}
	// A command line stored whole, as records written before store.MaxCommand have it, reads.
	longArgv := ticket(map[string]any{"holder": map[string]any{"host": "h", "pid": 1, "argv": []string{"sh", "-c", strings.Repeat("c", 4*store.MaxCommand)}}})
	for _, good := range [][]byte{ticket(nil), ticket(map[string]any{"v": 2}), ticket2(nil), longArgv,
		ticket2(map[string]any{"limits": []string{"x"}, "indexes": map[string][]int{"x": {0, 3}}})} {
		if err := decode(good, &ticketRec{}); err != nil {
			t.Fatalf("the cases' base record %s does not decode: %v", good, err)
		}
	}
	many := make([]string, store.MaxLimits+1)
	ix2 := map[string][]int{}
	for i := range many {
		many[i] = fmt.Sprintf("l%d", i)
		ix2[many[i]] = []int{0, 1}
	}
	many[0] = "x"
	ix := func(x, y []int) map[string][]int { return map[string][]int{"x": x, "y": y} }
	all := []string{"Get", "Snapshot", "SnapshotLimit", "Enqueue", "Renew", "Release", "SetLimit", "RemoveLimit"}
	settles := []string{"Enqueue", "Release", "SetLimit", "RemoveLimit"}
	q := [][]byte{bucketQueue, []byte("x")}
	cases := []struct {
		name   string
		bucket [][]byte // bucket path
		key    []byte
		value  []byte
		ops    []string // the operations that read this record
	}{
		{"ticket v3", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticketV3, all},
		{"ticket garbage", [][]byte{bucketQueue, []byte("x")}, u64key(1), []byte("\x00{garbage"), all},
		{"ticket empty object", [][]byte{bucketQueue, []byte("x")}, u64key(1), []byte("{}"), all},
		{"ticket JSON null", [][]byte{bucketQueue, []byte("x")}, u64key(1), []byte("null"), all},
		{"ticket id a path", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticket(map[string]any{"id": "../../x"}), all},
		{"ticket id too long", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticket(map[string]any{"id": strings.Repeat("a", 65)}), all},
		{"ticket limit a path", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticket(map[string]any{"limit": "../x"}), all},
		{"ticket state", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticket(map[string]any{"state": "gone"}), all},
		{"ticket slot", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticket(map[string]any{"slot": store.MaxSlots}), all},
		{"ticket ttl", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticket(map[string]any{"ttl_ns": 0}), all},
		{"ticket pgid", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticket(map[string]any{"holder": map[string]any{"pid": 1, "pgid": -1}}), all},
		{"ticket bell uid", [][]byte{bucketQueue, []byte("x")}, u64key(1), ticket(map[string]any{"bell_uid": -1}), all},
		{"v1 ticket with limits", q, u64key(1), ticket(map[string]any{"limits": []string{"x", "y"}, "weight": 1}), all},
		{"v1 ticket with weight", q, u64key(1), ticket(map[string]any{"weight": 1}), all},
		{"v1 ticket with indexes", q, u64key(1), ticket(map[string]any{"indexes": map[string][]int{"x": {0}}}), all},
		{"v2 one limit, weight 1 with limits", q, u64key(1), ticket(map[string]any{"v": 2, "limits": []string{"x"}, "weight": 1}), all},
		{"v2 one limit, weight 1 with indexes", q, u64key(1), ticket(map[string]any{"v": 2, "indexes": map[string][]int{"x": {0}}}), all},
		{"v2 no limits", q, u64key(1), ticket2(map[string]any{"limits": nil}), all},
		{"v2 limits empty", q, u64key(1), ticket2(map[string]any{"limits": []string{}}), all},
		{"v2 limits 17", q, u64key(1), ticket2(map[string]any{"limits": many, "indexes": ix2}), all},
		{"v2 limit name a path", q, u64key(1), ticket2(map[string]any{"limits": []string{"x", "../y"}, "indexes": map[string][]int{"x": {0, 1}, "../y": {0, 1}}}), all},
		{"v2 limit twice", q, u64key(1), ticket2(map[string]any{"limits": []string{"x", "x"}}), all},
		{"v2 first limit not limit", q, u64key(1), ticket2(map[string]any{"limits": []string{"y", "x"}}), all},
		{"v2 in another limit's queue", q, u64key(1), ticket2(map[string]any{"limit": "y", "limits": []string{"y", "z"}, "indexes": map[string][]int{"y": {0, 1}, "z": {0, 1}}}), all},
		{"v2 weight 0", q, u64key(1), ticket2(map[string]any{"weight": 0}), all},
		{"v2 no weight", q, u64key(1), ticket2(map[string]any{"weight": nil}), all},
		{"v2 weight 65536", q, u64key(1), ticket2(map[string]any{"weight": store.MaxSlots + 1}), all},
		{"v2 weight negative", q, u64key(1), ticket2(map[string]any{"weight": -1}), all},
		{"v2 held without indexes", q, u64key(1), ticket2(map[string]any{"indexes": nil}), all},
		{"v2 waiting with indexes", q, u64key(1), ticket2(map[string]any{"state": "waiting", "slot": -1, "indexes": map[string][]int{}}), all},
		{"v2 indexes fewer than weight", q, u64key(1), ticket2(map[string]any{"indexes": ix([]int{0}, []int{0, 1})}), all},
		{"v2 indexes more than weight", q, u64key(1), ticket2(map[string]any{"indexes": ix([]int{0, 1}, []int{0, 1, 2})}), all},
		{"v2 indexes descending", q, u64key(1), ticket2(map[string]any{"indexes": ix([]int{0, 1}, []int{1, 0})}), all},
		{"v2 indexes twice", q, u64key(1), ticket2(map[string]any{"indexes": ix([]int{0, 0}, []int{0, 1})}), all},
		{"v2 index 65535", q, u64key(1), ticket2(map[string]any{"indexes": ix([]int{0, 1}, []int{0, store.MaxSlots})}), all},
		{"v2 index negative", q, u64key(1), ticket2(map[string]any{"slot": -1, "indexes": ix([]int{-1, 1}, []int{0, 1})}), all},
		{"v2 indexes of another limit", q, u64key(1), ticket2(map[string]any{"indexes": map[string][]int{"x": {0, 1}, "z": {0, 1}}}), all},
		{"v2 indexes of a limit too many", q, u64key(1), ticket2(map[string]any{"indexes": map[string][]int{"x": {0, 1}, "y": {0, 1}, "z": {0, 1}}}), all},
		{"v2 slot not the lowest index", q, u64key(1), ticket2(map[string]any{"slot": 1}), all},
		// docs/leases.md §2.1 items 10 and 11: a key, a URL, a stop request and replaced ids as a request could make them.
		{"v2 key control character", q, u64key(1), ticket(map[string]any{"v": 2, "key": "main\x1b[2J"}), all},
		{"v2 key too long", q, u64key(1), ticket(map[string]any{"v": 2, "key": strings.Repeat("k", store.MaxKey+1)}), all},
		{"v1 key", q, u64key(1), ticket(map[string]any{"key": "main"}), all},
		{"v2 url control character", q, u64key(1), ticket(map[string]any{"v": 2, "holder": map[string]any{"host": "h", "pid": 1, "url": "https://x/\n"}}), all},
		{"v2 url too long", q, u64key(1), ticket(map[string]any{"v": 2, "holder": map[string]any{"host": "h", "pid": 1, "url": strings.Repeat("u", store.MaxURL+1)}}), all},
		{"v2 stop of a waiting ticket", q, u64key(1), ticket(map[string]any{"v": 2, "state": "waiting", "slot": -1, "stop": map[string]any{"ticket": "n"}}), all},
		{"v2 stop ticket a path", q, u64key(1), ticket(map[string]any{"v": 2, "stop": map[string]any{"ticket": "../n"}}), all},
		{"v2 stop ticket empty", q, u64key(1), ticket(map[string]any{"v": 2, "stop": map[string]any{"host": "h"}}), all},
		{"v2 stop host control character", q, u64key(1), ticket(map[string]any{"v": 2, "stop": map[string]any{"ticket": "n", "host": "h\x1b]0;x\x07"}}), all},
		{"v2 stop host too long", q, u64key(1), ticket(map[string]any{"v": 2, "stop": map[string]any{"ticket": "n", "host": strings.Repeat("h", 256)}}), all},
		{"v2 stop pid negative", q, u64key(1), ticket(map[string]any{"v": 2, "stop": map[string]any{"ticket": "n", "pid": -1}}), all},
		{"v2 stop url control character", q, u64key(1), ticket(map[string]any{"v": 2, "stop": map[string]any{"ticket": "n", "url": "\r"}}), all},
		{"v2 replaces a path", q, u64key(1), ticket(map[string]any{"v": 2, "replaces": []string{"../../x"}}), all},
		{"v2 replaces empty list", q, u64key(1), ticket(map[string]any{"v": 2, "replaces": []string{}}), all},
		{"v2 replaces itself", q, u64key(1), ticket(map[string]any{"v": 2, "replaces": []string{"t0"}}), all},
		{"v2 replaces twice", q, u64key(1), ticket(map[string]any{"v": 2, "replaces": []string{"a", "a"}}), all},
		{"v2 replaces too many", q, u64key(1), ticket(map[string]any{"v": 2, "replaces": manyIDs(policy.MaxReplaces + 1)}), all},
		// Every text field has a bound, checked on decode as on a request;
		// a value over store.MaxRecord is refused before it is read.
		{"holder host too long", q, u64key(1), ticket(map[string]any{"holder": map[string]any{"host": strings.Repeat("h", store.MaxHost+1), "pid": 1}}), all},
		{"holder user too long", q, u64key(1), ticket(map[string]any{"holder": map[string]any{"host": "h", "pid": 1, "user": strings.Repeat("u", store.MaxUser+1)}}), all},
		{"holder boot id too long", q, u64key(1), ticket(map[string]any{"holder": map[string]any{"host": "h", "pid": 1, "boot_id": strings.Repeat("b", store.MaxBootID+1)}}), all},
		{"holder label too long", q, u64key(1), ticket(map[string]any{"holder": map[string]any{"host": "h", "pid": 1, "label": strings.Repeat("l", store.MaxLabel+1)}}), all},
		{"record over MaxRecord (a command line)", q, u64key(1), ticket(map[string]any{"holder": map[string]any{"host": "h", "pid": 1, "argv": []string{"sh", "-c", strings.Repeat("c", store.MaxRecord)}}}), all},
		{"record over MaxRecord", q, u64key(1), ticket(map[string]any{"holder": map[string]any{"host": "h", "pid": 1, "label": strings.Repeat("l", store.MaxRecord)}}), all},
		{"v2 weight times limits over MaxTicketSlots", q, u64key(1), ticket2(map[string]any{"weight": store.MaxSlots, "state": "waiting", "slot": -1, "indexes": nil}), all},
		// Decodes, but its copy in y is missing: what a settle or a removal reads finds it.
		{"v2 copy missing", q, u64key(1), ticket2(nil), settles},
		{"limit slots", [][]byte{bucketLimits}, []byte("x"), []byte(`{"v":1,"slots":70000}`),
			[]string{"Snapshot", "SnapshotLimit", "Enqueue", "Release", "SetLimit", "RemoveLimit"}},
		{"limit named a path", [][]byte{bucketLimits}, []byte("../x"), []byte(`{"v":1,"slots":1}`), []string{"Snapshot"}},
		{"id limit a path", [][]byte{bucketIDs}, []byte("t0"), []byte(`{"v":1,"limit":"../x","fence":1}`), []string{"Get", "Renew", "Release"}},
		// Get and Renew of a held ticket do not read its limit.
		{"limit v3", [][]byte{bucketLimits}, []byte("x"), []byte(`{"v":3,"slots":1}`),
			[]string{"Snapshot", "SnapshotLimit", "Enqueue", "Release", "SetLimit", "RemoveLimit"}},
		{"limit garbage", [][]byte{bucketLimits}, []byte("x"), []byte("slots=1"),
			[]string{"Snapshot", "SnapshotLimit", "Enqueue", "Release", "SetLimit", "RemoveLimit"}},
		{"id garbage", [][]byte{bucketIDs}, []byte("t0"), []byte("[1,2"), []string{"Get", "Renew", "Release"}},
		{"id v3", [][]byte{bucketIDs}, []byte("t0"), []byte(`{"v":3,"limit":"x","fence":1}`), []string{"Get", "Renew", "Release"}},
		// The tombstone of a superseded ticket names its successor: checked as the enqueue that wrote it.
		{"tombstone successor a path", [][]byte{bucketTombs}, []byte("gone"), []byte(`{"v":2,"reason":"superseded","by":{"ticket":"../n"}}`), []string{"GetGone", "RenewGone", "EnqueueGone"}},
		{"tombstone successor host escape", [][]byte{bucketTombs}, []byte("gone"), []byte(`{"v":2,"reason":"superseded","by":{"ticket":"n","host":"\u001b[2J"}}`), []string{"GetGone", "RenewGone", "EnqueueGone"}},
		{"tombstone successor url escape", [][]byte{bucketTombs}, []byte("gone"), []byte(`{"v":2,"reason":"superseded","by":{"ticket":"n","url":"\u0007"}}`), []string{"GetGone", "RenewGone", "EnqueueGone"}},
		{"tombstone successor of a release", [][]byte{bucketTombs}, []byte("gone"), []byte(`{"v":2,"reason":"released","by":{"ticket":"n"}}`), []string{"GetGone", "RenewGone", "EnqueueGone"}},
	}
	base := validFile(t, 2)
	// The operations that read the tombstone of id "gone".
	ops := append(corruptOps(), []struct {
		name string
		run  func(ctx context.Context, s *Store) error
	}{
		{"GetGone", func(ctx context.Context, s *Store) error { _, err := s.Get(ctx, "gone"); return err }},
		{"RenewGone", func(ctx context.Context, s *Store) error {
			_, err := s.Renew(ctx, store.Ticket{ID: "gone", Limit: "x", Fence: 9}, testTTL)
			return err
		}},
		{"EnqueueGone", func(ctx context.Context, s *Store) error { _, err := s.Enqueue(ctx, req("gone", "x", 1)); return err }},
	}...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, op := range ops {
				if !slices.Contains(c.ops, op.name) {
					continue
				}
				path := filepath.Join(t.TempDir(), "slots.db")
				if err := os.WriteFile(path, base, 0o600); err != nil {
					t.Fatal(err)
				}
				rawUpdate(t, path, func(tx *bolt.Tx) error {
					b := tx.Bucket(c.bucket[0])
					for _, name := range c.bucket[1:] {
						b = b.Bucket(name)
					}
					return b.Put(c.key, c.value)
				})
				s, err := New(path, Options{Clock: newClock(), Timeout: 2 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				err = safely(t, op.name, func() error { return op.run(context.Background(), s) })
				if !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("%s: err = %v, want ErrCorrupt", op.name, err)
				} else if !strings.Contains(err.Error(), path) {
					t.Errorf("%s: error %q does not name the file %s", op.name, err, path)
				}
			}
		})
	}
}

// --- missing and empty files ---

func TestMissingFileReadsEmpty(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "slots.db")
	s, err := New(path, Options{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatalf("Snapshot of a missing file: %v", err)
	}
	if len(snap.Limits) != 0 || len(snap.Tickets) != 0 {
		t.Errorf("Snapshot of a missing file = %+v, want empty", snap)
	}
	if _, err := s.Get(ctx, "abc"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get on a missing file: %v, want ErrNotFound", err)
	}
	if _, err := s.Snapshot(ctx, "x"); !errors.Is(err, store.ErrLimitNotFound) {
		t.Errorf("Snapshot(x) on a missing file: %v, want ErrLimitNotFound", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("reads of a missing store created %v", names)
	}
}

func TestEmptyFileReadsEmptyAndIsUsable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "slots.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(path, Options{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(context.Background())
	if err != nil || len(snap.Limits) != 0 {
		t.Fatalf("Snapshot of an empty file = %+v, %v; want empty", snap, err)
	}
	if tk := mustEnqueue(t, s, req("a", "x", 1)); tk.State != store.Held {
		t.Errorf("first ticket in an empty file: %s, want held", tk.State)
	}
}

// --- file modes ---

// A store whose directory is missing is refused, naming the directory,
// unless the caller asks for it to be made (its default location only): a
// mistyped path must not become a new store that excludes nobody.
func TestMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "typo", "state")
	_, err := New(filepath.Join(dir, "slots.db"), Options{Clock: newClock()})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), dir+" does not exist") {
		t.Errorf("New in a missing directory: %v, want ErrUnavailable naming %s", err, dir)
	}
	if _, err := os.Stat(filepath.Dir(dir)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("New made %s (err %v)", filepath.Dir(dir), err)
	}
	if _, err := New(filepath.Join(dir, "slots.db"), Options{Clock: newClock(), MakeDir: true}); err != nil {
		t.Errorf("New with MakeDir: %v", err)
	}
	if got := perm(t, dir); got != 0o700 {
		t.Errorf("store directory made %o, want 700", got)
	}
}

func TestFileModesPrivate(t *testing.T) {
	withUmask(t, 0o022)
	dir := filepath.Join(t.TempDir(), "state", "slotctl")
	path := filepath.Join(dir, "slots.db")
	s, err := New(path, Options{Clock: newClock(), MakeDir: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := perm(t, dir); got != 0o700 {
		t.Errorf("store directory created %o, want 700", got)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("New created the store file (err %v); the first write should", err)
	}
	mustEnqueue(t, s, req("a", "x", 1))
	if got := perm(t, path); got != 0o600 {
		t.Errorf("store file %o, want 600", got)
	}
	if got := perm(t, path+".lock"); got&0o077 != 0 {
		t.Errorf("lock file %o in a private directory, want no group/other bits", got)
	}
	b, err := s.Watch(context.Background(), "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := perm(t, bellDir(path)); got != 0o700 {
		t.Errorf("bell directory %o, want 700", got)
	}
	if got := perm(t, filepath.Dir(bellPath(path, "w1"))); got != 0o700 {
		t.Errorf("user's bell directory %o, want 700", got)
	}
	if got := perm(t, bellPath(path, "w1")); got != 0o600 {
		t.Errorf("bell %o, want 600", got)
	}
}

func TestFileModesShared(t *testing.T) {
	withUmask(t, 0o022)
	for _, mode := range []fs.FileMode{0o770, 0o2770} {
		t.Run(fmt.Sprintf("%o", mode), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "shared")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := unix.Chmod(dir, uint32(mode)); err != nil { // raw bits: 02770 is setgid
				t.Fatal(err)
			}
			path := filepath.Join(dir, "slots.db")
			s, err := New(path, Options{Clock: newClock()})
			if err != nil {
				t.Fatal(err)
			}
			mustEnqueue(t, s, req("a", "x", 1))
			if got := perm(t, path); got != 0o660 {
				t.Errorf("store file in a %o directory with umask 022: %o, want 660", mode, got)
			}
			b, err := s.Watch(context.Background(), "w1")
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if got := perm(t, bellDir(path)); got != 0o770 {
				t.Errorf("bell directory %o, want 770", got)
			}
			if got := perm(t, filepath.Dir(bellPath(path, "w1"))); got != 0o750 {
				t.Errorf("user's bell directory %o, want 750 (the group may open a bell, not change the directory)", got)
			}
			if got := perm(t, bellPath(path, "w1")); got != 0o620 {
				t.Errorf("bell %o, want 620 (the group may ring it)", got)
			}
		})
	}
}

// The lock file is part of a shared store: another member of the group must
// be able to open it read-write to take the writer's lock.
func TestFileModesSharedLockFile(t *testing.T) {
	withUmask(t, 0o022)
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "slots.db")
	s, err := New(path, Options{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, s, req("a", "x", 1))
	if got := perm(t, path+".lock"); got != 0o660 {
		t.Errorf("lock file of a shared store with umask 022: %o, want 660 (other group members cannot take the write lock)", got)
	}
}

// In a setgid shared directory every file of the store, bells included, must
// get the directory's group: a bell in the creator's own group cannot be
// opened for writing by the other members, so their releases never ring it.
func TestFileModesSetgidBellGroup(t *testing.T) {
	withUmask(t, 0o022)
	gid := 12345 // any group: root may give the directory any group
	if os.Geteuid() != 0 {
		groups, _ := os.Getgroups()
		gid = -1
		for _, g := range groups {
			if g != os.Getegid() {
				gid = g
			}
		}
		if gid < 0 {
			t.Skip("needs root or a supplementary group")
		}
	}
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, -1, gid); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(dir, 0o2770); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "slots.db")
	s, err := New(path, Options{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Watch(context.Background(), "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if st, err := os.Stat(bellDir(path)); err != nil || st.Mode()&fs.ModeSetgid == 0 {
		t.Errorf("bell directory in a setgid store directory: %v, %v; want setgid kept", st.Mode(), err)
	}
	var st unix.Stat_t
	if err := unix.Stat(bellPath(path, "w1"), &st); err != nil {
		t.Fatal(err)
	}
	if int(st.Gid) != gid {
		t.Errorf("bell has group %d, want the shared directory's group %d", st.Gid, gid)
	}
}

// --- the file lock ---

func holdLock(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestLockTimeout(t *testing.T) {
	s, clock, path := newTestStore(t, Options{Timeout: 200 * time.Millisecond})
	mustEnqueue(t, s, req("a", "x", 1)) // the file exists, so reads lock too
	lf := holdLock(t, path)
	defer lf.Close()
	ctx := context.Background()
	ops := map[string]func() error{
		"Enqueue":  func() error { _, err := s.Enqueue(ctx, req("b", "x", 1)); return err },
		"Snapshot": func() error { _, err := s.Snapshot(ctx); return err },
		"Release":  func() error { _, err := s.Release(ctx, store.Ticket{ID: "a"}, store.Released); return err },
	}
	for name, op := range ops {
		start := time.Now()
		err := op()
		el := time.Since(start)
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s on a locked store: %v, want ErrUnavailable", name, err)
			continue
		}
		if !strings.Contains(err.Error(), "stayed locked") || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q should say the store %s stayed locked", name, err, path)
		}
		// Typed, with the path and the wait; the flag that sets the wait is
		// the command's word, not the store's.
		var lt *store.LockTimeoutError
		if !errors.As(err, &lt) || lt.Path != path || lt.Waited != 200*time.Millisecond {
			t.Errorf("%s: error %q (%T): want a *store.LockTimeoutError{Path: %s, Waited: 200ms}, got %+v", name, err, err, path, lt)
		}
		if strings.Contains(err.Error(), "--") {
			t.Errorf("%s: error %q names a command-line flag", name, err)
		}
		if el < 150*time.Millisecond || el > 3*time.Second { // not long past it, with room for a loaded machine
			t.Errorf("%s gave up after %v, want about the 200ms timeout", name, el)
		}
	}
	// A ctx deadline shorter than the timeout bounds the wait too.
	s2, _ := New(path, Options{Clock: clock, Timeout: 5 * time.Second})
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := s2.Enqueue(cctx, req("c", "x", 1)); err == nil {
		t.Errorf("Enqueue under a held lock with a 100ms ctx succeeded")
	}
	if el := time.Since(start); el > 2500*time.Millisecond { // half the 5s timeout
		t.Errorf("Enqueue with a 100ms ctx deadline waited %v", el)
	}
}

func TestLockReleaseWakesWaiterPromptly(t *testing.T) {
	s, _, path := newTestStore(t, Options{Timeout: 5 * time.Second, NoSync: true})
	mustEnqueue(t, s, req("seed", "x", 100))
	var lat []time.Duration
	for i := range 10 {
		lf := holdLock(t, path)
		done := make(chan error, 1)
		var finished time.Time
		go func() {
			_, err := s.Enqueue(context.Background(), req(fmt.Sprint("w", i), "x", 100))
			finished = time.Now()
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("Enqueue finished while the lock was held: %v", err)
		default:
		}
		released := time.Now()
		lf.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Enqueue after the lock was released: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("Enqueue still waiting 3s after the lock was released")
		}
		d := finished.Sub(released)
		if d > time.Second {
			t.Errorf("Enqueue finished %v after the lock was released, want < 1s", d)
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	t.Logf("lock wake-up latency (release -> op committed): median %v, min %v, max %v", lat[len(lat)/2], lat[0], lat[len(lat)-1])
}

// --- clocks (docs/leases.md §4.4) ---

func TestWallClockStepExpiresNothing(t *testing.T) {
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	a := mustEnqueue(t, s, req("a", "x", 1))
	mustEnqueue(t, s, req("b", "x", 1))
	for _, step := range []time.Duration{time.Hour, -2 * time.Hour} {
		now := clock.Now()
		now.Wall = now.Wall.Add(step)
		clock.Set(now)
		mustEnqueue(t, s, req(fmt.Sprint("c", step), "x", 1)) // sweeps the limit
		got, err := s.Get(ctx, "a")
		if err != nil {
			t.Fatalf("after stepping the wall clock %v: Get(a): %v", step, err)
		}
		if got.State != store.Held || got.Remaining != testTTL {
			t.Errorf("after stepping the wall clock %v: a is %s with %v left, want held with %v", step, got.State, got.Remaining, testTTL)
		}
		if _, err := s.Renew(ctx, a, testTTL); err != nil {
			t.Errorf("Renew after a wall clock step %v: %v", step, err)
		}
	}
	// The boot clock, not the wall clock, expires it.
	clock.Advance(testTTL)
	if _, err := s.Renew(ctx, a, testTTL); !errors.Is(err, store.ErrLost) {
		t.Errorf("Renew after the boot clock passed the TTL: %v, want ErrLost", err)
	}
}

func TestPreviousBootSwept(t *testing.T) {
	s, clock, path := newTestStore(t, Options{})
	ctx := context.Background()
	mustEnqueue(t, s, req("a", "x", 1))
	// Reboot: a new boot id, and the boot clock starts again near zero.
	clock.Set(Instant{Boot: "b2", Mono: 5 * time.Second, Wall: clock.Now().Wall.Add(time.Minute)})
	if got, err := s.Get(ctx, "a"); err != nil || !got.Expired() {
		t.Errorf("Get(a) after reboot = %+v, %v; want it read as expired", got, err)
	}
	b := mustEnqueue(t, s, req("b", "x", 1))
	if b.State != store.Held {
		t.Errorf("b after the previous boot's holder was swept: %s, want held", b.State)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(a) after the sweep: %v, want ErrNotFound", err)
	}
	found := false
	for _, e := range events(t, path) {
		if e.Ticket == "a" && e.Kind == string(store.Reaped) {
			found = true
			if e.Evidence != "previous boot" {
				t.Errorf("reap evidence %q, want %q", e.Evidence, "previous boot")
			}
		}
	}
	if !found {
		t.Errorf("no reaped event for a")
	}
	if _, err := s.Enqueue(ctx, req("a", "x", 1)); !errors.Is(err, store.ErrRemoved) {
		t.Errorf("re-enqueue of reaped a: %v, want ErrRemoved", err)
	}
}

// --- tombstones ---

func TestTombstones(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	ctx := context.Background()
	a := mustEnqueue(t, s, req("a", "x", 1))
	if ok, err := s.Release(ctx, a, store.Released); !ok || err != nil {
		t.Fatalf("Release(a) = %v, %v", ok, err)
	}
	if _, err := s.Enqueue(ctx, req("a", "x", 1)); !errors.Is(err, store.ErrRemoved) {
		t.Errorf("re-enqueue of released a: %v, want ErrRemoved", err)
	}
	// Cancel before create.
	if ok, err := s.Release(ctx, store.Ticket{ID: "never"}, store.Cancelled); ok || err != nil {
		t.Errorf("Release of an id never seen = %v, %v; want false, nil", ok, err)
	}
	if inTombs, inOrder := tombstoned(t, path, "never"); !inTombs || !inOrder {
		t.Errorf("cancelled id not tombstoned (tombstones %v, order %v)", inTombs, inOrder)
	}
	if _, err := s.Enqueue(ctx, req("never", "x", 1)); !errors.Is(err, store.ErrRemoved) {
		t.Errorf("Enqueue after cancel-before-create: %v, want ErrRemoved", err)
	}
	snap, err := s.Snapshot(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Tickets) != 0 {
		t.Errorf("refused creates left tickets: %+v", snap.Tickets)
	}
}

func TestTombstonePruning(t *testing.T) {
	s, clock, path := newTestStore(t, Options{})
	ctx := context.Background()
	a := mustEnqueue(t, s, req("old", "x", 1))
	if ok, err := s.Release(ctx, a, store.Released); !ok || err != nil {
		t.Fatalf("Release(old) = %v, %v", ok, err)
	}
	clock.Advance(23 * time.Hour)
	if _, err := s.Release(ctx, store.Ticket{ID: "trigger1"}, store.Cancelled); err != nil {
		t.Fatal(err)
	}
	if inTombs, inOrder := tombstoned(t, path, "old"); !inTombs || !inOrder {
		t.Fatalf("tombstone pruned after 23h (tombstones %v, order %v); want kept for 24h", inTombs, inOrder)
	}
	clock.Advance(2 * time.Hour) // 25h after the release
	if _, err := s.Release(ctx, store.Ticket{ID: "trigger2"}, store.Cancelled); err != nil {
		t.Fatal(err)
	}
	if inTombs, inOrder := tombstoned(t, path, "old"); inTombs || inOrder {
		t.Errorf("tombstone of old kept after 25h (tombstones %v, order %v)", inTombs, inOrder)
	}
	if inTombs, _ := tombstoned(t, path, "trigger1"); !inTombs {
		t.Errorf("tombstone of trigger1 (2h old) pruned")
	}
	if inTombs, _ := tombstoned(t, path, "trigger2"); !inTombs {
		t.Errorf("tombstone of trigger2 (new) pruned")
	}
}

// --- event log ---

// prefillEvents writes n events straight into the log, as if earlier
// operations had logged them: 5,000 real enqueue+release pairs take ~10s under
// -race, and what is tested is the bound, not the writer.
func prefillEvents(t *testing.T, path string, n int) {
	t.Helper()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEvents)
		for i := uint64(1); i <= uint64(n); i++ {
			e := eventRec{V: formatVersion, Event: store.Event{Seq: i, Kind: "admitted", Limit: "x", Ticket: fmt.Sprintf("pre%d", i), Fence: i}}
			if err := b.Put(u64key(i), encode(&e)); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keyEventSeq, u64key(uint64(n)))
	})
}

func TestEventLogBounded(t *testing.T) {
	s, _, path := newTestStore(t, Options{NoSync: true})
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "x", 1); err != nil { // creates the file; logs nothing
		t.Fatal(err)
	}
	const pre, pairs = 9900, 100 // each pair logs "admitted" and "released": 10,100 events in all
	prefillEvents(t, path, pre)
	var last string
	for i := range pairs {
		last = fmt.Sprintf("e%d", i)
		tk := mustEnqueue(t, s, req(last, "x", 1))
		if _, err := s.Release(ctx, tk, store.Released); err != nil {
			t.Fatal(err)
		}
	}
	const total = pre + 2*pairs
	evs := events(t, path)
	if len(evs) != store.MaxEvents {
		t.Errorf("event log holds %d events after %d were logged, want the newest %d", len(evs), total, store.MaxEvents)
	}
	newest := evs[len(evs)-1]
	if newest.Ticket != last || newest.Kind != string(store.Released) || newest.Seq != total {
		t.Errorf("newest event = %+v, want the release of %s with seq %d", newest, last, total)
	}
	if first := evs[0]; first.Seq != total-store.MaxEvents+1 {
		t.Errorf("oldest kept event has seq %d, want %d", first.Seq, total-store.MaxEvents+1)
	}
}

// A log far over the bound (written by an older version, say) shrinks back
// under it within a few transactions, each pruning a bounded batch.
func TestEventLogOverBoundShrinks(t *testing.T) {
	s, _, path := newTestStore(t, Options{NoSync: true})
	ctx := context.Background()
	if _, err := s.SetLimit(ctx, "x", 1); err != nil {
		t.Fatal(err)
	}
	const pre = store.MaxEvents + 150
	prefillEvents(t, path, pre)
	for i := range 4 { // 8 events, each pruning up to pruneBatch
		tk := mustEnqueue(t, s, req(fmt.Sprintf("e%d", i), "x", 1))
		if _, err := s.Release(ctx, tk, store.Released); err != nil {
			t.Fatal(err)
		}
	}
	evs := events(t, path)
	if len(evs) != store.MaxEvents {
		t.Errorf("event log holds %d events, want %d", len(evs), store.MaxEvents)
	}
	if evs[len(evs)-1].Seq != pre+8 {
		t.Errorf("newest event seq %d, want %d", evs[len(evs)-1].Seq, pre+8)
	}
}

// --- bells ---

func rang(b store.Bell, within time.Duration) bool {
	select {
	case <-b.C():
		return true
	case <-time.After(within):
		return false
	}
}

// bellPath is where this process's bell of ticket id is.
func bellPath(storePath, id string) string {
	return filepath.Join(bellDir(storePath), strconv.Itoa(os.Geteuid()), id)
}

func TestBellRingsOnPromotion(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	h := mustEnqueue(t, s, req("h", "x", 1))
	b, err := s.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if w := mustEnqueue(t, s, req("w", "x", 1)); w.State != store.Waiting {
		t.Fatalf("w is %s, want waiting", w.State)
	}
	if rang(b, 50*time.Millisecond) {
		t.Errorf("bell rang on enqueue as a waiter")
	}
	start := time.Now()
	if _, err := s.Release(ctx, h, store.Released); err != nil {
		t.Fatal(err)
	}
	if !rang(b, time.Second) {
		t.Fatalf("bell of the promoted waiter did not ring within 1s")
	}
	t.Logf("bell rang %v after Release began", time.Since(start))
	if got, _ := s.Get(ctx, "w"); got.State != store.Held {
		t.Errorf("after the ring w is %s, want held", got.State)
	}
}

func TestBellOnlyForPromoted(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	h := mustEnqueue(t, s, req("h", "x", 1))
	var bells []store.Bell
	for _, id := range []string{"w1", "w2", "w3"} {
		b, err := s.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		bells = append(bells, b)
		mustEnqueue(t, s, req(id, "x", 1))
	}
	if _, err := s.Release(ctx, h, store.Released); err != nil {
		t.Fatal(err)
	}
	if !rang(bells[0], time.Second) {
		t.Errorf("first waiter's bell did not ring within 1s")
	}
	// The second comes into line: it is woken to renew from now on
	// (docs/leases.md rule 17). The third is neither promoted nor in line.
	if !rang(bells[1], time.Second) {
		t.Errorf("second waiter's bell did not ring as it came into line")
	}
	if rang(bells[2], 300*time.Millisecond) {
		t.Errorf("third waiter's bell rang though it was neither promoted nor brought into line")
	}
}

func TestBellFileRemoved(t *testing.T) {
	s, _, path := newTestStore(t, Options{})
	ctx := context.Background()
	bellPath := func(id string) string { return bellPath(path, id) }

	// Close removes it.
	b, err := s.Watch(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(bellPath("c1"))
	if err != nil || st.Mode().Type() != fs.ModeNamedPipe {
		t.Fatalf("bell after Watch: %v, %v; want a named pipe", st, err)
	}
	b.Close()
	if _, err := os.Lstat(bellPath("c1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("bell after Close: %v, want removed", err)
	}
	b.Close() // idempotent

	// Removing the ticket removes it (and rings it: the waiter learns at once).
	b, err = s.Watch(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tk := mustEnqueue(t, s, req("r1", "x", 1)) // held at once: its promotion rings
	if !rang(b, time.Second) {
		t.Errorf("bell of a ticket admitted on enqueue did not ring")
	}
	if _, err := s.Release(ctx, tk, store.Released); err != nil {
		t.Fatal(err)
	}
	if !rang(b, time.Second) {
		t.Errorf("bell of a removed ticket did not ring")
	}
	if _, err := os.Lstat(bellPath("r1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("bell after its ticket was removed: %v, want removed", err)
	}
}

func TestWatchRefusesBadID(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	for _, id := range []string{"", "../x", "a/b", strings.Repeat("a", 65), "a b"} {
		if b, err := s.Watch(context.Background(), id); !errors.Is(err, store.ErrInvalid) {
			if b != nil {
				b.Close()
			}
			t.Errorf("Watch(%q): %v, want ErrInvalid", id, err)
		}
	}
}

// --- naming ---

func TestSnapshotUnknownLimit(t *testing.T) {
	s, _, _ := newTestStore(t, Options{})
	mustEnqueue(t, s, req("a", "x", 1))
	if _, err := s.Snapshot(context.Background(), "x", "nope"); !errors.Is(err, store.ErrLimitNotFound) {
		t.Errorf("Snapshot(x, nope): %v, want ErrLimitNotFound", err)
	} else if !strings.Contains(err.Error(), "nope") {
		t.Errorf("error %q does not name the limit", err)
	}
}

func TestStringIsAbsoluteURL(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(wd, "rel", "slots.db")
	for _, p := range []string{"rel/slots.db", "./rel/../rel/slots.db", want} {
		s, err := New(p, Options{Clock: newClock(), MakeDir: true})
		if err != nil {
			t.Fatalf("New(%q): %v", p, err)
		}
		if s.Path() != want || s.String() != "bolt://"+want {
			t.Errorf("New(%q): Path %q String %q, want %q", p, s.Path(), s.String(), "bolt://"+want)
		}
	}
}

// A decoded record is written back by promotions and renewals: encoding what
// decode accepted must not fail.
func TestRecordRoundTrip(t *testing.T) {
	r := ticketRec{V: formatVersion, Rec: policy.Rec{ID: "a", Limit: "x", Limits: []string{"x", "y"}, Weight: 2, State: store.Held, Fence: 7, Slot: 0,
		Indexes: map[string][]int{"x": {0, 3}, "y": {1, 2}}, TTL: testTTL,
		DeadlineBoot: "b1", DeadlineMono: time.Hour, Created: time.Now(), Holder: store.Holder{Host: "h", Pid: 1}}}
	var back ticketRec
	if err := decode(encode(&r), &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encode(&back), encode(&r)) {
		t.Errorf("round trip changed the record:\n%s\n%s", encode(&r), encode(&back))
	}
}

// A Store keeps its directory open (and its bells directory, once used) and
// has no Close: the descriptors go when the Store does.
func TestStoreDescriptorsReleased(t *testing.T) {
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(ents)
	}
	path := filepath.Join(t.TempDir(), "slots.db")
	before := fds()
	for i := range 200 {
		s, err := New(path, Options{Clock: newClock(), NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.Watch(context.Background(), fmt.Sprintf("w%d", i))
		if err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	var after int
	for range 50 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
		if after = fds(); after < before+20 {
			return
		}
	}
	t.Errorf("descriptors: %d before 200 stores, %d after they went", before, after)
}

// openFDs counts this process's open descriptors.
// openFDs counts this process's descriptors of dir and what is in it: not
// all of them, which an earlier test's goroutine may be opening or closing
// meanwhile.
func openFDs(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && (target == dir || strings.HasPrefix(target, dir+"/")) {
			n++
		}
	}
	return n
}

// Close closes the store's directory descriptors (the store's directory and
// its bells directory), not waiting for the garbage collector's cleanup;
// a second Close is a no-op, and a Close during an operation waits for it
// to stop using them.
func TestCloseClosesDescriptors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "slots.db")
	ctx := context.Background()
	before := openFDs(t, dir)
	s, err := New(path, Options{Clock: newClock(), NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, s, req("a", "x", 1))
	b, err := s.Watch(ctx, "w") // opens the bells directory
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if n := openFDs(t, dir); n < before+2 {
		t.Fatalf("%d descriptors open with the store and its bells directory, want at least %d", n, before+2)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := openFDs(t, dir); n != before {
		t.Fatalf("%d descriptors open after Close, want the %d of before New", n, before)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}

	// Closed in the middle of an operation: the operation finishes on
	// descriptors still open, and they are closed when it is done.
	s2, err := New(path, Options{Clock: newClock(), NoSync: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lf := holdLock(t, path)
	done := make(chan error, 1)
	go func() { _, err := s2.Enqueue(ctx, req("b", "x", 1)); done <- err }()
	time.Sleep(100 * time.Millisecond) // s2's Enqueue waits for the lock
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	s2.fds.mu.Lock()
	shut, users := s2.fds.shutFD, s2.fds.users
	s2.fds.mu.Unlock()
	if shut || users != 1 {
		t.Fatalf("Close during an operation: descriptors closed %v, %d users; want them open for the 1 operation", shut, users)
	}
	lf.Close()
	if err := <-done; err != nil {
		t.Fatalf("Enqueue in flight during Close: %v", err)
	}
	if n := openFDs(t, dir); n != before {
		t.Fatalf("%d descriptors open after the operation ended, want %d", n, before)
	}
	if _, err := s2.Enqueue(ctx, req("c", "x", 1)); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Enqueue after Close: %v, want ErrClosed", err)
	}
}

// TestCorruptEventText: an event of the log is bounded as a ticket is, and
// an oversized one is refused unread.
func TestCorruptEventText(t *testing.T) {
	ev := func(change func(e *store.Event)) []byte {
		e := eventRec{V: formatVersion, Event: store.Event{Kind: "admitted", Limit: "x", Ticket: "t0", Fence: 1, Host: "h", Command: "make"}}
		change(&e.Event)
		return encode(&e)
	}
	if err := decode(ev(func(*store.Event) {}), &eventRec{}); err != nil {
		t.Fatalf("the base event: %v", err)
	}
	for name, b := range map[string][]byte{
		"host":     ev(func(e *store.Event) { e.Host = strings.Repeat("h", store.MaxHost+1) }),
		"user":     ev(func(e *store.Event) { e.User = strings.Repeat("u", store.MaxUser+1) }),
		"evidence": ev(func(e *store.Event) { e.Evidence = strings.Repeat("e", store.MaxEvidence+1) }),
		"record":   ev(func(e *store.Event) { e.Command = strings.Repeat("c", store.MaxRecord) }),
	} {
		if err := decode(b, &eventRec{}); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("event %s over its bound: %v, want ErrCorrupt", name, err)
		}
	}
}
