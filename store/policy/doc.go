// Package policy is the rules of admission written once, above the
// backends: enqueue with supersede, replace and bounded queues, renewal,
// release and cancel, reap, limits, resize, tombstones, events and counts.
//
// A backend supplies only one atomic step over its state ([Tx]), a
// consistent read ([Backend.View]), wake-ups ([Backend.Watch], [Tx.Ring])
// and its clock; [New] turns it into a [store.Store]. Every rule runs inside
// the step on what the step read, so no decision rests on a read made
// outside it.
//
// A backend whose server does some of it says so through optional
// interfaces: etcd's expires leases ([Expirer]), fences a ticket when its
// step commits ([LateFence]), bounds a step to one transaction of 128
// operations ([Bounded]: a settle out of room carries on in the next step,
// a supersede marks its ticket, Rec.Superseding) and runs a step whose
// answer was lost again while the request's time lasts ([Againer]).
//
// The planners are here too, beside the rules that call them: which tickets
// a settle removes and which waiters it admits is [PlanSettle]'s (plan.go),
// and how a held ticket's weight changes is [PlanResize]'s (planresize.go).
// They are pure functions of what a step read. Their inputs and
// answers ([SettleInput], [Queued], [SettlePlan], [Remove], [Admit],
// [ResizeInput]) and [Verdict], the judging of one ticket that the renewal
// rule shares with the settle, are the planner's own and live with it.
// Package store keeps only the vocabulary that the Store contract itself
// speaks: tickets, limits, events and errors, their checks and bounds,
// Snapshot and Heads, and [store.Judge], which a backend is given to prove
// holders dead. So the test-only mutation switches of the store side
// (internal/mutation) are all in this package, but for wall-clock, which is
// a backend's clock (store/boltstore), and lost-recounted, a bug of etcd's
// event keys (store/etcdstore); package store has none.
package policy
