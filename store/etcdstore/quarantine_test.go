package etcdstore_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/internal/testkit/longtest"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// revokeBehind ends ticket t's lease on the server, as a stalled leader's
// lessor does when it resumes (etcd-io/etcd#15247): the holder knows
// nothing of it. It returns once each of members (a client of one member
// each) has applied the revoke: a sweep's first read is serializable, and
// one served by a follower a moment behind would not see it yet.
func revokeBehind(t *testing.T, members []*clientv3.Client, prefix string, tk store.Ticket) {
	t.Helper()
	ctx := context.Background()
	key := prefix + "/tickets/" + tk.Limit + "/" + tk.ID
	resp, err := members[0].Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("the ticket key of %s: %v, %v", tk.ID, resp, err)
	}
	if _, err := members[0].Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	for i, m := range members {
		// Linearizable: the member answers once it has applied all that
		// was committed before the read, the revoke among it.
		if resp, err := m.Get(ctx, key, clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
			t.Fatalf("the ticket key of %s read from member %d after its revoke: %v, %v", tk.ID, i, resp, err)
		}
	}
}

func stateOf(t *testing.T, st *etcdstore.Store, id string) store.Ticket {
	t.Helper()
	got, err := st.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return got
}

// TestLeaseEndedAfterAnElectionHoldsTheSlot: a ticket whose lease the
// server ends while its holder still renews it (a resumed stale leader's
// revoke, forced here by revoking it behind the holder's back after a
// leader change) is kept under a hold, a new lease of its own, once the
// cluster has elected a leader since the lease was granted (docs/leases.md
// rule 16): the waiter behind a held one is not admitted beside the job,
// the holder's next renewal takes the hold over and the job keeps its slot
// for as long as it renews, a waiter keeps its place, and a release (or
// the hold's expiry, when nobody takes it over) hands the slot on. Without
// an election, the same revoke is an expiry and frees the slot at once
// (docs/leases.md §4.2). Without the hold, the waiter was admitted at the first sweep
// after the revoke: two jobs in one slot; without the takeover, the
// holder's renewal was a loss, and the job was stopped (exit 76) though
// its slot never left it.
func TestLeaseEndedAfterAnElectionHoldsTheSlot(t *testing.T) {
	longtest.Skip(t, "starts three-member clusters")
	c := etcdtest.StartCluster(t, 3)
	if c.WaitLeader(10*time.Second) < 0 {
		t.Fatal("no leader")
	}
	const prefix = "/quarantine"
	st, err := etcdstore.New(etcdstore.Options{Endpoints: c.Endpoints(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var members []*clientv3.Client
	for _, ep := range c.Endpoints() {
		m, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		members = append(members, m)
	}
	ctx := context.Background()
	const ttl = 3 * time.Second
	pair := func(limit string) (held, waiter store.Ticket) {
		t.Helper()
		held, err := st.Enqueue(ctx, req(limit+"-h", limit, 1, ttl))
		if err != nil || held.State != store.Held {
			t.Fatalf("enqueue the holder of %s: %+v, %v", limit, held, err)
		}
		waiter, err = st.Enqueue(ctx, req(limit+"-w", limit, 1, time.Hour))
		if err != nil || waiter.State != store.Waiting {
			t.Fatalf("enqueue the waiter of %s: %+v, %v", limit, waiter, err)
		}
		return held, waiter
	}
	// kinds lists the kinds of the events id logged in limit, oldest first.
	kinds := func(limit, id string) []string {
		t.Helper()
		evs, err := st.Events(ctx, limit, 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs {
			if e.Ticket == id {
				out = append(out, e.Kind)
				if e.Kind == store.Kept && !strings.Contains(e.Evidence, "election") {
					t.Errorf("the %s event of %s in %s says %q: want it to name the election", e.Kind, id, limit, e.Evidence)
				}
			}
		}
		return out
	}
	sweep := func(limit string) {
		t.Helper()
		if _, err := st.Reap(ctx, store.ReapOptions{Limits: []string{limit}}); err != nil {
			t.Fatalf("reap %s: %v", limit, err)
		}
	}

	// term is the cluster's raft term once every member agrees on it: a
	// member that has not heard of the leader yet (just after the cluster
	// formed) answers with an older one, and a lease it grants is recorded
	// with that term, which a hold then counts as before an election.
	term := func() uint64 {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			var terms []uint64
			for _, ep := range c.Endpoints() {
				resp, err := cli.Status(ctx, ep)
				if err != nil {
					t.Fatal(err)
				}
				terms = append(terms, resp.RaftTerm)
			}
			if terms[0] == terms[1] && terms[1] == terms[2] {
				return terms[0]
			}
		}
		t.Fatal("the members did not agree on a raft term within 10s")
		return 0
	}
	t.Run("no election: an expiry", func(t *testing.T) {
		// A loaded machine may hold an election of its own meanwhile:
		// then the hold is right, and the case is tried again.
		for try := range 3 {
			limit := fmt.Sprintf("plain%d", try)
			before := term()
			h, w := pair(limit)
			revokeBehind(t, members, prefix, h)
			sweep(limit)
			got := stateOf(t, st, w.ID)
			if got.State == store.Held {
				if k := kinds(limit, h.ID); slices.Contains(k, store.Kept) {
					t.Fatalf("the events of the holder whose lease expired: %v, want no %q", k, store.Kept)
				}
				return
			}
			if term() == before {
				t.Fatalf("the waiter after its holder's lease ended in the term it was granted in: %s, want held at once", got.State)
			}
			t.Logf("an election during try %d (term %d to %d): again", try, before, term())
		}
		t.Fatal("an election during each of 3 tries")
	})

	// Tickets granted before the election.
	h1, w1 := pair("released")
	h2, w2 := pair("expires")
	h4, w4 := pair("given")
	h5, w5 := pair("renewed")
	h6, wa := pair("place")
	h7, wc := pair("atonce")
	wb, err := st.Enqueue(ctx, req("place-w2", "place", 1, time.Hour))
	if err != nil || wb.State != store.Waiting {
		t.Fatalf("enqueue the second waiter of place: %+v, %v", wb, err)
	}
	// A ticket of two limits and weight 2, filling both, a waiter in each.
	mreq := req("multi-h", "", 2, ttl)
	mreq.Limit, mreq.Limits, mreq.Weight = "", []string{"ma", "mb"}, 2
	h3, err := st.Enqueue(ctx, mreq)
	if err != nil || h3.State != store.Held {
		t.Fatalf("enqueue the holder of ma and mb: %+v, %v", h3, err)
	}
	var w3 []store.Ticket
	for _, l := range []string{"ma", "mb"} {
		w, err := st.Enqueue(ctx, req(l+"-w", l, 2, time.Hour))
		if err != nil || w.State != store.Waiting {
			t.Fatalf("enqueue the waiter of %s: %+v, %v", l, w, err)
		}
		w3 = append(w3, w)
	}
	// Until its subtest revokes it (unkeep), each ticket is renewed as its
	// holder would, so that subtests that run for TTLs cost none of the
	// others its lease.
	var keepMu sync.Mutex
	kept := map[string]store.Ticket{}
	keep := func(ts ...store.Ticket) {
		keepMu.Lock()
		defer keepMu.Unlock()
		for _, tk := range ts {
			kept[tk.ID] = tk
		}
	}
	unkeep := func(tk store.Ticket) {
		keepMu.Lock()
		defer keepMu.Unlock()
		delete(kept, tk.ID)
	}
	keeperDone := make(chan struct{})
	keeperStopped := make(chan struct{})
	go func() {
		defer close(keeperStopped)
		for {
			select {
			case <-keeperDone:
				return
			case <-time.After(ttl / 4):
			}
			keepMu.Lock()
			ts := slices.Collect(maps.Values(kept))
			keepMu.Unlock()
			for _, tk := range ts {
				_, _ = st.Renew(ctx, tk, tk.TTL)
			}
		}
	}()
	defer func() { close(keeperDone); <-keeperStopped }()
	keep(h1, w1, h2, w2, h3, h4, w4, h5, w5, h6, wa, wb, h7, wc)
	keep(w3...)
	revoke := func(tk store.Ticket) {
		t.Helper()
		unkeep(tk)
		revokeBehind(t, members, prefix, tk)
	}

	c.MoveLeader(10 * time.Second)
	stateOf(t, st, w1.ID) // the handle hears of the new term

	// heldIn is the held tickets of limit in a snapshot.
	heldIn := func(limit string) []store.Ticket {
		t.Helper()
		snap, err := st.Snapshot(ctx, limit)
		if err != nil {
			t.Fatal(err)
		}
		var held []store.Ticket
		for _, tk := range snap.Tickets {
			if tk.State == store.Held {
				held = append(held, tk)
			}
		}
		return held
	}
	// renewFor renews tk every third of its TTL for d, sweeping limit at
	// each renewal, and fails unless each renewal finds it held.
	renewFor := func(tk store.Ticket, limit string, d time.Duration) {
		t.Helper()
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(ttl / 3) {
			got, err := st.Renew(ctx, tk, ttl)
			if err != nil || got.State != store.Held || got.Remaining <= 0 {
				t.Fatalf("renew of %s on its hold: %+v, %v, want held with time left", tk.ID, got, err)
			}
			sweep(limit)
		}
	}

	t.Run("the holder takes the hold over", func(t *testing.T) {
		revoke(h1)
		sweep("released")
		if got := stateOf(t, st, w1.ID); got.State != store.Waiting {
			t.Fatalf("the waiter beside a job whose lease ended after an election: %s, want waiting", got.State)
		}
		if held := heldIn("released"); len(held) != 1 || held[0].ID != h1.ID || held[0].Remaining <= 0 {
			t.Fatalf("held in the snapshot: %+v, want %s with its hold's time left", held, h1.ID)
		}
		// Its holder renews on: the hold is its lease now, for longer than
		// the hold alone would last.
		renewFor(h1, "released", 2*ttl)
		if got := stateOf(t, st, w1.ID); got.State != store.Waiting {
			t.Fatalf("the waiter after two TTLs of renewals of the hold: %s, want waiting", got.State)
		}
		if _, err := st.Release(ctx, h1, store.Released); err != nil {
			t.Fatal(err)
		}
		if got := stateOf(t, st, w1.ID); got.State != store.Held {
			t.Fatalf("the waiter after the holder's release: %s, want held", got.State)
		}
		if k := kinds("released", h1.ID); !slices.Equal(k, []string{"admitted", store.Kept, string(store.Released)}) {
			t.Fatalf("the events of the held ticket: %v, want admitted, kept (once), released", k)
		}
	})

	t.Run("the holder's renewal keeps it before any sweep", func(t *testing.T) {
		// Nobody settled the limit since the revoke: the renewal does.
		revoke(h5)
		renewFor(h5, "renewed", ttl)
		if got := stateOf(t, st, w5.ID); got.State != store.Waiting {
			t.Fatalf("the waiter: %s, want waiting", got.State)
		}
		if k := kinds("renewed", h5.ID); !slices.Equal(k, []string{"admitted", store.Kept}) {
			t.Fatalf("the events of the held ticket: %v, want admitted, kept", k)
		}
	})

	t.Run("a waiter keeps its place", func(t *testing.T) {
		// The first waiter's lease ends; the second, behind it, must not
		// pass it.
		revoke(wa)
		sweep("place")
		if got := stateOf(t, st, wa.ID); got.State != store.Waiting || got.Position != 1 {
			t.Fatalf("the waiter whose lease ended after an election: %s at %d, want waiting at 1", got.State, got.Position)
		}
		for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 3) {
			got, err := st.Renew(ctx, wa, ttl)
			if err != nil || got.State != store.Waiting || got.Position != 1 {
				t.Fatalf("renew of the waiter on its hold: %+v, %v, want waiting at 1", got, err)
			}
			if _, err := st.Renew(ctx, wb, time.Hour); err != nil {
				t.Fatal(err)
			}
			sweep("place")
		}
		if _, err := st.Release(ctx, h6, store.Released); err != nil {
			t.Fatal(err)
		}
		if got := stateOf(t, st, wa.ID); got.State != store.Held {
			t.Fatalf("the first waiter after the holder's release: %s, want held", got.State)
		}
		if got := stateOf(t, st, wb.ID); got.State != store.Waiting {
			t.Fatalf("the second waiter after the holder's release: %s, want waiting behind the first", got.State)
		}
		if k := kinds("place", wa.ID); !slices.Equal(k, []string{store.Kept, "admitted"}) {
			t.Fatalf("the events of the waiter: %v, want kept, admitted", k)
		}
	})

	t.Run("a waiter kept and admitted in one step", func(t *testing.T) {
		// The holder's release settles the limit: it keeps the waiter
		// whose lease ended and admits it, under its hold, at once.
		revoke(wc)
		if _, err := st.Release(ctx, h7, store.Released); err != nil {
			t.Fatal(err)
		}
		if got := stateOf(t, st, wc.ID); got.State != store.Held || got.Remaining <= 0 {
			t.Fatalf("the waiter after the release: %+v, want held with time left", got)
		}
		renewFor(wc, "atonce", ttl)
		if k := kinds("atonce", wc.ID); !slices.Equal(k, []string{store.Kept, "admitted"}) {
			t.Fatalf("the events of the waiter: %v, want kept, admitted", k)
		}
	})

	t.Run("a slot already given away", func(t *testing.T) {
		// A client without holds (an older slotctl) swept the ticket whose
		// lease ended and gave its slot to the waiter: a slot key names
		// another ticket. No hold can keep that slot; the settle sweeps
		// the ticket as expired.
		revoke(h4)
		// Its slot key went with its lease; the waiter's is put under the
		// waiter's lease, as an admission writes it.
		resp, err := cli.Get(ctx, prefix+"/tickets/given/"+w4.ID)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("the ticket key of %s: %v, %v", w4.ID, resp, err)
		}
		if _, err := cli.Put(ctx, prefix+"/slots/given/00000", w4.ID, clientv3.WithLease(clientv3.LeaseID(resp.Kvs[0].Lease))); err != nil {
			t.Fatal(err)
		}
		sweep("given")
		if k := kinds("given", h4.ID); slices.Contains(k, store.Kept) || !slices.Contains(k, string(store.Reaped)) {
			t.Fatalf("the events of a ticket whose slot was given away: %v, want it reaped, not kept", k)
		}
		if got := stateOf(t, st, w4.ID); got.State != store.Held {
			t.Fatalf("the waiter given the slot: %s, want held", got.State)
		}
	})

	t.Run("several limits and a weight", func(t *testing.T) {
		revoke(h3)
		// Its jobserver resizes before anything settled its limits: the
		// resize takes the hold over, as a renewal does, and is no loss.
		if got, err := st.Resize(ctx, h3, 2); err != nil || got.State != store.Held {
			t.Fatalf("resize of the ticket of two limits whose lease ended: %+v, %v, want held", got, err)
		}
		sweep("ma")
		sweep("mb")
		for _, w := range w3 {
			if got := stateOf(t, st, w.ID); got.State != store.Waiting {
				t.Fatalf("the waiter of %s beside a held ticket of two limits whose lease ended after an election: %s, want waiting", w.Limit, got.State)
			}
		}
		for _, l := range []string{"ma", "mb"} {
			snap, err := st.Snapshot(ctx, l)
			if err != nil {
				t.Fatal(err)
			}
			for _, tk := range snap.Tickets {
				if tk.ID == h3.ID && (tk.State != store.Held || tk.Remaining <= 0 || len(tk.Indexes[l]) != 2) {
					t.Fatalf("the ticket on its hold in %s: %+v, want held on two slots with time left", l, tk)
				}
			}
		}
		// Its holder takes the hold over, in both limits at once.
		got, err := st.Renew(ctx, h3, ttl)
		if err != nil || got.State != store.Held || len(got.Indexes["ma"]) != 2 || len(got.Indexes["mb"]) != 2 {
			t.Fatalf("renew of the ticket of two limits on its hold: %+v, %v, want held on two slots in each", got, err)
		}
		for _, l := range []string{"ma", "mb"} {
			if k := kinds(l, h3.ID); !slices.Equal(k, []string{"admitted", store.Kept}) {
				t.Fatalf("the events in %s of the ticket of two limits on its hold: %v, want admitted, kept", l, k)
			}
		}
		if _, err := st.Release(ctx, h3, store.Lost); err != nil {
			t.Fatal(err)
		}
		for _, w := range w3 {
			if got := stateOf(t, st, w.ID); got.State != store.Held {
				t.Fatalf("the waiter of %s after the release: %s, want held", w.Limit, got.State)
			}
		}
	})

	t.Run("the hold expires", func(t *testing.T) {
		revoke(h2)
		revoked := time.Now()
		sweep("expires")
		time.Sleep(ttl / 2)
		sweep("expires")
		if got := stateOf(t, st, w2.ID); got.State != store.Waiting {
			t.Fatalf("the waiter %s after the revoke: %s, want waiting (the hold lasts a TTL)", time.Since(revoked).Round(time.Millisecond), got.State)
		}
		var got store.Ticket
		for end := time.Now().Add(3 * ttl); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			sweep("expires")
			if got = stateOf(t, st, w2.ID); got.State == store.Held {
				break
			}
		}
		took := time.Since(revoked)
		if got.State != store.Held {
			t.Fatalf("the waiter %s after the revoke: %s, want held once the hold expired", took, got.State)
		}
		if took < ttl {
			t.Fatalf("the waiter was admitted %s after the revoke, want at least the TTL (%s)", took, ttl)
		}
		if k := kinds("expires", h2.ID); !slices.Equal(k, []string{"admitted", store.Kept, string(store.Reaped)}) {
			t.Fatalf("the events of the ticket whose hold expired: %v, want admitted, kept, reaped", k)
		}
		t.Logf("admitted %s after the revoke (TTL %s)", took.Round(time.Millisecond), ttl)
	})
}
