// Package boltstore is the embedded store: limits and tickets in one bbolt
// file on one host, the default store of slotctl.
//
// # Files
//
// A store at PATH is three names in one directory, every one reached from
// one descriptor of that directory (dirfd.go), opened without following a
// symlink and refused if anyone may write it without the sticky bit:
//
//   - PATH, the bbolt file: limits, each limit's queue of tickets in fence
//     order, an index from ticket id to its place, tombstones of removed ids
//     and the bounded event log (records.go has the buckets and the record
//     formats, and checks every record as strictly as a request; see
//     Layout below). It must be
//     a regular file with one link; a missing one is made with O_EXCL and
//     its mode set with fchmod: 0600 in a private directory, 0660 in a shared
//     (group-writable) one. Before bbolt maps it, the page structure bbolt
//     will read is walked on the same descriptor (pagecheck.go): a hostile
//     page is store.ErrCorrupt, never a crash or a hang.
//   - PATH.lock, taken with flock before bbolt opens the file, exclusive
//     for a write, shared for a read (lock.go): it blocks in the kernel,
//     where bbolt's own lock on PATH polls every 50 ms, so the next process
//     gets the store the moment the last one lets go.
//   - PATH.bells/UID/, one named pipe per ticket in its user's own
//     directory: the transaction that admits a waiter, asks a holder to
//     stop or removes a ticket rings its bell after the commit, writing
//     only to a FIFO owned by that user (bell.go).
//
// # Layout
//
// Buckets: meta (format, the fence counter and the other counters), limits
// (name -> size), queue/LIMIT (fence -> ticket: the limit's queue in fence
// order), ids (ticket id -> its first limit and fence), tombstones and
// tombstone-order (removed ids, pruned after a day), events (counter ->
// event). A ticket of several limits (docs/leases.md §2.1 item 9) is stored
// whole in the queue of each of its limits, the same bytes in every one,
// written and deleted together in one transaction: each queue is ordered by
// the one fence sequence, a ticket of one limit costs what it always did,
// and a reader that finds two copies that differ, or a copy missing, has
// found a corrupt store (store.ErrCorrupt). A ticket record holds its
// limits (the first is the one ids points to), its weight and, while held,
// its slot indexes in each limit; and, optional in version 2, its key, the
// stop request a newer run of its key made of it while held, and the held
// tickets it waits to be gone (docs/leases.md §2.1 item 10). An enqueue
// decides its supersede, stop requests and max-waiting on the records its
// own transaction read, and a refusal rolls the whole transaction back. The
// tombstone of a superseded ticket names its successor.
//
// # Format
//
// The meta bucket's format is "2", and every record is of version 2. A
// store written by the previous release (format "1", records of version 1:
// one limit, weight 1, no limits, weight or indexes) opens and works: its
// records read as tickets of one limit and weight 1, the format becomes "2"
// at the first write transaction, and each record becomes version 2 when it
// is next written. A format or record version above 2 is store.ErrCorrupt
// naming it: a newer slotctl wrote it, and this one does not guess.
//
// No file is held open between operations: each opens the file, takes the
// lock, runs one transaction and closes both, so a waiter or a supervisor
// whose child runs never blocks anybody. A directory on a network
// filesystem (NFS, SMB) is refused: flock is not reliable there.
//
// # Clock
//
// Deadlines are kept on the host's boot-time clock together with the boot
// id (clock.go, docs/leases.md rule 5 and §4.4): setting the date does not
// expire a lease, suspend counts as time passing, and a ticket written in an
// earlier boot is expired. Wall times are stored for display only. Tests
// give a Clock of their own.
//
// # Where the protocol happens
//
// Every write that can add or free capacity ends with txn.settle, in the
// same transaction: it reads the queues of the limits it touched and,
// transitively, of every other limit their tickets name (the closure: an
// admission of a ticket of several limits can unblock tickets behind it in
// its others), asks the one planner both stores share (policy.PlanSettle),
// once over all those tickets in fence order, which expired or proven-dead
// tickets to remove (judged on the records as they are in this transaction,
// never on an earlier list) and which waiters to admit, all of a ticket's
// limits at once or none, into the lowest free slots of each, and applies
// that plan. A removal takes a ticket out of every one of its limits, with
// one tombstone and an event in each limit. Renew refuses a ticket that is
// gone or expired (store.ErrLost): expiry is monotone. Release and reap are
// compare-and-delete; only the deletion frees a slot, and the id is
// tombstoned so that it never comes back.
//
// # Caveats
//
//   - The judge (Options.Dead, internal/proc.Dead in slotctl) runs inside
//     the write transaction, under the file lock. It reads /proc and, when
//     it may act, kills the orphaned process group of a dead holder before
//     the slot is handed on: a slow judge holds every other process's
//     operation up, and a sweep can stop a job. Death is judged for every
//     ticket only by Reap; an uncontended admission probes no process.
//   - Every process on the host that uses the store writes the same file:
//     members of a shared store's group can deny each other service or
//     release each other's tickets (docs/leases.md §4.5); what they write is
//     validated on every read, and hostile content is store.ErrCorrupt
//     (exit 69), never a panic.
//   - One host only: for limits shared across hosts use etcdstore.
package boltstore
