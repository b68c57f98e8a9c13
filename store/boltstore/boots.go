package boltstore

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/slotctl/slotctl/store"
)

// A bbolt store is local to one machine, and a ticket written in another
// boot has a deadline on a clock that no longer runs: that boot is over,
// and its tickets are expired ("previous boot"). But a different boot id
// proves only that another kernel wrote it — a cloned VM's copy of the
// disk, a sandbox that shows its own boot id, a file shared by two
// machines — so the store keeps the boot ids it was written under (meta
// "boots", oldest first, one a line), and only those are this machine's
// previous boots. A ticket of a boot id it never recorded is not judged by
// the clock here: nothing on this machine can tell whether that boot still
// runs. It stays until it is released (slotctl release), like a ticket
// whose deadline is far ahead.
//
// The list is bounded: the oldest of more than maxBoots boot ids is
// forgotten, and a ticket left from that long ago waits for an operator's
// release. A store first written by a slotctl that did not keep the list
// starts it with the boot ids of the tickets it holds, which that slotctl
// had taken for this machine's.
const maxBoots = 64

// maxBootID bounds one recorded boot id (the kernel's are 36 bytes).
const maxBootID = 128

var keyBoots = []byte("boots")

// boots reads the recorded boot ids; ok is false when the store has none
// recorded yet (never written by this slotctl).
func (x *txn) boots() (ids []string, ok bool, err error) {
	meta := x.bucket(bucketMeta)
	if meta == nil {
		return nil, false, nil
	}
	v := meta.Get(keyBoots)
	if v == nil {
		return nil, false, nil
	}
	if len(v) > maxBoots*(maxBootID+1) {
		return nil, false, fmt.Errorf("%w: meta %q: %d bytes, want at most %d", store.ErrCorrupt, keyBoots, len(v), maxBoots*(maxBootID+1))
	}
	for id := range bytes.SplitSeq(v, []byte{'\n'}) {
		if len(id) == 0 || len(id) > maxBootID || !printableID(id) {
			return nil, false, fmt.Errorf("%w: meta %q: malformed boot id %q", store.ErrCorrupt, keyBoots, store.Printable(string(id)))
		}
		ids = append(ids, string(id))
	}
	return ids, true, nil
}

func printableID(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// noteBoot records the boot of this write transaction, once per boot.
func (x *txn) noteBoot() error {
	if x.now.Boot == "" || len(x.now.Boot) > maxBootID || !printableID([]byte(x.now.Boot)) {
		return nil // not a boot id (a test's clock, a kernel without one)
	}
	ids, ok, err := x.boots()
	if err != nil {
		return err
	}
	if ok && slices.Contains(ids, x.now.Boot) {
		return nil
	}
	if !ok {
		if ids, err = x.ticketBoots(); err != nil {
			return err
		}
	}
	ids = append(ids, x.now.Boot)
	if len(ids) > maxBoots {
		ids = ids[len(ids)-maxBoots:]
	}
	x.known = nil
	return x.bucket(bucketMeta).Put(keyBoots, []byte(joinLines(ids)))
}

// ticketBoots is the boot ids of the tickets in the store, other than this
// transaction's, in the order first met (at most maxBoots-1).
func (x *txn) ticketBoots() ([]string, error) {
	var ids []string
	q := x.bucket(bucketQueue)
	if q == nil {
		return nil, nil
	}
	err := q.ForEachBucket(func(name []byte) error {
		return q.Bucket(name).ForEach(func(_, v []byte) error {
			f, ok := fastFields(v)
			if ok && f.boot != x.now.Boot && f.boot != "" && len(f.boot) <= maxBootID && printableID([]byte(f.boot)) &&
				!slices.Contains(ids, f.boot) && len(ids) < maxBoots-1 {
				ids = append(ids, f.boot)
			}
			return nil
		})
	})
	return ids, err
}

func joinLines(ids []string) string {
	var b bytes.Buffer
	for i, id := range ids {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(id)
	}
	return b.String()
}

// previousBoot reports whether boot (not this transaction's) is one this
// store was written under: a previous boot of this machine. A store with
// no list yet (written only by a slotctl that kept none) takes every boot
// for its own, as that slotctl did.
func (x *txn) previousBoot(boot string) bool {
	if x.known == nil {
		ids, ok, err := x.boots()
		x.known = map[string]bool{}
		if err != nil {
			return false // a malformed list proves nothing; the write path reports it
		}
		x.unlisted = !ok
		for _, id := range ids {
			x.known[id] = true
		}
	}
	return x.unlisted || x.known[boot]
}
