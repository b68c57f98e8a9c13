package boltstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/slotctl/slotctl/store"
)

// A member of a shared store's group can write the store file (docs/leases.md §4.5),
// and bbolt trusts its pages: it follows page ids and element offsets read
// from the file without checking them against anything. A branch whose child
// is itself or an ancestor sends its cursor into unbounded recursion (a stack
// overflow, which is fatal in Go) or an ever-growing stack of pages; a page
// reached from two parents is freed twice; counts and offsets reach past the
// page; a freelist that claims 2^28 ids allocates 2 GiB. checkPages walks,
// before bbolt touches the file, every page bbolt can read from it and
// refuses the file unless those pages form a tree that bbolt's reads and
// writes stay inside. It reads with ReadAt, never through a memory map, so a
// bad offset is an error here, not a fault.

// bbolt's page layout (go.etcd.io/bbolt v1.5.0, internal/common/page.go).
const (
	pageHeaderSize   = 16 // id u64, flags u16, count u16, overflow u32
	pageElementSize  = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags u32, pos u32, ksize u32, vsize u32
	bucketHeaderSize = 16 // root pgid u64 (0: inline), sequence u64
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01
	pgidNoFreelist   = ^uint64(0)
	maxKeySize       = 32768 // bbolt.MaxKeySize: Put refuses longer keys

	// maxPageDepth bounds how deep pages nest, counting a sub-bucket's root
	// as one level below the leaf that holds it. bbolt's B+trees split at
	// half a page, so a file written by bbolt is a handful of levels deep.
	maxPageDepth = 64
	// bbolt creates a file with the OS page size (4 KiB to 64 KiB), and
	// slotctl never asks for another.
	minPageSize = 1 << 10
	maxPageSize = 64 << 10
	// maxBranchPage bounds a branch page with its overflow. bbolt splits a
	// node past a page unless it has at most 4 keys (node.splitTwo), and a
	// key is at most 32 KiB: a branch page it writes is under 256 KiB.
	maxBranchPage = 1 << 20
	// freeChunk is the most free page ids read at a time.
	freeChunk = 8 << 10
)

// readWhole is the largest store file checkPages reads in one call (a
// variable so that the tests can walk small files page by page too).
var readWhole int64 = 1 << 20

// checkPages refuses, with an error wrapping store.ErrCorrupt that names the
// file, a bbolt file whose pages bbolt could not read within bounds. f is the
// descriptor bbolt will map, name is the file's name for the message. A file
// bbolt refuses by itself (empty, no valid meta page, not a regular file) is
// left to bbolt's own error.
//
// From the meta page bbolt will use, chosen exactly as bbolt chooses it, it
// visits the root bucket's pages, every branch page's children, every
// sub-bucket (its root page, or the inline page inside its value) and the
// freelist page, and checks that each page id lies between the meta pages
// and the high-water mark, with its overflow; that each page is of the kind
// its parent says and names itself; that element counts, offsets and sizes
// stay inside the page; that keys are in order, within the bounds their
// branch keys set, as bbolt's own Tx.Check wants them (a cursor's listing
// and its lookups then agree); that keys hold buckets or values where the
// store nests them (see holding); that no page is reached twice (a cycle, or a
// page shared by two parents, or a free page in use); and that pages nest at
// most maxPageDepth deep. Each page is visited once, so the walk reads at
// most the file's pages, and holds at most one page per level.
func checkPages(f *os.File, name string) error {
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
		return nil
	}
	m, ok := readMeta(f, st.Size())
	if !ok {
		return nil
	}
	if err := checkSize(m, st.Size(), name); err != nil {
		return err
	}
	// A small store's pages are read whole, in one call: a page at a time
	// costs a system call per page on every operation (80 for a store of a
	// few tickets). A larger one is read page by page, to bound the memory.
	// Only the pages below the high-water mark can be reached (the walk
	// refuses any other id), and bbolt grows the file ahead of them: a
	// store of a few tickets uses half of its file or less, and reading
	// the rest cost a fresh process a page fault per 4 KiB.
	var r io.ReaderAt = f
	if used := int64(m.pgid * m.pageSize); used <= readWhole {
		buf := make([]byte, used)
		if _, err := f.ReadAt(buf, 0); err == nil {
			r = bytes.NewReader(buf)
		}
	}
	_, err = walkPages(r, st.Size(), m)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", store.ErrCorrupt, name, err)
	}
	return nil
}

