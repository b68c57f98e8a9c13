//go:build !linux && !darwin

package boltstore

// networkFS cannot tell here; the README says to keep the store local.
func networkFS(dir string) (string, bool) { return "", false }
