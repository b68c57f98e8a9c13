package sim

import "github.com/slotctl/slotctl/internal/testkit/diskfault"

// holeFreePages punches holes where the store file holds no live page
// (diskfault.HoleFreePages): on a full file system the next commit fails.
func holeFreePages(path string) error {
	_, err := diskfault.HoleFreePages(path)
	return err
}
