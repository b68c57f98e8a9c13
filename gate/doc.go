// Package gate admits a job into a named limit the way the job sees it: join
// the limit's queue, sleep until promoted, give up at a deadline, and let go.
//
// A Gate never admits on its own judgement: the store's transaction that frees
// a slot promotes the next waiter, and the waiter only confirms that its
// ticket is held. Waking is event-driven (the store's Bell) with a slow,
// jittered poll as the safety net, so a queue of hundreds of waiters costs
// next to nothing and a release wakes only the waiters it admitted.
package gate