// pageWalker reads a bbolt file's pages. It checks a tree: each page is
// marked when it is first reached, and a second path to it is refused.
type pageWalker struct {
	r      io.ReaderAt
	psz    uint64
	hwm    uint64
	seen   pageSet
	levels [][]byte // per depth: the page being visited there (as much of it as was read)
	val    []byte   // scratch for values past a page's first bytes, and freelist ids
	nbytes int64    // bytes read, for the benchmarks
}

// walkPages checks the tree of the file's pages (see checkPages) and returns
// how many bytes it read.
func walkPages(r io.ReaderAt, size int64, m boltMeta) (int64, error) {
	psz := m.pageSize
	if psz < minPageSize || psz > maxPageSize || psz&(psz-1) != 0 {
		return 0, fmt.Errorf("page size %d: want a power of two from %d to %d", psz, minPageSize, maxPageSize)
	}
	if m.pgid > uint64(size)/psz {
		return 0, fmt.Errorf("%d bytes, its pages need %d pages of %d bytes", size, m.pgid, psz)
	}
	w := &pageWalker{r: r, psz: psz, hwm: m.pgid, seen: newPageSet(m.pgid)}
	if _, err := w.tree(m.root, 0, 1, nil, nil, rootBucket); err != nil {
		return w.nbytes, fmt.Errorf("root bucket (meta txid %d): %v", m.txid, err)
	}
	if m.freelist != pgidNoFreelist {
		if err := w.freelist(m.freelist); err != nil {
			return w.nbytes, err
		}
	}
	return w.nbytes, nil
}

func (w *pageWalker) mark(id uint64) error {
	if id < 2 || id >= w.hwm {
		return fmt.Errorf("page id %d is outside the file's pages 2 to %d", id, w.hwm-1)
	}
	if !w.seen.add(id) {
		return fmt.Errorf("page %d is reached twice (a cycle, or a page shared by two parents)", id)
	}
	return nil
}

// header reads the first page size of bytes of page id into buf, checks
// that the page names itself, that its flags are one of want and that its
// overflow pages lie below the high-water mark, and marks those. It returns
// the page's flags, count and size in bytes (with its overflow).
func (w *pageWalker) header(buf []byte, id uint64, want ...uint16) (flags uint16, count int, size uint64, err error) {
	if err := w.readAt(buf[:w.psz], id*w.psz); err != nil {
		return 0, 0, 0, fmt.Errorf("page %d: %v", id, err)
	}
	le := binary.LittleEndian
	if got := le.Uint64(buf); got != id {
		return 0, 0, 0, fmt.Errorf("page %d says it is page %d", id, got)
	}
	flags = le.Uint16(buf[8:])
	if !slices.Contains(want, flags) {
		kinds := make([]string, len(want))
		for i, f := range want {
			kinds[i] = pageKind(f)
		}
		return 0, 0, 0, fmt.Errorf("page %d has flags %#x, want %s", id, flags, strings.Join(kinds, " or "))
	}
	count = int(le.Uint16(buf[10:]))
	overflow := uint64(le.Uint32(buf[12:]))
	if overflow >= w.hwm-id {
		return 0, 0, 0, fmt.Errorf("page %d: its %d overflow pages run past the file's last page %d", id, overflow, w.hwm-1)
	}
	for o := id + 1; o <= id+overflow; o++ {
		if !w.seen.add(o) {
			return 0, 0, 0, fmt.Errorf("page %d: its overflow covers page %d, which is also reached on its own", id, o)
		}
	}
	return flags, count, (overflow + 1) * w.psz, nil
}

func pageKind(flags uint16) string {
	switch flags {
	case branchPageFlag:
		return "a branch page"
	case leafPageFlag:
		return "a leaf page"
	case freelistPageFlag:
		return "a freelist page"
	}
	return fmt.Sprintf("flags %#x", flags)
}

