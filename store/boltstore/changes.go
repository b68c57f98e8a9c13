package boltstore

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/fsnotify/fsnotify"

	"github.com/slotctl/slotctl/store"
)

// Changes returns a channel that receives (coalesced) after every write to
// the store file, until ctx ends: what slotctl ls --watch redraws on. The
// directory is watched, not the file, so a store created later is seen too.
// Waiters do not use it: every renewal writes the file, and hundreds of
// waiters woken by each would be a herd; they have their own bells.
func (s *Store) Changes(ctx context.Context) (<-chan struct{}, error) {
	if err := s.fds.acquire(s.path); err != nil {
		return nil, err
	}
	s.fds.release() // fsnotify watches by path, not through the descriptors
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("%w: watch %s: %v", store.ErrUnavailable, s.path, err)
	}
	if err := w.Add(filepath.Dir(s.path)); err != nil {
		w.Close()
		return nil, fmt.Errorf("%w: watch %s: %v", store.ErrUnavailable, filepath.Dir(s.path), err)
	}
	c := make(chan struct{}, 1)
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Name != s.path || !ev.Has(fsnotify.Write|fsnotify.Create) {
					continue
				}
				select {
				case c <- struct{}{}:
				default:
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
			}
		}
	}()
	return c, nil
}
