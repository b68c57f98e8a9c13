//go:build !race

package etcdstore_test

const raceEnabled = false