// level returns the buffer of depth d, n bytes long, with what it held.
func (w *pageWalker) level(d int, n uint64) []byte {
	for len(w.levels) <= d {
		w.levels = append(w.levels, nil)
	}
	b := w.levels[d]
	if uint64(cap(b)) < n {
		b = append(b[:cap(b)], make([]byte, n-uint64(cap(b)))...)
	}
	w.levels[d] = b[:n]
	return w.levels[d]
}

// tree checks the B+tree page id (a bucket's root, or a branch's child,
// from page from) at depth d, whose keys must lie in [lo, hi) (nil: open),
// and the sub-buckets its leaves hold. It returns the subtree's last key.
// The key bounds are bbolt's Tx.Check's (recursivelyCheckPageKeyOrder).
func (w *pageWalker) tree(id, from uint64, d int, lo, hi []byte, holds holding) ([]byte, error) {
	p, err := w.treePage(id, from, d)
	if err != nil {
		return nil, err
	}
	prev := lo // the last key so far: the previous key of a leaf, the last key of a branch's previous child
	var keys [2][]byte
	for i := range p.count {
		el, key, err := w.element(p, i, &keys[i%2])
		if err != nil {
			return nil, err
		}
		if err := keyInOrder(id, i, prev, key, hi); err != nil {
			return nil, err
		}
		if p.branch {
			last, err := w.branchChild(p, i, el, key, hi, holds)
			if err != nil {
				return nil, err
			}
			prev = last
			continue
		}
		prev = key
		if err := w.leafElement(p, i, el, key, holds); err != nil {
			return nil, err
		}
	}
	if p.branch || p.count > 0 {
		return prev, nil
	}
	return nil, nil // an empty leaf ends no keys (as in bbolt's check)
}

// treePage is a page of a B+tree that tree visits: as much of it as its
// elements need, in the buffer of its depth.
type treePage struct {
	id     uint64
	d      int // its depth
	buf    []byte
	branch bool   // a branch page, else a leaf
	count  int    // its elements
	size   uint64 // in bytes, with its overflow
}

// treePage marks page id (reached from page from, 0 for a bucket's root)
// at depth d, checks its header and reads it: whole when it is not too
// long (a branch page always), else its element headers. Its keys are
// read one by one after (key).
func (w *pageWalker) treePage(id, from uint64, d int) (treePage, error) {
	if err := w.mark(id); err != nil {
		if from == 0 {
			return treePage{}, err
		}
		return treePage{}, fmt.Errorf("from page %d: %v", from, err)
	}
	if d > maxPageDepth {
		return treePage{}, fmt.Errorf("page %d: pages nest more than %d deep", id, maxPageDepth)
	}
	buf := w.level(d, w.psz)
	flags, count, size, err := w.header(buf, id, branchPageFlag, leafPageFlag)
	if err != nil {
		return treePage{}, fmt.Errorf("%v (reached from page %d)", err, from)
	}
	branch := flags == branchPageFlag
	if branch && count == 0 {
		return treePage{}, fmt.Errorf("branch page %d has no elements", id)
	}
	if branch && size > maxBranchPage {
		return treePage{}, fmt.Errorf("branch page %d is %d bytes long; bbolt writes them under %d", id, size, maxBranchPage)
	}
	if need := pageHeaderSize + uint64(count)*pageElementSize; need > size {
		return treePage{}, fmt.Errorf("page %d: %d elements need %d bytes, the page has %d", id, count, need, size)
	}
	whole := size <= maxBranchPage
	if n := max(w.psz, pageHeaderSize+uint64(count)*pageElementSize); whole || n > w.psz {
		if whole {
			n = size
		}
		buf = w.level(d, n)
		if err := w.readAt(buf[w.psz:], id*w.psz+w.psz); err != nil {
			return treePage{}, fmt.Errorf("page %d: %v", id, err)
		}
	}
	return treePage{id: id, d: d, buf: buf, branch: branch, count: count, size: size}, nil
}

