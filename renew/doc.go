// Package renew keeps one ticket's lease alive and declares it lost no later
// than the store could expire it, so the holder can stop its job before the
// slot is handed to someone else.
//
// The local deadline is the send time of the last acknowledged renewal + TTL −
// margin. The send time, not the receive time, because the store may have
// renewed the lease at any moment between the two: a slow ack must not buy
// time. The clock counts through system suspend (CLOCK_BOOTTIME), and the
// deadline is checked on a short watchdog tick and on [Keeper.Check] too,
// because Go timers do not advance while the machine sleeps or the process is
// stopped.
//
// Renewals are jittered so that jobs started together do not renew in
// lockstep. A refusal wrapping [store.ErrLost] is final; any other failure is
// retried with backoff until the deadline. Each store call runs in its own
// goroutine, so a call that hangs cannot delay the verdict. [Keeper.Stop]
// joins every call before it returns, so the caller may release the ticket
// right after it (drain before release).
package renew
