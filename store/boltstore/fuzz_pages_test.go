package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
)

// FuzzPageStructure rewrites the page structure of a real store file (page
// headers, branch and leaf elements, sub-bucket roots, inline pages, the
// freelist, the meta pages) and runs what root's reaper and `ls` run on it:
// a Snapshot, a dry-run Reap and a Reap. Each must return within 2 s,
// without panicking or allocating without bound, either successfully or with
// an error wrapping ErrCorrupt that names the file.
//
// The input is a base (0: a small store, 1: one with branch pages three
// levels deep, see hostileBase) and a list of 12-byte patches:
//
//	page u16 | field u8 | elem u8 | value u64 (little-endian)
//
// page and values that are page ids are indexes into the base's pages in
// tree order (pageOrder), so that a patch means the same page on every run:
// bbolt lays the same tree out on different page ids from run to run. See
// applyPatch for the fields.
func FuzzPageStructure(f *testing.F) {
	bases := fuzzBases(f)
	f.Add(uint8(0), []byte{})
	f.Add(uint8(1), []byte{})
	f.Fuzz(func(t *testing.T, base uint8, patches []byte) {
		b := bases[int(base)%len(bases)]
		bf := parseBoltFile(t, bytes.Clone(b.file))
		for len(patches) >= patchSize {
			applyPatch(bf, b.order, patches[:patchSize])
			patches = patches[patchSize:]
		}
		path := filepath.Join(t.TempDir(), "slots.db")
		if err := os.WriteFile(path, bf.b, 0o600); err != nil {
			t.Fatal(err)
		}
		// Ten seconds on: every ticket's lease (10 s) has run out, so Reap rewrites the trees.
		s, err := New(path, Options{Clock: NewFakeClock(Instant{Boot: "b1", Mono: time.Hour + 11*time.Second, Wall: fuzzWall}),
			NoSync: true, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, op := range []struct {
			name string
			run  func() error
		}{
			{"Snapshot", func() error { _, err := s.Snapshot(ctx); return err }},
			{"Reap(dry run)", func() error { _, err := s.Reap(ctx, store.ReapOptions{DryRun: true}); return err }},
			{"Reap", func() error { _, err := s.Reap(ctx, store.ReapOptions{}); return err }},
		} {
			err, alloc, took, ok := bounded(2*time.Second, func() error { return safely(t, op.name, op.run) })
			if !ok {
				t.Fatalf("%s did not return within %s", op.name, took)
			}
			if alloc > 256<<20 {
				t.Fatalf("%s allocated %d MiB", op.name, alloc>>20)
			}
			if err != nil && !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("%s: err = %v, want nil or ErrCorrupt", op.name, err)
			}
			if err != nil && !strings.Contains(err.Error(), path) {
				t.Fatalf("%s: error %q does not name the file", op.name, err)
			}
		}
	})
}

type fuzzBase struct {
	file  []byte
	order []uint64 // pageOrder of the file
}

var (
	fuzzBasesOnce sync.Once
	fuzzBasesVal  []fuzzBase
)

// fuzzBases builds the two base files once per process, on a fixed clock so
// that their records, and so their trees' shapes, are the same on every run.
func fuzzBases(t testing.TB) []fuzzBase {
	fuzzBasesOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fuzzpages")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		clock := func() *FakeClock { return NewFakeClock(Instant{Boot: "b1", Mono: time.Hour, Wall: fuzzWall}) }
		small := filepath.Join(dir, "small.db")
		s, err := New(small, Options{Clock: clock(), NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 12 {
			mustEnqueue(t, s, req(fmt.Sprintf("t%d", i), "x", 2))
		}
		mustEnqueue(t, s, req("y0", "y", 1))
		big := filepath.Join(dir, "big.db")
		hostileBaseOn(t, big, clock())
		for _, p := range []string{small, big} {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			bf := parseBoltFile(t, b)
			fuzzBasesVal = append(fuzzBasesVal, fuzzBase{file: b, order: bf.pageOrder()})
		}
	})
	if fuzzBasesVal == nil {
		t.Fatal("no fuzz bases")
	}
	return fuzzBasesVal
}

// pageOrder lists the pages of the newer meta's tree in the order bbolt's
// keys give them: each page, then its children (a branch's, in element
// order; a leaf's sub-buckets', in key order); then the freelist page and
// the free pages it lists.
func (f *boltFile) pageOrder() []uint64 {
	var out []uint64
	seen := map[uint64]bool{}
	var walk func(id uint64)
	walk = func(id uint64) {
		if seen[id] || id < 2 || id >= f.hwm(f.meta) {
			return
		}
		seen[id] = true
		out = append(out, id)
		for i := range f.count(id) {
			e := f.elem(id, i)
			switch f.flags(id) {
			case 0x01:
				walk(f.child(id, i))
			case 0x02:
				if le.Uint32(f.b[e:])&1 != 0 {
					walk(f.u64(e + int(le.Uint32(f.b[e+4:])) + int(le.Uint32(f.b[e+8:]))))
				}
			}
		}
	}
	walk(f.root(f.meta))
	fl := f.freelist()
	out = append(out, fl)
	n, first := f.count(fl), 0
	if n == 0xFFFF {
		n, first = int(f.u64(f.off(fl)+16)), 1
	}
	for i := range n {
		out = append(out, f.u64(f.off(fl)+16+8*(first+i)))
	}
	return out
}

const patchSize = 12

// Patch fields.
const (
	fieldID           = iota // page header: id (u64)
	fieldFlags               // page header: flags (u16)
	fieldCount               // page header: count (u16)
	fieldOverflow            // page header: overflow (u32)
	fieldElem0               // element: branch pos, leaf flags (u32)
	fieldElem4               // element: branch ksize, leaf pos (u32)
	fieldElem8               // element: leaf ksize (u32)
	fieldElem12              // element: leaf vsize (u32)
	fieldChild               // branch element: child page (u64, a page)
	fieldBucketRoot          // leaf element's value: sub-bucket root (u64, a page)
	fieldInlineFlags         // leaf element's value: inline page flags (u16)
	fieldInlineCount         // leaf element's value: inline page count (u16)
	fieldInlineChild         // leaf element's value: bytes 8-15 of the inline page's first element (u64, raw), a branch's child
	fieldFreeID              // freelist-style u64 at 16+8*elem (a page)
	fieldMetaRoot            // newer meta: root bucket (a page), resealed
	fieldMetaFreelist        // newer meta: freelist (a page), resealed
	fieldMetaPgid            // newer meta: high-water mark moved by int8(value), resealed
	fieldOlderMeta           // older meta: root (a page), high-water mark the newer one's, resealed; elem&1: tear the newer meta
	numFields
)

// patch encodes one patch (for the seed corpus).
func patch(page int, field, elem uint8, value uint64) []byte {
	b := make([]byte, patchSize)
	le.PutUint16(b, uint16(page))
	b[2], b[3] = field, elem
	le.PutUint64(b[4:], value)
	return b
}

// A value that is a page: below 2^62, the page at that index of the order;
// below 2^63, that many pages (mod the high-water mark plus 8, so meta pages
// and pages just past the mark too); else the raw value.
const (
	pageRaw  = 1 << 63
	pageNear = 1 << 62
)

func pageValue(f *boltFile, order []uint64, v uint64) uint64 {
	switch {
	case v&pageRaw != 0:
		return v &^ pageRaw
	case v&pageNear != 0:
		return (v &^ pageNear) % (f.hwm(f.meta) + 8)
	}
	return order[v%uint64(len(order))]
}

// applyPatch applies one patch to page order[page % len(order)] of f.
func applyPatch(f *boltFile, order []uint64, p []byte) {
	id := order[int(le.Uint16(p))%len(order)]
	field, elem, v := p[2]%numFields, int(p[3]), le.Uint64(p[4:])
	at := f.off(id)
	count := f.count(id)
	e := at + 16 + 16*(elem%max(count, 1))
	if e+16 > len(f.b) || at+f.psz > len(f.b) {
		return
	}
	// The value of leaf element e, if it lies in the page.
	value := func() int {
		pos, ksize := int(le.Uint32(f.b[e+4:])), int(le.Uint32(f.b[e+8:]))
		if off := e + pos + ksize; pos < f.psz && ksize < f.psz && off+32 <= at+f.psz {
			return off
		}
		return -1
	}
	switch field {
	case fieldID:
		f.put64(at, pageValue(f, order, v))
	case fieldFlags:
		le.PutUint16(f.b[at+8:], uint16(v))
	case fieldCount:
		le.PutUint16(f.b[at+10:], uint16(v))
	case fieldOverflow:
		le.PutUint32(f.b[at+12:], uint32(v))
	case fieldElem0, fieldElem4, fieldElem8, fieldElem12:
		le.PutUint32(f.b[e+4*int(field-fieldElem0):], uint32(v))
	case fieldChild:
		f.put64(e+8, pageValue(f, order, v))
	case fieldBucketRoot:
		if off := value(); off >= 0 {
			f.put64(off, pageValue(f, order, v))
		}
	case fieldInlineFlags, fieldInlineCount:
		if off := value(); off >= 0 {
			le.PutUint16(f.b[off+16+8+2*int(field-fieldInlineFlags):], uint16(v))
		}
	case fieldInlineChild:
		if off := value(); off >= 0 && off+48 <= at+f.psz {
			f.put64(off+16+16+8, v)
		}
	case fieldFreeID:
		if off := at + 16 + 8*elem; off+8 <= at+f.psz {
			f.put64(off, pageValue(f, order, v))
		}
	case fieldMetaRoot:
		f.put64(f.meta+16, pageValue(f, order, v))
		f.seal(f.meta)
	case fieldMetaFreelist:
		f.put64(f.meta+32, pageValue(f, order, v))
		f.seal(f.meta)
	case fieldMetaPgid:
		f.put64(f.meta+40, uint64(int64(f.hwm(f.meta))+int64(int8(v))))
		f.seal(f.meta)
	case fieldOlderMeta:
		f.put64(f.old+16, pageValue(f, order, v))
		f.put64(f.old+40, f.hwm(f.meta))
		f.seal(f.old)
		if elem&1 != 0 {
			f.b[f.meta+56] ^= 0xFF
		}
	}
}

// TestWritePageCorpus writes the seed corpus of FuzzPageStructure: the
// hostile files of TestHostilePages, as patches. It runs only when asked:
//
//	BOLTSTORE_WRITE_PAGE_CORPUS=1 go test ./store/boltstore -run TestWritePageCorpus
func TestWritePageCorpus(t *testing.T) {
	if os.Getenv("BOLTSTORE_WRITE_PAGE_CORPUS") == "" {
		t.Skip("set BOLTSTORE_WRITE_PAGE_CORPUS=1 to rewrite testdata/fuzz/FuzzPageStructure")
	}
	bases := fuzzBases(t)
	big := parseBoltFile(t, bases[1].file)
	order := bases[1].order
	index := func(id uint64) int {
		for i, p := range order {
			if p == id {
				return i
			}
		}
		t.Fatalf("page %d is not in the order", id)
		return 0
	}
	q := queueBranch(t, big)
	lv := big.branches(q)
	leaf := big.aLeaf(q)
	qi, li := index(q), index(leaf)
	g1, g2 := index(lv[1][0]), index(lv[1][1])
	root := index(big.root(big.meta))
	fl := index(big.freelist())
	if fl == len(order)-1 {
		t.Fatal("the big base has no free pages")
	}
	free := fl + 1
	// The leaf of the queue bucket that holds "x" and limit 7's inline bucket.
	elemOf := func(page uint64, key string) (int, uint8) {
		for i := range big.count(page) {
			e := big.elem(page, i)
			pos, ksize := int(le.Uint32(big.b[e+4:])), int(le.Uint32(big.b[e+8:]))
			if string(big.b[e+pos:e+pos+ksize]) == key {
				return index(page), uint8(i)
			}
		}
		return -1, 0
	}
	// findKey finds key among the leaves of the queue bucket's tree.
	findKey := func(key string) (int, uint8) {
		var leaves []uint64
		var walk func(id uint64)
		walk = func(id uint64) {
			if big.flags(id) == 0x02 {
				leaves = append(leaves, id)
				return
			}
			for i := range big.count(id) {
				walk(big.child(id, i))
			}
		}
		walk(q)
		for _, p := range leaves {
			if i, e := elemOf(p, key); i >= 0 {
				return i, e
			}
		}
		t.Fatalf("no key %q in the queue bucket", key)
		return 0, 0
	}
	xi, xe := findKey("x")
	ii, ie := findKey(longLimit(7))
	cat := func(ps ...[]byte) []byte { return bytes.Join(ps, nil) }
	seeds := map[string]struct {
		base    uint8
		patches []byte
	}{
		"branch-child-self":          {1, patch(qi, fieldChild, 0, uint64(qi))},
		"branch-child-grandparent":   {1, patch(index(lv[1][len(lv[1])-1]), fieldChild, 0, uint64(qi))},
		"branches-share-child":       {1, patch(g2, fieldChild, 0, uint64(index(big.child(lv[1][0], 0))))},
		"branch-child-past-hwm":      {1, patch(qi, fieldChild, 0, pageRaw|(big.hwm(big.meta)+3))},
		"branch-child-meta":          {1, patch(qi, fieldChild, 0, pageRaw|1)},
		"branch-child-freelist":      {1, patch(qi, fieldChild, 0, uint64(fl))},
		"page-names-another":         {1, patch(qi, fieldID, 0, uint64(g1))},
		"branch-empty":               {1, patch(qi, fieldCount, 0, 0)},
		"branch-key-past-page":       {1, patch(qi, fieldElem0, uint8(big.count(q)-1), uint64(big.psz))},
		"branch-count-past-page":     {1, patch(qi, fieldCount, 0, 0xFFFF)},
		"leaf-count-past-page":       {1, patch(li, fieldCount, 0, 0xFFFF)},
		"leaf-value-past-page":       {1, patch(li, fieldElem12, 0, 1<<30)},
		"leaf-overflow-past-hwm":     {1, patch(li, fieldOverflow, 0, 1<<31)},
		"subbucket-root-is-root":     {1, patch(xi, fieldBucketRoot, xe, uint64(root))},
		"subbucket-root-is-parent":   {1, patch(xi, fieldBucketRoot, xe, uint64(qi))},
		"subbucket-root-past-file":   {1, patch(xi, fieldBucketRoot, xe, pageRaw|1<<40)},
		"inline-branch-of-itself":    {1, cat(patch(ii, fieldInlineFlags, ie, 0x01), patch(ii, fieldInlineCount, ie, 1), patch(ii, fieldInlineChild, ie, 0))},
		"freelist-huge-count":        {1, cat(patch(fl, fieldCount, 0, 0xFFFF), patch(fl, fieldFreeID, 0, pageRaw|1<<28))},
		"freelist-lists-page-in-use": {1, patch(fl, fieldFreeID, 0, uint64(qi))},
		"meta-root-freelist":         {1, patch(0, fieldMetaRoot, 0, uint64(fl))},
		"meta-root-past-hwm":         {1, patch(0, fieldMetaRoot, 0, pageRaw|(big.hwm(big.meta)+1))},
		"meta-hwm-lowered":           {1, patch(0, fieldMetaPgid, 0, uint64(0x100-40))},
		// A free page made a branch that is its own child, the root of the
		// older meta, which bbolt falls back to when the newer one is torn.
		"older-meta-cycle-newer-torn": {1, cat(
			patch(free, fieldID, 0, uint64(free)), patch(free, fieldFlags, 0, 0x01), patch(free, fieldCount, 0, 1),
			patch(free, fieldOverflow, 0, 0), patch(free, fieldElem0, 0, 16), patch(free, fieldElem4, 0, 8),
			patch(free, fieldChild, 0, uint64(free)), patch(0, fieldOlderMeta, 1, uint64(free)))},
		"older-meta-root-queue-newer-torn": {1, patch(0, fieldOlderMeta, 1, uint64(qi))},
		"small-root-leaf-count":            {0, patch(0, fieldCount, 0, 0xFFFF)},
		"small-meta-root-meta-page":        {0, patch(0, fieldMetaRoot, 0, pageRaw|0)},
		"small-freelist-is-root":           {0, patch(0, fieldMetaFreelist, 0, 0)},
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzPageStructure")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, s := range seeds {
		body := fmt.Sprintf("go test fuzz v1\nuint8(%d)\n[]byte(%q)\n", s.base, s.patches)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
