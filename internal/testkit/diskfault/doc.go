// Package diskfault gives tests real disk faults on Linux, not mocks: a
// test re-run in a private mount namespace (InNamespace) mounts a small
// tmpfs that it fills (ENOSPC on every write that needs a new block), or an
// ext2 file system on a loop device over a memfd that it can break (Break:
// every write the device gets from then on fails, so fsync and every
// writeback report EIO) and later attach again as it was (Reattach: what
// reached the disk, on a device that works). Everything mounted dies with
// the namespace, and the loop device clears itself once unmounted, so a
// test killed half-way leaves nothing behind. Only tests import it.
package diskfault
