// Package cluster is slotctl's robustness suite on a real three-member etcd
// cluster (issue 17): its tests start three etcd members on loopback as
// separate processes (the test binary re-executed as an embedded member, so
// that SIGSTOP and SIGKILL hit one member only), run real slotctl-etcd jobs
// through faults (a member paused past the TTL, the leader killed and
// restarted, a holder that reaches only a paused member, a holder cut off by
// a loopback proxy, a rolling restart, thousands of waiters), and check each
// run's history with porcupine against a FIFO semaphore of the limit's size,
// and the children's intervals (never more than the limit at once).
//
// The package has no code outside its tests. The suite runs when
// SLOTCTL_CLUSTER=1 is set (.ci/run does; go test ./... skips it, it takes
// minutes); SLOTCTL_CLUSTER_SOAK=1 adds the full sizes of the issue's
// scale goals (2,000 waiters, 1,000 cancelled at once), which take a quiet
// machine. Each test logs its figures; TestMain prints them all at the end
// as a table (go test -v shows it; so does a failing run).
package cluster
