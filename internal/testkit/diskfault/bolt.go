package diskfault

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Dump is every key of every bucket of the bbolt file at path, nested
// buckets too, with its value: what a failed write must leave as it was.
// A file that does not exist, or is empty, dumps as nothing.
func Dump(path string) (_ map[string]string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bbolt: %v", r) // it panics on some damaged pages
		}
	}()
	out := map[string]string{}
	if fi, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) || err == nil && fi.Size() == 0 {
		return out, nil
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var walk func(prefix string, b *bolt.Bucket) error
	walk = func(prefix string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			key := prefix + "/" + fmt.Sprintf("%q", k)
			if v == nil {
				return walk(key, b.Bucket(k))
			}
			out[key] = string(v)
			return nil
		})
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(fmt.Sprintf("%q", name), b) })
	})
	return out, err
}

// Diff lists the keys of two dumps that differ, one per line: - gone,
// + new, ~ changed (the first 20); "" when they are the same.
func Diff(a, b map[string]string) string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			out = append(out, "- "+k)
		} else if v != w {
			out = append(out, "~ "+k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, "+ "+k)
		}
	}
	slices.Sort(out)
	if len(out) > 20 {
		out = append(out[:20], fmt.Sprintf("(%d more)", len(out)-20))
	}
	return strings.Join(out, "\n")
}
