package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// countsOf reads one limit's counts.
func countsOf(t *testing.T, st *etcdstore.Store, limit string) store.Counts {
	t.Helper()
	cs, err := st.Counts(context.Background(), limit)
	if err != nil || len(cs) != 1 {
		t.Fatalf("Counts(%s): %v, %v", limit, cs, err)
	}
	return cs[0]
}

// deltaKeys counts the delta keys of a limit's counts (countsrec.go).
func deltaKeys(t *testing.T, c *clientv3.Client, prefix, limit string) int64 {
	t.Helper()
	resp, err := c.Get(context.Background(), prefix+"/countd/"+limit+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// TestLightStepsCounted: a waiter behind another waiter leaves in a step
// that reads no limit (light.go); its event is counted all the same, in a
// delta key, which the next plan of the limit folds into the counts key
// once, and many such leaves at once are each counted (no lost update, and
// no conflicts between them).
func TestLightStepsCounted(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	prefix := "/" + t.Name()
	st := open(t, srv, etcdstore.Options{Prefix: prefix})
	c := raw(t, srv)
	holder, err := st.Enqueue(ctx, req("h", "lc", 1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]store.Ticket{}
	for _, id := range []string{"w1", "w2", "w3"} {
		if ts[id], err = st.Enqueue(ctx, req(id, "lc", 1, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := st.Cancel(ctx, ts["w2"]); err != nil || !ok {
		t.Fatalf("Cancel(w2): %v, %v", ok, err)
	}
	if ok, err := st.Release(ctx, ts["w3"], store.Busy); err != nil || !ok {
		t.Fatalf("Release(w3, busy): %v, %v", ok, err)
	}
	if n := deltaKeys(t, c, prefix, "lc"); n != 2 {
		t.Fatalf("%d delta keys after two leaves behind a waiter, want 2 (the light path was not taken)", n)
	}
	if got := countsOf(t, st, "lc"); got.Cancelled != 1 || got.Busy != 1 || got.Admitted != 1 {
		t.Fatalf("counts after the light leaves: %+v, want 1 admitted, 1 cancelled, 1 busy", got)
	}
	if _, err := st.Release(ctx, holder, store.Released); err != nil {
		t.Fatal(err)
	}
	if n := deltaKeys(t, c, prefix, "lc"); n != 0 {
		t.Errorf("%d delta keys after the release's plan, want 0 (folded)", n)
	}
	got := countsOf(t, st, "lc")
	if got.Cancelled != 1 || got.Busy != 1 || got.Admitted != 2 || got.Released != 1 || got.Hold.Count != 1 {
		t.Errorf("counts after the fold: %+v, want 2 admitted, 1 released, 1 cancelled, 1 busy, one hold", got)
	}

	// Many at once, each from its own handle (its own slotctl).
	const n = 40
	ws := make([]store.Ticket, n)
	hs := make([]*etcdstore.Store, n)
	for i := range ws {
		hs[i] = open(t, srv, etcdstore.Options{Prefix: prefix})
		if ws[i], err = hs[i].Enqueue(ctx, req(fmt.Sprintf("m%02d", i), "lc", 1, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := 1; i < n; i++ { // behind m00, the head (w1 holds): light leaves
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, err := hs[i].Cancel(ctx, ws[i]); err != nil || !ok {
				t.Errorf("Cancel(m%02d): %v, %v", i, ok, err)
			}
		}()
	}
	wg.Wait()
	if got2 := countsOf(t, st, "lc"); got2.Cancelled != got.Cancelled+n-1 {
		t.Errorf("%d cancelled after %d more cancels at once, want %d", got2.Cancelled, n-1, got.Cancelled+n-1)
	}
}

// TestHostileDeltaIsCorrupt: a delta key that a light step could not have
// written is ErrCorrupt (exit 69) for Counts and for the plans that fold it.
func TestHostileDeltaIsCorrupt(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	prefix := "/" + t.Name()
	st := open(t, srv, etcdstore.Options{Prefix: prefix})
	c := raw(t, srv)
	if _, err := st.Enqueue(ctx, req("h", "hd", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{`{"v":2,"kind":"admitted"}`, `{"v":2,"kind":"cancelled","held":-1}`, `not json`} {
		if _, err := c.Put(ctx, prefix+"/countd/hd/x.cancelled", v); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Counts(ctx, "hd"); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("Counts with delta %s: %v, want ErrCorrupt", v, err)
		}
		if _, err := st.Enqueue(ctx, req("w"+strconv.Itoa(len(v)), "hd", 1, time.Minute)); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("Enqueue with delta %s: %v, want ErrCorrupt", v, err)
		}
	}
}
