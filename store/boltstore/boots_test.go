package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/slotctl/slotctl/store"
)

// setDeadlineBoot rewrites ticket id's deadline boot in the file, as a
// copy from another machine (or a member's forged record) has it.
func setDeadlineBoot(t *testing.T, path, limit, id, boot string) {
	t.Helper()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketQueue).Bucket([]byte(limit))
		return b.ForEach(func(k, v []byte) error {
			var r ticketRec
			if err := decode(v, &r); err != nil || r.ID != id {
				return err
			}
			r.DeadlineBoot = boot
			return b.Put(k, encode(&r))
		})
	})
}

// Case 4 on a host-local store: a different boot id is a previous boot of
// this machine only when the store was written under it. The rows are the
// boot a ticket's deadline is on, as the store finds it after a reboot
// (the clock's boot is "b2"); the TTL is long, so only "previous boot" can
// free a slot here. (Before, every other boot id was a previous boot.)
func TestPreviousBootOnlyIfKnown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		boot   string // "" keeps the boot it was written under, b1
		legacy bool   // the store kept no list of boots (an older slotctl wrote it)
		swept  bool
	}{
		{"written under b1, a boot this store had", "", false, true},
		{"a boot never recorded (another machine's, or forged)", "vm-clone-boot", false, false},
		{"store without a list: its tickets' boots are its own", "", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, clock, path := newTestStore(t, Options{})
			clock.Set(Instant{Boot: "b1", Mono: time.Hour, Wall: time.Now()})
			r := req("a", "x", 1)
			r.TTL = 24 * time.Hour
			mustEnqueue(t, s, r)
			if tc.boot != "" {
				setDeadlineBoot(t, path, "x", "a", tc.boot)
			}
			if tc.legacy {
				rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyBoots) })
			}
			clock.Set(Instant{Boot: "b2", Mono: 5 * time.Second, Wall: time.Now().Add(time.Minute)})
			b := mustEnqueue(t, s, req("b", "x", 1))
			_, err := s.Get(ctx, "a")
			if swept := errors.Is(err, store.ErrNotFound); swept != tc.swept || (b.State == store.Held) != tc.swept {
				t.Errorf("after the reboot: a swept %v (Get: %v), b %s; want swept %v", swept, err, b.State, tc.swept)
			}
			rs, err := s.Reap(ctx, store.ReapOptions{})
			if err != nil || len(rs) != 0 {
				t.Errorf("Reap = %+v, %v; want nothing more", rs, err)
			}
			var boots []byte
			rawView(t, path, func(tx *bolt.Tx) error { boots = bytes.Clone(tx.Bucket(bucketMeta).Get(keyBoots)); return nil })
			// a's own write recorded b1 (a rewrite of its record does not).
			if want := "b1\nb2"; string(boots) != want {
				t.Errorf("recorded boots %q, want %q", boots, want)
			}
		})
	}
}

// The list of boots is bounded: the oldest are forgotten.
func TestBootsBounded(t *testing.T) {
	s, clock, path := newTestStore(t, Options{})
	for i := range maxBoots + 10 {
		clock.Set(Instant{Boot: fmt.Sprintf("boot-%d", i), Mono: time.Hour, Wall: time.Now()})
		mustEnqueue(t, s, req(fmt.Sprintf("t%d", i), "x", 1))
	}
	rawView(t, path, func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get(keyBoots)
		if n := bytes.Count(v, []byte{'\n'}) + 1; n != maxBoots {
			t.Errorf("%d boots recorded, want %d", n, maxBoots)
		}
		return nil
	})
}

// A hostile list of boots is a corrupt store, named, never a panic or an
// unbounded read.
func TestBootsHostile(t *testing.T) {
	for _, v := range [][]byte{
		bytes.Repeat([]byte("x"), maxBoots*(maxBootID+1)+1),
		[]byte("b1\n\nb2"),
		[]byte("b1\nbad id"),
		[]byte(strings.Repeat("y", maxBootID+1)),
	} {
		s, _, path := newTestStore(t, Options{})
		mustEnqueue(t, s, req("a", "x", 1))
		rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyBoots, v) })
		_, err := s.Enqueue(context.Background(), req("b", "x", 1))
		if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Errorf("Enqueue with boots %.40q: %v; want ErrCorrupt naming %s", v, err, path)
		}
	}
}
