package cli

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// checkTextfile refuses a --textfile whose directory is missing or not a
// directory (exit 64, before the store is read): the file is written in
// that directory and renamed there, so it must exist.
func checkTextfile(path string) error {
	if path == "" {
		return usageError("--textfile \"\": want the path of a file in an existing directory")
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return usageError("--textfile %q: directory %q does not exist: want a file in an existing directory", path, dir)
	case err != nil:
		return usageError("--textfile %q: %v", path, unwrapPathError(err))
	case !st.IsDir():
		return usageError("--textfile %q: %q is not a directory: want a file in an existing directory", path, dir)
	}
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		return usageError("--textfile %q is a directory: want a file name", path)
	}
	return nil
}

// writeTextfile replaces path with data atomically: a temporary file in the
// same directory (named .NAME.*.tmp, which node_exporter's collector, reading
// *.prom, skips), mode 0644 set on the descriptor, synced, then renamed over
// path, and the directory synced. A reader opens the old file or the new
// one, never a part of either; a failure leaves the old file and no
// temporary one. A symlink at path is replaced, not followed.
func writeTextfile(path string, data []byte) (err error) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	tmp, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return textfileError(path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o644); err != nil {
		return textfileError(path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return textfileError(path, err)
	}
	if err := tmp.Sync(); err != nil {
		return textfileError(path, err)
	}
	if err := tmp.Close(); err != nil {
		return textfileError(path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return textfileError(path, err)
	}
	if d, err := os.Open(dir); err == nil { // the rename itself, durable
		_ = d.Sync()
		d.Close()
	}
	return nil
}

func textfileError(path string, err error) error {
	return usageError("--textfile %q: cannot write it: %v", path, unwrapPathError(err))
}
