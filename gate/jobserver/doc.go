// Package jobserver makes the slots of a job's ticket the tokens of a GNU
// make jobserver (docs/leases.md §2.1 item 12): a build gets one
// token for each slot its ticket holds beyond the first, so several builds —
// on one host, or on etcd across a farm — share one budget of parallel jobs.
//
// A Server keeps one token in its pipe for each extra slot; a client takes a
// token (reads a byte) to start a job and gives it back (writes it) when the
// job ends. Tokens in use are the extra slots less the bytes still unread
// (FIONREAD) and less those the server has read back. The server grows the
// ticket one slot at a time (store.Store.Resize) while every token is in
// use, the limits have free slots and nobody waits; it gives slots back
// when other jobs wait, or when another build sharing a full limit is below
// its fair share, by reading back tokens: only unread ones, so a token in
// use is never taken back. A client that dies holding a token keeps that
// slot taken until the job ends, when the release frees the whole ticket;
// bytes a client writes back beyond the tokens out are discarded.
//
// Cost: FIONREAD every 20 to 100 ms while the ticket could grow, one
// Snapshot every DefaultLookEvery (five times as often in a server's first
// second, when splits are made; twice as often while its limit is full and
// it has slots to give), no store write while nothing changes.
//
// Two styles: [FIFO] (make 4.4's --jobserver-auth=fifo:PATH, the FIFO in a
// private directory the server removes at Close) and [Pipe]
// (--jobserver-auth=R,W, descriptors the child inherits: make 4.2 and 4.3,
// and older clients). Both are one FIFO: the pipe style unlinks it as soon as
// it is open.
//
// # Caveats
//
// A build that ignores the jobserver (no MAKEFLAGS, or a client that does
// not understand the style) runs with whatever parallelism it chooses while
// its ticket holds one slot. A client returns tokens it read; the server
// cannot tell a token that a dead client took from one in use, so that slot
// stays taken until the job ends. A client that keeps its tokens between
// its own jobs while it has work queued (cargo runs its next crate on the
// last one's token; rustc keeps codegen tokens) returns none until that
// work runs out, so there is nothing to read back before then.
package jobserver
