// Package holder runs the holder's side of the slot protocol as one call:
// join the limit's queue, wait to be admitted, start the job, watch it (the
// lease, forwarded signals, --max-hold, the job's exit), stop it, drain it
// and release the slot as released or lost.
//
// The lease is renewed from the first write (the enqueue counts as the first
// acknowledged renewal), and the job starts only with a lease that has time
// left. While it runs, a lost lease cancels the job's context (as etcd's
// concurrency.Session.Done does) and, unless the caller lets it run on, stops
// it: SIGTERM at once, SIGKILL within the lease's margin, so that the whole
// stop fits before the earliest moment the store could judge the lease
// expired and hand the slot on. The slot is released only once the job and
// what it left in its process group are gone (drain before release), and a
// release after a loss is bounded by what is left of the lease.
//
// Everything the protocol touches is behind a small interface: the store
// (Store), the job (Child, started by a Starter), the lease (Lease, a
// renew.Keeper by default), the clock (a func as renew's) and the waits
// (Waiter). cmd/slotctl gives it a real process, signals and timers; the
// simulation in internal/testkit/sim gives it a simulated child and clock and steps it.
package holder
