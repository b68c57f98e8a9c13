// Package policy is the rules of admission written once, above the
// backends: enqueue with supersede, replace and bounded queues, renewal,
// release and cancel, reap, limits, resize, tombstones, events and counts.
//
// A backend supplies only one atomic step over its state ([Tx]), a
// consistent read ([Backend.View]), wake-ups ([Backend.Watch], [Tx.Ring])
// and its clock; [New] turns it into a [store.Store]. Every rule runs inside
// the step on what the step read, so no decision rests on a read made
// outside it. Which tickets a settle removes and which waiters it admits is
// store.PlanSettle's, and a resize's store.PlanResize's.
package policy