// pageElement is element i of a tree page: its header (e, and the rest of
// the page after it) at offset at, and its key and value, pos bytes after
// the header (a branch element has no value).
type pageElement struct {
	e                     []byte
	at, pos, ksize, vsize uint64
}

// element reads the header of element i of page p and checks that its key
// and value lie inside the page; it returns the key, read into *scratch
// when the page was not read whole.
func (w *pageWalker) element(p treePage, i int, scratch *[]byte) (pageElement, []byte, error) {
	le := binary.LittleEndian
	at := pageHeaderSize + uint64(i)*pageElementSize
	e := p.buf[at:]
	pos, ksize := uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:]))
	var vsize uint64
	if p.branch {
		pos, ksize = uint64(le.Uint32(e)), uint64(le.Uint32(e[4:]))
	} else {
		vsize = uint64(le.Uint32(e[12:]))
	}
	if ksize == 0 || ksize > maxKeySize || at+pos+ksize+vsize > p.size {
		return pageElement{}, nil, fmt.Errorf("page %d: element %d: key of %d bytes and value of %d bytes at %d are outside the page's %d bytes", p.id, i, ksize, vsize, at+pos, p.size)
	}
	key, err := w.key(p.buf, scratch, p.id*w.psz, at+pos, ksize)
	if err != nil {
		return pageElement{}, nil, fmt.Errorf("page %d: element %d: %v", p.id, i, err)
	}
	return pageElement{e: e, at: at, pos: pos, ksize: ksize, vsize: vsize}, key, nil
}

// keyInOrder checks key i of page id against the key before it (prev:
// for the first, its parent's key, nil for none) and its parent's next
// key (hi, nil for none), as bbolt's Tx.Check orders them.
func keyInOrder(id uint64, i int, prev, key, hi []byte) error {
	switch {
	case i == 0 && prev != nil && bytes.Compare(prev, key) > 0:
		return fmt.Errorf("page %d: its first key sorts before its parent's key", id)
	case i > 0 && bytes.Compare(prev, key) >= 0:
		return fmt.Errorf("page %d: key %d is not after the one before it", id, i)
	case hi != nil && bytes.Compare(key, hi) >= 0:
		return fmt.Errorf("page %d: key %d is not before its parent's next key", id, i)
	}
	return nil
}

// branchChild checks the subtree of element i (el, its key key) of branch
// page p, whose keys lie before the next element's key, or before hi for
// the last. It returns the subtree's last key.
func (w *pageWalker) branchChild(p treePage, i int, el pageElement, key, hi []byte, holds holding) ([]byte, error) {
	le := binary.LittleEndian
	at := el.at
	next := hi
	if i+1 < p.count {
		ne := p.buf[at+pageElementSize:]
		npos, nksize := uint64(le.Uint32(ne)), uint64(le.Uint32(ne[4:]))
		if nksize == 0 || nksize > maxKeySize || at+pageElementSize+npos+nksize > p.size {
			return nil, fmt.Errorf("page %d: element %d: key of %d bytes at %d is outside the page's %d bytes", p.id, i+1, nksize, at+pageElementSize+npos, p.size)
		}
		next = p.buf[at+pageElementSize+npos:][:nksize]
	}
	return w.tree(le.Uint64(el.e[8:]), p.id, p.d+1, key, next, holds)
}

// leafElement checks element i (el, its key key) of leaf page p: its
// flags, that it holds what its bucket may (holds), and the sub-bucket it
// holds, if any.
func (w *pageWalker) leafElement(p treePage, i int, el pageElement, key []byte, holds holding) error {
	eflags := binary.LittleEndian.Uint32(el.e)
	if eflags&^bucketLeafFlag != 0 {
		return fmt.Errorf("leaf page %d: element %d has flags %#x", p.id, i, eflags)
	}
	isBucket := eflags&bucketLeafFlag != 0
	if err := holds.allows(key, isBucket); err != nil {
		return fmt.Errorf("leaf page %d: element %d: %v", p.id, i, err)
	}
	if isBucket {
		if err := w.bucket(p.buf, p.id, p.d, p.size, el.at+el.pos+el.ksize, el.vsize, holds.child(key)); err != nil {
			return fmt.Errorf("leaf page %d: element %d: sub-bucket: %v", p.id, i, err)
		}
	}
	return nil
}

