//go:build !linux

package guard

// Main does nothing where there is no guard: off Linux a job is its
// process group (README, When things crash).
func Main() {}
