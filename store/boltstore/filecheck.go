package boltstore

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"os"

	"github.com/slotctl/slotctl/store"
)

// bbolt's meta page, as laid out on disk (go.etcd.io/bbolt/internal/common):
// a 16-byte page header, then magic, version, page size, flags, root bucket
// (16 bytes), freelist page, high-water page id, txid, checksum.
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	metaOff        = 16
	metaChecksumAt = metaOff + 56
)

// boltMeta is the meta page bbolt reads a file by.
type boltMeta struct {
	pageSize uint64 // the page size bbolt computes pages by (see bboltPageSize), not the meta's own field
	root     uint64 // page of the root bucket
	freelist uint64 // page of the freelist, or pgidNoFreelist
	pgid     uint64 // high-water mark: pages 0..pgid-1 are in use or free
	txid     uint64
}

// parseMeta decodes the meta of the page that starts at p and reports
// whether it is valid as bbolt's Meta.Validate judges it (magic, version,
// checksum; nothing else).
func parseMeta(p []byte) (m boltMeta, pageSize uint64, valid bool) {
	le := binary.LittleEndian
	b := p[metaOff : metaChecksumAt+8]
	m = boltMeta{root: le.Uint64(b[16:]), freelist: le.Uint64(b[32:]), pgid: le.Uint64(b[40:]), txid: le.Uint64(b[48:])}
	h := fnv.New64a()
	h.Write(b[:56])
	valid = le.Uint32(b[0:]) == boltMagic && le.Uint32(b[4:]) == boltVersion && h.Sum64() == le.Uint64(b[56:])
	return m, uint64(le.Uint32(b[8:])), valid
}

// bboltPageSize is the page size bbolt computes for a file of size bytes
// (DB.getPageSize in go.etcd.io/bbolt v1.5.0): the first meta page's, if that
// one is valid; else that of the first valid meta found 1 KiB, 2 KiB, ...
// 16 MiB into the file; else, if either read worked, the OS page size.
// false: bbolt refuses the file.
func bboltPageSize(r io.ReaderAt, size int64) (uint64, bool) {
	var canRead bool
	var buf [0x1000]byte
	if n, err := r.ReadAt(buf[:], 0); err == nil && n == len(buf) {
		canRead = true
		if _, psz, ok := parseMeta(buf[:]); ok {
			return psz, true
		}
	}
	for i := range 15 {
		pos := int64(1024) << i
		if pos >= size-1024 {
			break
		}
		var buf [0x1000]byte // zeroed: a short read at the end leaves zeros, as in bbolt
		n, err := r.ReadAt(buf[:], pos)
		if (err == nil && n == len(buf)) || (err == io.EOF && int64(n) == size-pos) {
			canRead = true
			if _, psz, ok := parseMeta(buf[:]); ok {
				return psz, true
			}
		}
	}
	if canRead {
		return uint64(os.Getpagesize()), true
	}
	return 0, false
}

// readMeta returns the meta page bbolt will read the file by, chosen as
// bbolt v1.5.0 chooses it (DB.mmap, DB.meta): page 0 and page 1 (one page
// size in), the one with the higher txid if it is valid, else the other if
// that one is valid; page 0 on a tie. false: bbolt refuses the file itself
// (no valid meta, or shorter than two pages), and its own error says why.
func readMeta(r io.ReaderAt, size int64) (boltMeta, bool) {
	psz, ok := bboltPageSize(r, size)
	if !ok || psz > uint64(size)/2 {
		return boltMeta{}, false
	}
	var metas [2]boltMeta
	var valid [2]bool
	for i := range metas {
		buf := make([]byte, metaChecksumAt+8)
		if n, err := r.ReadAt(buf, int64(i)*int64(psz)); n < len(buf) && err != nil {
			continue // past the end: not valid
		}
		metas[i], _, valid[i] = parseMeta(buf)
	}
	a, b := 0, 1
	if metas[1].txid > metas[0].txid {
		a, b = 1, 0
	}
	for _, i := range []int{a, b} {
		if valid[i] {
			m := metas[i]
			m.pageSize = psz
			return m, true
		}
	}
	return boltMeta{}, false
}

// checkSize refuses a store file shorter than its meta page says it is.
// bbolt maps the file into memory and would touch pages past the end: the
// process dies of SIGBUS, which no recover catches (docs/leases.md §7: a truncated
// store file is an error naming the file, never a crash).
func checkSize(m boltMeta, size int64, name string) error {
	if m.pageSize == 0 {
		return nil // checkPages refuses it
	}
	if m.pgid > uint64(size)/m.pageSize {
		need := fmt.Sprintf("%d pages of %d bytes", m.pgid, m.pageSize)
		if m.pgid < 1<<32 && m.pageSize < 1<<31 {
			need = fmt.Sprint(m.pgid * m.pageSize)
		}
		return fmt.Errorf("%w: %s is truncated: %d bytes, its pages need %s", store.ErrCorrupt, name, size, need)
	}
	return nil
}