// key returns the ksize bytes at offset off of page buf (at file offset
// pageAt): from buf when it holds them, else read into *scratch.
func (w *pageWalker) key(buf []byte, scratch *[]byte, pageAt, off, ksize uint64) ([]byte, error) {
	if off+ksize <= uint64(len(buf)) {
		return buf[off:][:ksize], nil
	}
	if uint64(cap(*scratch)) < ksize {
		*scratch = make([]byte, ksize)
	}
	k := (*scratch)[:ksize]
	return k, w.readAt(k, pageAt+off)
}

// bucket checks the sub-bucket whose value is vsize bytes at offset off of
// leaf page id (of size bytes, at depth d, in buf), and its tree.
func (w *pageWalker) bucket(buf []byte, id uint64, d int, size, off, vsize uint64, holds holding) error {
	if vsize < bucketHeaderSize {
		return fmt.Errorf("value of %d bytes, want at least %d", vsize, bucketHeaderSize)
	}
	le := binary.LittleEndian
	v, err := w.inPage(buf, id*w.psz, off, min(vsize, bucketHeaderSize+pageHeaderSize))
	if err != nil {
		return err
	}
	if root := le.Uint64(v); root != 0 {
		_, err := w.tree(root, id, d+1, nil, nil, holds)
		return err
	}
	// An inline bucket: a leaf page inside the value. bbolt inlines only a
	// bucket that holds no sub-bucket (Bucket.inlineable), and only a leaf
	// (an inline branch would be its own child), so its elements are plain
	// values.
	if vsize < bucketHeaderSize+pageHeaderSize || vsize > bucketHeaderSize+w.psz {
		// bbolt inlines a bucket of at most a quarter page (Bucket.maxInlineBucketSize).
		return fmt.Errorf("inline bucket value of %d bytes, want %d to %d", vsize, bucketHeaderSize+pageHeaderSize, bucketHeaderSize+w.psz)
	}
	if flags := le.Uint16(v[bucketHeaderSize+8:]); flags != leafPageFlag {
		return fmt.Errorf("inline page has flags %#x, want a leaf page", flags)
	}
	count := uint64(le.Uint16(v[bucketHeaderSize+10:]))
	isize := vsize - bucketHeaderSize
	if pageHeaderSize+count*pageElementSize > isize {
		return fmt.Errorf("inline page: %d elements do not fit in its %d bytes", count, isize)
	}
	ip, err := w.inPage(buf, id*w.psz, off+bucketHeaderSize, isize) // the inline page
	if err != nil {
		return err
	}
	var prev []byte
	for i := range count {
		at := pageHeaderSize + i*pageElementSize
		e := ip[at:]
		eflags, pos, ksize, vsize := le.Uint32(e), uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
		if eflags != 0 {
			return fmt.Errorf("inline page: element %d has flags %#x", i, eflags)
		}
		if ksize == 0 || ksize > maxKeySize || at+pos+ksize+vsize > isize {
			return fmt.Errorf("inline page: element %d: key of %d bytes and value of %d bytes at %d are outside the page's %d bytes", i, ksize, vsize, at+pos, isize)
		}
		key := ip[at+pos:][:ksize]
		if err := holds.allows(key, false); err != nil {
			return fmt.Errorf("inline page: element %d: %v", i, err)
		}
		if i > 0 && bytes.Compare(prev, key) >= 0 {
			return fmt.Errorf("inline page: key %d is not after the one before it", i)
		}
		prev = key
	}
	return nil
}

