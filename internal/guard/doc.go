// Package guard runs a job under a guard: a small process between slotctl
// and the job's command that is the subreaper of everything the command
// starts. Whatever leaves the command's process group or session (setsid,
// nohup, a double fork, env -i) stays the guard's descendant, so every
// stop, drain and kill reaches the whole job, and "the job is gone" is
// exact: the guard has no child left.
//
// The guard holds one end of a socket; slotctl holds the other. When
// slotctl dies — SIGKILL, the OOM killer — the kernel closes its end, and
// the guard kills the whole job at once and exits: no process of a job
// outlives the supervisor that keeps its lease, on any store, without
// anyone else having to notice. The guard is slotctl's own executable,
// started again under the name slotctl-guard (Main).
package guard
