//go:build linux

package diskfault

import (
	"errors"
	"io/fs"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// HoleFreePages punches holes where the bbolt file at path holds no live
// page: its free pages and what lies past the last one. bbolt reads
// neither, and on a full file system a write into a hole fails, so the
// next commit does. It reports how many bytes it punched (0: the next
// commit grows the file). A file that does not exist yet, or is empty, is
// left alone: its first write needs blocks anyway.
func HoleFreePages(path string) (int64, error) {
	if fi, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) || err == nil && fi.Size() == 0 {
		return 0, nil
	}
	// Writable, nothing written: a reader does not load the freelist.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return 0, err
	}
	psz := int64(db.Info().PageSize)
	var free []int64
	var hwm int64
	err = db.View(func(tx *bolt.Tx) error {
		for id := 0; ; id++ {
			p, err := tx.Page(id)
			if err != nil {
				return err
			}
			if p == nil {
				hwm = int64(id)
				return nil
			}
			if p.Type == "free" {
				free = append(free, int64(id))
			}
		}
	})
	db.Close()
	if err != nil {
		return 0, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	var punched int64
	punch := func(off, n int64) error {
		if n <= 0 {
			return nil
		}
		punched += n
		return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	}
	for _, id := range free {
		if err := punch(id*psz, psz); err != nil {
			return punched, err
		}
	}
	return punched, punch(hwm*psz, fi.Size()-hwm*psz)
}
