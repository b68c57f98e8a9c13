// Package pgstore keeps slotctl's limits and tickets in PostgreSQL, for
// teams that run it already: every step is one transaction, leases run out
// by the server's clock, waiters wake by LISTEN/NOTIFY, and fences come from
// a sequence.
//
// The rules are the policy package's; this package supplies the step. A
// step takes the schema's step lock (a transaction-scoped advisory lock,
// which queues fairly) and the store's one lock row (SELECT ... FOR UPDATE
// on slotctl_meta) before it reads, so steps are serialised as on the
// embedded store; a renewal that moves only its own deadline takes both
// shared. Transaction-scoped locks never outlive their transaction: the
// store works behind a pooler in transaction mode, where a session's
// advisory locks would not. Reads (ls, stats) take no lock: they read one
// snapshot.
//
// Tables, all named slotctl_*, live in the schema the connection's
// search_path names first; the first step creates them.
package pgstore