// freelist checks the freelist page: its ids are pages below the high-water
// mark that nothing else uses, each listed once.
func (w *pageWalker) freelist(id uint64) error {
	if err := w.mark(id); err != nil {
		return fmt.Errorf("freelist: %v", err)
	}
	buf := w.level(0, w.psz)
	_, count, size, err := w.header(buf, id, freelistPageFlag)
	if err != nil {
		return fmt.Errorf("freelist: %v", err)
	}
	n, first := uint64(count), uint64(0)
	if count == 0xFFFF { // the real count is the first element
		n, first = binary.LittleEndian.Uint64(buf[pageHeaderSize:]), 1
	}
	if room := (size-pageHeaderSize)/8 - first; n > room || n > w.hwm {
		return fmt.Errorf("freelist page %d lists %d free pages; it holds at most %d, the file has %d pages", id, n, room, w.hwm)
	}
	for done := uint64(0); done < n; {
		k := min(n-done, freeChunk)
		b, err := w.inPage(buf, id*w.psz, pageHeaderSize+(first+done)*8, k*8)
		if err != nil {
			return fmt.Errorf("freelist page %d: %v", id, err)
		}
		for j := range k {
			if err := w.mark(binary.LittleEndian.Uint64(b[j*8:])); err != nil {
				return fmt.Errorf("freelist page %d: free page %d: %v", id, done+j, err)
			}
		}
		done += k
	}
	return nil
}

// inPage returns n bytes at offset off of the page in buf (at file offset
// pageAt): from buf when it holds them, else read into w.val.
func (w *pageWalker) inPage(buf []byte, pageAt, off, n uint64) ([]byte, error) {
	if off+n <= uint64(len(buf)) {
		return buf[off:][:n], nil
	}
	if uint64(cap(w.val)) < n {
		w.val = make([]byte, n)
	}
	b := w.val[:n]
	return b, w.readAt(b, pageAt+off)
}

func (w *pageWalker) readAt(b []byte, off uint64) error {
	if off > 1<<62 {
		return fmt.Errorf("offset %d is past the file", off)
	}
	n, err := w.r.ReadAt(b, int64(off))
	w.nbytes += int64(n)
	if n == len(b) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// holding is what a bucket's keys may hold, as the store nests its buckets
// (records.go): bbolt's root bucket holds only buckets; the queue bucket
// holds one sub-bucket per limit, and those hold tickets; every other bucket
// of the store holds values only. A key of the wrong kind would make bbolt
// refuse the store's Put or CreateBucket (ErrIncompatibleValue) or hide a
// bucket from it. A bucket the store does not know holds anything.
type holding int

const (
	anything holding = iota
	rootBucket
	onlyBuckets // of values
	onlyValues
)

func (h holding) allows(key []byte, isBucket bool) error {
	switch {
	case (h == rootBucket || h == onlyBuckets) && !isBucket:
		return fmt.Errorf("key %q holds a value where the store keeps buckets", key)
	case h == onlyValues && isBucket:
		return fmt.Errorf("key %q holds a bucket where the store keeps values", key)
	}
	return nil
}

// child is what the bucket at key of a bucket holding h may hold.
func (h holding) child(key []byte) holding {
	switch h {
	case rootBucket:
		if bytes.Equal(key, bucketQueue) {
			return onlyBuckets
		}
		if slices.ContainsFunc(allBucketKey, func(k []byte) bool { return bytes.Equal(k, key) }) {
			return onlyValues
		}
		return anything
	case onlyBuckets:
		return onlyValues
	}
	return h
}

// pageSet is the set of pages reached so far: a bitmap for files of up to
// 2^24 pages (2 MiB of bits), a map past that, so that a sparse file with a
// huge high-water mark costs only the pages actually reached.
type pageSet struct {
	bits []uint64
	big  map[uint64]struct{}
}

func newPageSet(hwm uint64) pageSet {
	if hwm <= 1<<24 {
		return pageSet{bits: make([]uint64, (hwm+63)/64)}
	}
	return pageSet{big: map[uint64]struct{}{}}
}

// add adds id and reports whether it was new.
func (s *pageSet) add(id uint64) bool {
	if s.bits != nil {
		w, b := id/64, uint64(1)<<(id%64)
		if s.bits[w]&b != 0 {
			return false
		}
		s.bits[w] |= b
		return true
	}
	if _, ok := s.big[id]; ok {
		return false
	}
	s.big[id] = struct{}{}
	return true
}
