//go:build !linux

package sim

import "errors"

// holeFreePages needs fallocate's hole punching (Linux): a full disk is
// simulated there only (diskfault.go).
func holeFreePages(path string) error { return errors.New("punching holes needs Linux") }
