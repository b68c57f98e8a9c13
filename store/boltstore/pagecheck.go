package boltstore

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/slotctl/slotctl/store"
)

// A member of a shared store's group can write the store file (SPEC §4.5),
// and bbolt trusts its pages: it follows page ids and element offsets read
// from the file without checking them against anything. A branch whose child
// is itself or an ancestor sends its cursor into unbounded recursion (a stack
// overflow, which is fatal in Go) or an ever-growing stack of pages; a page
// reached from two parents is freed twice; counts and offsets reach past the
// page; a freelist that claims 2^30 ids allocates as much. checkPages walks,
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

	// maxPageDepth bounds how deep pages nest, counting a sub-bucket's root
	// as one level below the leaf that holds it. bbolt's B+trees split at
	// half a page, so a file written by bbolt is a handful of levels deep.
	maxPageDepth = 64
	// Page sizes bbolt itself probes for (DB.getPageSizeFromSecondMeta).
	minPageSize = 1 << 10
	maxPageSize = 1 << 24
	// freeChunk is the most free page ids read at a time.
	freeChunk = 8 << 10
)

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
// stay inside the page; that no page is reached twice (a cycle, or a page
// shared by two parents, or a free page in use); and that pages nest at most
// maxPageDepth deep. Each page is visited once, so the walk reads at most
// the file's pages, and holds one page (and its element headers) at a time.
func checkPages(f *os.File, name string) error {
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
		return nil
	}
	m, ok := readMeta(f, st.Size())
	if !ok {
		return nil
	}
	_, err = walkPages(f, st.Size(), m)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", store.ErrCorrupt, name, err)
	}
	return nil
}

// pageWalker reads a bbolt file's pages. It checks a tree: each page is
// marked when a parent first points at it, and a second pointer is refused.
type pageWalker struct {
	r      io.ReaderAt
	psz    uint64
	hwm    uint64
	seen   pageSet
	stack  []pageRef
	page   []byte // the first page size of bytes of the page being visited
	pageAt uint64 // its file offset
	elems  []byte // scratch for a page's element headers past its first bytes
	val    []byte // scratch for a value, an inline page, freelist ids
	nbytes int64  // bytes read, for the benchmarks
}

type pageRef struct {
	id, from uint64 // from: the page that points here (0: the meta page)
	depth    int
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
	w := &pageWalker{r: r, psz: psz, hwm: m.pgid, seen: newPageSet(m.pgid), page: make([]byte, psz)}
	if err := w.push(m.root, 0, 1); err != nil {
		return w.nbytes, fmt.Errorf("meta page (txid %d): root bucket: %v", m.txid, err)
	}
	for len(w.stack) > 0 {
		ref := w.stack[len(w.stack)-1]
		w.stack = w.stack[:len(w.stack)-1]
		if err := w.visit(ref); err != nil {
			return w.nbytes, err
		}
	}
	if m.freelist != pgidNoFreelist {
		if err := w.freelist(m.freelist); err != nil {
			return w.nbytes, err
		}
	}
	return w.nbytes, nil
}

