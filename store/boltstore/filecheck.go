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

// checkFileSize refuses a store file shorter than its own meta page says it
// is. bbolt maps the file into memory and would touch pages past the end: the
// process dies of SIGBUS, which no recover catches (SPEC §7: a truncated
// store file is an error naming the file, never a crash). f is the store
// file as open() opened it; path is for messages.
func checkFileSize(f *os.File, path string) error {
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return nil
	}
	var best struct {
		ok              bool
		txid, pgid, psz uint64
	}
	pageSize := int64(os.Getpagesize())
	for i := int64(0); i < 2; i++ {
		buf := make([]byte, metaChecksumAt+8)
		off := i * pageSize
		if i == 1 && best.ok {
			off = int64(best.psz) // meta 1 sits one page in, by the file's own page size
		}
		if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
			continue
		}
		le := binary.LittleEndian
		m := buf[metaOff:]
		if le.Uint32(m[0:]) != boltMagic || le.Uint32(m[4:]) != boltVersion {
			continue
		}
		h := fnv.New64a()
		h.Write(m[:56])
		if h.Sum64() != le.Uint64(m[56:]) {
			continue
		}
		psz, pgid, txid := uint64(le.Uint32(m[8:])), le.Uint64(m[40:]), le.Uint64(m[48:])
		if !best.ok || txid > best.txid {
			best.ok, best.txid, best.pgid, best.psz = true, txid, pgid, psz
		}
	}
	if !best.ok {
		return nil // not a bbolt file at all: bbolt's open says so
	}
	if need := best.pgid * best.psz; uint64(st.Size()) < need {
		return fmt.Errorf("%w: %s is truncated: %d bytes, its pages need %d", store.ErrCorrupt, path, st.Size(), need)
	}
	return nil
}
