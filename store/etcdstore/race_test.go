//go:build race

package etcdstore_test

// raceEnabled: the race detector slows every round trip several times.
const raceEnabled = true