// push marks page id as reached from page from and queues it.
func (w *pageWalker) push(id, from uint64, depth int) error {
	if err := w.mark(id); err != nil {
		return err
	}
	if depth > maxPageDepth {
		return fmt.Errorf("page %d: pages nest more than %d deep", id, maxPageDepth)
	}
	w.stack = append(w.stack, pageRef{id: id, from: from, depth: depth})
	return nil
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

// header reads the first page size of bytes of page id into w.page, checks
// that the page names itself, that its flags are one of want and that its
// overflow pages lie below the high-water mark, and marks those. It returns
// the page's flags, count and size in bytes (with its overflow).
func (w *pageWalker) header(id uint64, want ...uint16) (flags uint16, count int, size uint64, err error) {
	w.pageAt = id * w.psz
	if err := w.readAt(w.page, w.pageAt); err != nil {
		return 0, 0, 0, fmt.Errorf("page %d: %v", id, err)
	}
	le := binary.LittleEndian
	if got := le.Uint64(w.page); got != id {
		return 0, 0, 0, fmt.Errorf("page %d says it is page %d", id, got)
	}
	flags = le.Uint16(w.page[8:])
	if !slices.Contains(want, flags) {
		kinds := make([]string, len(want))
		for i, f := range want {
			kinds[i] = pageKind(f)
		}
		return 0, 0, 0, fmt.Errorf("page %d has flags %#x, want %s", id, flags, strings.Join(kinds, " or "))
	}
	count = int(le.Uint16(w.page[10:]))
	overflow := uint64(le.Uint32(w.page[12:]))
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

// visit checks one page of a B+tree (a bucket's root or a branch's child)
// and queues the pages it points at.
func (w *pageWalker) visit(ref pageRef) error {
	flags, count, size, err := w.header(ref.id, branchPageFlag, leafPageFlag)
	if err != nil {
		return fmt.Errorf("%v (reached from page %d)", err, ref.from)
	}
	if flags == branchPageFlag && count == 0 {
		return fmt.Errorf("branch page %d has no elements", ref.id)
	}
	elems, err := w.inPage(&w.elems, size, 0, pageHeaderSize+uint64(count)*pageElementSize)
	if err != nil {
		return fmt.Errorf("page %d: %d elements: %v", ref.id, count, err)
	}
	le := binary.LittleEndian
	for i := range count {
		at := pageHeaderSize + uint64(i)*pageElementSize
		e := elems[at:]
		if flags == branchPageFlag {
			pos, ksize, child := uint64(le.Uint32(e)), uint64(le.Uint32(e[4:])), le.Uint64(e[8:])
			if ksize == 0 || at+pos+ksize > size {
				return fmt.Errorf("branch page %d: element %d: key of %d bytes at %d is outside the page's %d bytes", ref.id, i, ksize, at+pos, size)
			}
			if err := w.push(child, ref.id, ref.depth+1); err != nil {
				return fmt.Errorf("branch page %d: element %d: %v", ref.id, i, err)
			}
			continue
		}
		eflags, pos, ksize, vsize := le.Uint32(e), uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
		if eflags&^bucketLeafFlag != 0 {
			return fmt.Errorf("leaf page %d: element %d has flags %#x", ref.id, i, eflags)
		}
		if ksize == 0 || at+pos+ksize+vsize > size {
			return fmt.Errorf("leaf page %d: element %d: key of %d bytes and value of %d bytes at %d are outside the page's %d bytes", ref.id, i, ksize, vsize, at+pos, size)
		}
		if eflags&bucketLeafFlag != 0 {
			if err := w.bucket(ref, size, at+pos+ksize, vsize); err != nil {
				return fmt.Errorf("leaf page %d: element %d: sub-bucket: %v", ref.id, i, err)
			}
		}
	}
	return nil
}

// bucket checks the sub-bucket whose value is vsize bytes at offset off of
// leaf page ref (of size bytes), and queues its root page.
func (w *pageWalker) bucket(ref pageRef, size, off, vsize uint64) error {
	if vsize < bucketHeaderSize {
		return fmt.Errorf("value of %d bytes, want at least %d", vsize, bucketHeaderSize)
	}
	le := binary.LittleEndian
	v, err := w.inPage(&w.val, size, off, off+bucketHeaderSize)
	if err != nil {
		return err
	}
	if root := le.Uint64(v); root != 0 {
		return w.push(root, ref.id, ref.depth+1)
	}
	// An inline bucket: a leaf page inside the value. bbolt inlines only a
	// bucket that holds no sub-bucket (Bucket.inlineable), and only a leaf
	// (an inline branch would be its own child), so its elements are plain
	// values.
	if vsize < bucketHeaderSize+pageHeaderSize {
		return fmt.Errorf("inline bucket value of %d bytes, want at least %d", vsize, bucketHeaderSize+pageHeaderSize)
	}
	ip := off + bucketHeaderSize // the inline page, within this page
	isize := vsize - bucketHeaderSize
	h, err := w.inPage(&w.val, size, ip, ip+pageHeaderSize)
	if err != nil {
		return err
	}
	if flags := le.Uint16(h[8:]); flags != leafPageFlag {
		return fmt.Errorf("inline page has flags %#x, want a leaf page", flags)
	}
	count := uint64(le.Uint16(h[10:]))
	if pageHeaderSize+count*pageElementSize > isize {
		return fmt.Errorf("inline page: %d elements do not fit in its %d bytes", count, isize)
	}
	elems, err := w.inPage(&w.val, size, ip, ip+pageHeaderSize+count*pageElementSize)
	if err != nil {
		return err
	}
	for i := range count {
		at := pageHeaderSize + i*pageElementSize
		e := elems[at:]
		eflags, pos, ksize, vsize := le.Uint32(e), uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
		if eflags != 0 {
			return fmt.Errorf("inline page: element %d has flags %#x", i, eflags)
		}
		if ksize == 0 || at+pos+ksize+vsize > isize {
			return fmt.Errorf("inline page: element %d: key of %d bytes and value of %d bytes at %d are outside the page's %d bytes", i, ksize, vsize, at+pos, isize)
		}
	}
	return nil
}

// freelist checks the freelist page: its ids are pages below the high-water
// mark that nothing else uses, each listed once.
func (w *pageWalker) freelist(id uint64) error {
	if err := w.mark(id); err != nil {
		return fmt.Errorf("freelist: %v", err)
	}
	_, count, size, err := w.header(id, freelistPageFlag)
	if err != nil {
		return fmt.Errorf("freelist: %v", err)
	}
	n, first := uint64(count), uint64(0)
	if count == 0xFFFF { // the real count is the first element
		n, first = binary.LittleEndian.Uint64(w.page[pageHeaderSize:]), 1
	}
	if room := (size-pageHeaderSize)/8 - first; n > room || n > w.hwm {
		return fmt.Errorf("freelist page %d lists %d free pages; it holds at most %d, the file has %d pages", id, n, room, w.hwm)
	}
	for done := uint64(0); done < n; {
		k := min(n-done, freeChunk)
		from := pageHeaderSize + (first+done)*8
		b, err := w.inPage(&w.val, size, from, from+k*8)
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

// inPage returns bytes [from, to) of the page in w.page, of size bytes: from
// w.page when they lie in its first page, else read into *scratch. A range
// past the page's end is refused.
func (w *pageWalker) inPage(scratch *[]byte, size, from, to uint64) ([]byte, error) {
	if from > to || to > size {
		return nil, fmt.Errorf("bytes %d to %d are outside the page's %d bytes", from, to, size)
	}
	if to <= uint64(len(w.page)) {
		return w.page[from:to], nil
	}
	if uint64(cap(*scratch)) < to-from {
		*scratch = make([]byte, to-from)
	}
	b := (*scratch)[:to-from]
	if err := w.readAt(b, w.pageAt+from); err != nil {
		return nil, err
	}
	return b, nil
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
