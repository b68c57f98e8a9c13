package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
	"github.com/slotctl/slotctl/store/storetest"
)

// multi is a request for a ticket of several limits and a weight.
func multi(id string, limits []string, weight, slots int) store.EnqueueRequest {
	r := req(id, "", slots, 10*time.Second)
	r.Limits, r.Weight = limits, weight
	return r
}

func mustEnqueue(t *testing.T, st store.Store, r store.EnqueueRequest, want store.State) store.Ticket {
	t.Helper()
	tk, err := st.Enqueue(context.Background(), r)
	if err != nil || tk.State != want {
		t.Fatalf("Enqueue %s on %q weight %d: %+v, %v; want %s", r.ID, r.Names(), r.Weight, tk, err, want)
	}
	return tk
}

func mustGet(t *testing.T, st store.Store, id string) store.Ticket {
	t.Helper()
	tk, err := st.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return tk
}

// A release in one limit settles, in the same transaction, every limit
// reachable from it through tickets of several limits: releasing H in a
// admits X (a, b), which lets Y (b, c) through in b, which lets Z through
// in c, though the release touched only a and nobody else writes.
func TestClosureSettleAcrossThreeLimits(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	for name, slots := range map[string]int{"a": 1, "b": 2, "c": 2} {
		if _, err := st.SetLimit(ctx, name, slots); err != nil {
			t.Fatal(err)
		}
	}
	h := mustEnqueue(t, st, multi("h", []string{"a"}, 1, 1), store.Held)
	mustEnqueue(t, st, multi("x", []string{"a", "b"}, 1, 1), store.Waiting)
	// b has room, but X waits in b ahead of Y: strict FIFO.
	y := mustEnqueue(t, st, multi("y", []string{"b", "c"}, 1, 1), store.Waiting)
	if y.Position != 2 {
		t.Fatalf("Y's position in b: %d, want 2 (behind X)", y.Position)
	}
	z := mustEnqueue(t, st, multi("z", []string{"c"}, 1, 1), store.Waiting)
	if z.Position != 2 {
		t.Fatalf("Z's position in c: %d, want 2 (behind Y)", z.Position)
	}
	if got := mustGet(t, st, "y"); got.State != store.Waiting || got.Position != 2 || got.Limit != "b" || !slices.Equal(got.Limits, []string{"b", "c"}) {
		t.Fatalf("Get Y: %+v, want waiting second under b, limits b, c", got)
	}
	if ok, err := st.Release(ctx, h, store.Released); err != nil || !ok {
		t.Fatalf("Release H: %v, %v", ok, err)
	}
	x := mustGet(t, st, "x")
	if x.State != store.Held || !slices.Equal(x.In("a"), []int{0}) || !slices.Equal(x.In("b"), []int{0}) {
		t.Fatalf("X after H's release: %+v, want held with index 0 in a and b", x)
	}
	y = mustGet(t, st, "y")
	if y.State != store.Held || !slices.Equal(y.In("b"), []int{1}) || !slices.Equal(y.In("c"), []int{0}) || y.Slot != 1 {
		t.Fatalf("Y after H's release: %+v, want held: b 1, c 0 (the closure a -> b -> c)", y)
	}
	if got := y.SlotsVar(); got != "b=1 c=0" {
		t.Fatalf("Y's SLOTCTL_SLOTS %q, want %q", got, "b=1 c=0")
	}
	z = mustGet(t, st, "z")
	if z.State != store.Held || z.Slot != 1 {
		t.Fatalf("Z after H's release: %+v, want held in slot 1 of c", z)
	}

	sn, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var under []string
	for _, tk := range sn.Tickets {
		under = append(under, fmt.Sprintf("%s/%s:%d", tk.Limit, tk.ID, tk.Slot))
	}
	if want := "a/x:0 b/x:0 b/y:1 c/y:0 c/z:1"; strings.Join(under, " ") != want {
		t.Fatalf("snapshot lists %q, want %q", strings.Join(under, " "), want)
	}
	for _, l := range sn.Limits {
		if want := map[string]int{"a": 1, "b": 2, "c": 2}[l.Name]; l.Held != want || l.Waiting != 0 {
			t.Fatalf("limit %s: %d held, %d waiting; want %d, 0", l.Name, l.Held, l.Waiting, want)
		}
	}

	// One event per limit the ticket names, each naming them all.
	evs, err := st.Events(ctx, "c", 100)
	if err != nil {
		t.Fatal(err)
	}
	var cs []string
	for _, e := range evs {
		cs = append(cs, fmt.Sprintf("%s %s %d %q", e.Kind, e.Ticket, e.Slot, e.Limits))
	}
	if want := `admitted y 0 ["b" "c"],admitted z 1 []`; strings.Join(cs, ",") != want {
		t.Fatalf("events of c: %s, want %s", strings.Join(cs, ","), want)
	}

	// One removal takes Y out of b and c at once: one tombstone, slots
	// freed in both, its keys gone from both.
	if ok, err := st.Release(ctx, y, store.Released); err != nil || !ok {
		t.Fatalf("Release Y: %v, %v", ok, err)
	}
	if ok, err := st.Release(ctx, y, store.Released); err != nil || ok {
		t.Fatalf("Release Y again: %v, %v; want false", ok, err)
	}
	if _, err := st.Get(ctx, "y"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get Y after its release: %v, want ErrNotFound", err)
	}
	w := mustEnqueue(t, st, multi("w", []string{"c", "b"}, 1, 1), store.Held)
	if !slices.Equal(w.In("c"), []int{0}) || !slices.Equal(w.In("b"), []int{1}) {
		t.Fatalf("W: %+v, want the indexes Y freed: c 0, b 1", w)
	}
}

// A heavy ticket takes Weighs slot indexes, the lowest free, and is not
// overtaken by lighter tickets behind it.
func TestWeightedHeadNotOvertaken(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	a := mustEnqueue(t, st, multi("a", []string{"l"}, 1, 3), store.Held)
	mustEnqueue(t, st, multi("b", []string{"l"}, 1, 3), store.Held)
	mustEnqueue(t, st, multi("heavy", []string{"l"}, 2, 3), store.Waiting)
	mustEnqueue(t, st, multi("light", []string{"l"}, 1, 3), store.Waiting) // one slot is free: it may not barge
	if ok, err := st.Release(ctx, a, store.Released); err != nil || !ok {
		t.Fatalf("Release A: %v, %v", ok, err)
	}
	h := mustGet(t, st, "heavy")
	if h.State != store.Held || !slices.Equal(h.In("l"), []int{0, 2}) || h.Weight != 2 {
		t.Fatalf("heavy: %+v, want held with indexes 0 and 2", h)
	}
	if l := mustGet(t, st, "light"); l.State != store.Waiting || l.Position != 1 {
		t.Fatalf("light: %+v, want waiting first", l)
	}
	sn, err := st.Snapshot(ctx, "l")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Limits[0].Held != 3 || sn.Limits[0].Waiting != 1 {
		t.Fatalf("limit l: %+v, want 3 slots held, 1 waiting", sn.Limits[0])
	}
	if _, err := st.Enqueue(ctx, multi("fat", []string{"l"}, 4, 3)); !errors.As(err, new(*store.WeightError)) {
		t.Fatalf("a weight of 4 on 3 slots: %v, want a *WeightError", err)
	}
}

// One ticket's admission or removal is one transaction, which etcd bounds
// (--max-txn-ops, 128 by default): a ticket of more keys than the bound is
// refused at Enqueue, naming its limits, its weight and the bound; the
// largest it admits, of 16 limits, is admitted, released and handed on.
func TestTicketBoundOfOneTransaction(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	var sixteen []string
	for i := range store.MaxLimits {
		sixteen = append(sixteen, fmt.Sprintf("l%02d", i))
	}
	for _, c := range []struct {
		limits []string
		weight int
	}{{sixteen, 2}, {sixteen[:1], 62}, {sixteen[:2], 30}} {
		_, err := st.Enqueue(ctx, multi("big", c.limits, c.weight, 100))
		if !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("%d limits of weight %d: %v, want ErrInvalid", len(c.limits), c.weight, err)
		}
		for _, part := range []string{c.limits[0], c.limits[len(c.limits)-1], fmt.Sprintf("weight %d", c.weight), "at most 64"} {
			if !strings.Contains(err.Error(), part) {
				t.Fatalf("%d limits of weight %d: %q does not say %q", len(c.limits), c.weight, err, part)
			}
		}
	}
	if _, err := st.Get(ctx, "big"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused ticket: %v, want ErrNotFound", err)
	}
	for _, c := range []struct {
		limits []string
		weight int
	}{{sixteen, 1}, {[]string{"one"}, 61}, {[]string{"two", "three"}, 29}} {
		slots := c.weight
		first := mustEnqueue(t, st, multi(fmt.Sprintf("first-%d", len(c.limits)), c.limits, c.weight, slots), store.Held)
		second := mustEnqueue(t, st, multi(fmt.Sprintf("second-%d", len(c.limits)), c.limits, c.weight, slots), store.Waiting)
		if ok, err := st.Release(ctx, first, store.Released); err != nil || !ok {
			t.Fatalf("Release %s: %v, %v", first.ID, ok, err)
		}
		got := mustGet(t, st, second.ID)
		if got.State != store.Held || len(got.In(c.limits[len(c.limits)-1])) != c.weight {
			t.Fatalf("%s after the release: %+v, want held with %d indexes in each limit", second.ID, got, c.weight)
		}
		if ok, err := st.Release(ctx, got, store.Released); err != nil || !ok {
			t.Fatalf("Release %s: %v, %v", got.ID, ok, err)
		}
	}
}

// raw is a plain client on the test server, for writing records as another
// release (or a hostile user) would.
func raw(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Records from the store are checked as strictly as requests: a record of
// a newer version is ErrCorrupt naming it, and a hostile one (bad names,
// counts, weights, indexes) is ErrCorrupt, never a panic.
func TestHostileRecordsAreCorrupt(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := raw(t, srv)
	ctx := context.Background()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	for i, bad := range []struct{ rec, want string }{
		{`{"v":3,"id":"t","limit":"l","state":"waiting","slot":-1}`, "version 3"},
		{`{"v":1,"id":"t","limit":"l","limits":["l","m"],"state":"waiting","slot":-1}`, "version 1"},
		{`{"v":2,"id":"t","limit":"l","limits":["l","l"],"state":"waiting","slot":-1}`, "twice"},
		{`{"v":2,"id":"t","limit":"l","limits":["m","l"],"state":"waiting","slot":-1}`, "first"},
		{`{"v":2,"id":"t","limit":"l","limits":["l","bad name"],"state":"waiting","slot":-1}`, "bad name"},
		{`{"v":2,"id":"t","limit":"l","weight":-2,"state":"waiting","slot":-1}`, "weight -2"},
		{`{"v":2,"id":"t","limit":"l","weight":70000,"state":"waiting","slot":-1}`, "weight 70000"},
		{`{"v":2,"id":"t","limit":"l","weight":2,"state":"held","slot":0}`, "without its indexes"},
		{`{"v":2,"id":"t","limit":"l","weight":2,"state":"held","slot":0,"indexes":{"l":[0]}}`, "1 indexes"},
		{`{"v":2,"id":"t","limit":"l","weight":2,"state":"held","slot":1,"indexes":{"l":[1,1]}}`, "ascending"},
		{`{"v":2,"id":"t","limit":"l","weight":2,"state":"held","slot":0,"indexes":{"l":[0,-1]}}`, "ascending"},
		{`{"v":2,"id":"t","limit":"l","weight":2,"state":"held","slot":0,"indexes":{"m":[0,1]}}`, "0 indexes"},
		{`{"v":2,"id":"t","limit":"l","weight":2,"state":"held","slot":3,"indexes":{"l":[0,1]}}`, "lowest"},
		{`{"v":2,"id":"t","limit":"l","state":"held","slot":70000}`, "slot 70000"},
		{`{"v":2,"id":"t","limit":"l","state":"gone","slot":-1}`, "state"},
		{`{"v":2,"id":"u","limit":"l","state":"waiting","slot":-1}`, "id"},
		{`{"v":2,"id":"t","limit":"m","state":"waiting","slot":-1}`, "does not name"},
		{`{"v":2,"id":"t","limit":"l","limits":["l","m"],"state":"waiting","slot":-1}`, "recorded under 1"},
		{`{"v":2,"id":"t","limit":"l","limits":["l","a","b","c","d","e","f","g","h","i","j","k","m","n","o","p","q"],"state":"waiting","slot":-1}`, "17 limits"},
		{`{"v":2,"id":"t","limit":"l","weight":62,"state":"waiting","slot":-1}`, "more than one transaction"},
		{`[1,2]`, "ticket record"},
		// The fields of newer runs first: a key, the job's URL, a stop request, the tickets it replaces.
		{`{"v":1,"id":"t","limit":"l","state":"waiting","slot":-1,"key":"main"}`, "version 1"},
		{`{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"key":"a\u0007b"}`, "key"},
		{`{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"key":"` + strings.Repeat("k", store.MaxKey+1) + `"}`, "key"},
		{`{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"holder":{"host":"h","pid":1,"url":"https://x/\u001b[2J"}}`, "url"},
		{`{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"holder":{"host":"h","pid":1,"url":"` + strings.Repeat("u", store.MaxURL+1) + `"}}`, "url"},
		{`{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"stop":{"ticket":"n"}}`, "stop request on a waiting"},
		{`{"v":2,"id":"t","limit":"l","state":"held","slot":0,"stop":{"ticket":"../n"}}`, "ticket id"},
		{`{"v":2,"id":"t","limit":"l","state":"held","slot":0,"stop":{"ticket":"n","host":"h\u202e"}}`, "host"},
		{`{"v":2,"id":"t","limit":"l","state":"held","slot":0,"stop":{"ticket":"n","pid":-3}}`, "pid -3"},
		{`{"v":2,"id":"t","limit":"l","state":"held","slot":0,"stop":{"ticket":"n","url":"\u0000"}}`, "url"},
		{`{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"replaces":["a","b/c"]}`, "replaces"},
		{`{"v":1,"id":"t","limit":"l","state":"waiting","slot":-1,"superseding":true}`, "version 1"},
		{`{"v":2,"id":"t","limit":"l","state":"waiting","slot":-1,"replaces":["` + strings.Repeat(`a","`, 256) + `a"]}`, "replaces 257"},
	} {
		prefix := fmt.Sprintf("/hostile/%d", i)
		if _, err := c.Put(ctx, prefix+"/limits/l", `{"v":1,"slots":100,"created":"`+now+`"}`); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Put(ctx, prefix+"/records/l/t", bad.rec); err != nil {
			t.Fatal(err)
		}
		st := open(t, srv, etcdstore.Options{Prefix: prefix})
		_, err := st.Snapshot(ctx)
		_, err2 := st.Enqueue(ctx, multi("new", []string{"l"}, 1, 100))
		_, err3 := st.SetLimit(ctx, "l", 5)
		for _, err := range []error{err, err2, err3} {
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("record %s: %v; want ErrCorrupt saying %q", bad.rec, err, bad.want)
			}
		}
	}
	// The other keys a step reads: a limit, a slot key, an id key.
	for i, bad := range []struct{ key, val, want string }{
		{"/limits/l", `{"v":2,"slots":70000}`, "slot count 70000"},
		{"/limits/l", `{"v":9,"slots":1}`, "version 9"},
		{"/slots/l/99999", "t", "slot key"},
		{"/slots/l/x", "t", "slot key"},
		{"/ids/new", `{"v":2,"limit":"bad name"}`, "bad name"},
		{"/ids/new", `{"v":2,"limit":"l","limits":["m","l"]}`, "first"},
		{"/ids/new", `{"v":3,"limit":"l"}`, "version 3"},
		{"/ids/new", `{"v":2,"limit":"l","removed":"superseded","by":{"ticket":"a/b"}}`, "successor"},
		{"/ids/new", `{"v":2,"limit":"l","removed":"superseded","by":{"ticket":"n","host":"\u001b]0;x\u0007"}}`, "successor"},
		{"/ids/new", `{"v":2,"limit":"l","removed":"superseded","by":{"ticket":"n","url":"` + strings.Repeat("u", store.MaxURL+1) + `"}}`, "successor"},
		{"/ids/new", `{"v":2,"limit":"l","removed":"released","by":{"ticket":"n"}}`, "not superseded"},
	} {
		prefix := fmt.Sprintf("/hostile-keys/%d", i)
		if _, err := c.Put(ctx, prefix+"/limits/l", `{"v":1,"slots":3,"created":"`+now+`"}`); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Put(ctx, prefix+bad.key, bad.val); err != nil {
			t.Fatal(err)
		}
		st := open(t, srv, etcdstore.Options{Prefix: prefix})
		_, err := st.Enqueue(ctx, multi("new", []string{"l"}, 1, 3))
		if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s = %s: Enqueue: %v; want ErrCorrupt saying %q", bad.key, bad.val, err, bad.want)
		}
	}
}

// A store written by the previous release (version 1 records) opens and
// works: its tickets are of one limit and weight 1, a release hands the
// slot on, and a ticket of several limits joins its queue.
func TestLegacyRecordsWork(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	writeLegacy(t, srv, st, 10*time.Second)
	ctx := context.Background()
	sn, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tk := range sn.Tickets {
		got = append(got, fmt.Sprintf("%s:%s:%d:%d", tk.ID, tk.State, tk.Slot, tk.Weighs()))
	}
	if want := "legacy-a:held:0:1 legacy-b:held:1:1 legacy-c:waiting:-1:1"; strings.Join(got, " ") != want {
		t.Fatalf("legacy snapshot %q, want %q", strings.Join(got, " "), want)
	}
	mustEnqueue(t, st, multi("new", []string{"other", storetest.LegacyLimit}, 1, 1), store.Waiting)
	a := mustGet(t, st, "legacy-a")
	if ok, err := st.Release(ctx, a, store.Released); err != nil || !ok {
		t.Fatalf("Release legacy-a: %v, %v", ok, err)
	}
	if c := mustGet(t, st, "legacy-c"); c.State != store.Held || c.Slot != 0 || c.Limits != nil || c.Weight != 0 {
		t.Fatalf("legacy-c: %+v, want held in slot 0, one limit, weight 1", c)
	}
	b := mustGet(t, st, "legacy-b")
	if ok, err := st.Release(ctx, b, store.Released); err != nil || !ok {
		t.Fatalf("Release legacy-b: %v, %v", ok, err)
	}
	if n := mustGet(t, st, "new"); n.State != store.Held || !slices.Equal(n.In(storetest.LegacyLimit), []int{1}) || !slices.Equal(n.In("other"), []int{0}) {
		t.Fatalf("new: %+v, want held: other 0, legacy 1", n)
	}
}

// A waiter of several limits is woken when it is admitted to all of them:
// blocked in b by a holder whose lease expires (no client writes), its
// bell outlasts that holder in b, settles, and rings held.
func TestBellOfSeveralLimitsOutlastsEach(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	st := open(t, srv, etcdstore.Options{})
	mustEnqueue(t, st, multi("ha", []string{"a"}, 1, 2), store.Held)
	hb := req("hb", "b", 1, 2*time.Second)
	mustEnqueue(t, st, hb, store.Held)
	bell, err := st.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	mustEnqueue(t, st, multi("w", []string{"a", "b"}, 1, 2), store.Waiting)
	start := time.Now()
	for {
		select {
		case <-bell.C():
		case <-time.After(6 * time.Second):
			t.Fatalf("no ring %s after hb's 2s lease was due", time.Since(start))
		}
		if got := mustGet(t, st, "w"); got.State == store.Held {
			if !slices.Equal(got.In("a"), []int{1}) || !slices.Equal(got.In("b"), []int{0}) {
				t.Fatalf("w: %+v, want a 1, b 0", got)
			}
			break
		}
	}
	if el := time.Since(start); el > 4*time.Second {
		t.Errorf("admitted after %s, want about hb's TTL (2s)", el)
	}
}

// Many holders of several limits and weights on several handles at once:
// every consistent read shows each limit within its size counting weights,
// no slot index held twice, and a ticket held in all of its limits or in
// none; every ticket is admitted in the end.
func TestConcurrentSeveralLimits(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	sizes := map[string]int{"p": 2, "q": 3, "r": 2}
	var handles []*etcdstore.Store
	for range 3 {
		handles = append(handles, open(t, srv, etcdstore.Options{Prefix: "/concurrent"}))
	}
	for n, size := range sizes {
		if _, err := handles[0].SetLimit(ctx, n, size); err != nil {
			t.Fatal(err)
		}
	}
	sets := [][]string{{"p"}, {"p", "q"}, {"q", "r"}, {"r", "p", "q"}, {"q"}, {"r", "q"}}
	done := make(chan struct{})
	checked := make(chan int)
	go func() {
		n := 0
		defer func() { checked <- n }()
		for {
			select {
			case <-done:
				return
			default:
			}
			sn, err := handles[0].Snapshot(ctx)
			if err != nil {
				t.Errorf("Snapshot: %v", err)
				return
			}
			n++
			held := map[string]int{}
			used := map[string]bool{}
			for _, tk := range sn.Tickets {
				if tk.State != store.Held {
					continue
				}
				held[tk.Limit] += tk.Weighs()
				for _, i := range tk.In(tk.Limit) {
					k := fmt.Sprintf("%s/%d", tk.Limit, i)
					if used[k] {
						t.Errorf("slot %s held twice (%s)", k, tk.ID)
					}
					used[k] = true
				}
				for _, name := range tk.Names() {
					if len(tk.In(name)) != tk.Weighs() {
						t.Errorf("%s held with %v in %s, weight %d", tk.ID, tk.In(name), name, tk.Weighs())
					}
				}
			}
			for name, h := range held {
				if h > sizes[name] {
					t.Errorf("limit %s: %d slots held of %d", name, h, sizes[name])
				}
			}
		}
	}()
	errs := make(chan error, 12)
	for w := range 12 {
		go func() {
			st := handles[w%len(handles)]
			for i := range 4 {
				id := fmt.Sprintf("w%d-%d", w, i)
				r := multi(id, sets[(w+i)%len(sets)], 1+(w+i)%2, 2)
				bell, err := st.Watch(ctx, id)
				if err != nil {
					errs <- err
					return
				}
				tk, err := st.Enqueue(ctx, r)
				for err == nil && tk.State != store.Held {
					select {
					case <-bell.C():
					case <-time.After(3 * time.Second):
					}
					tk, err = st.Get(ctx, id)
				}
				bell.Close()
				if err != nil {
					errs <- fmt.Errorf("%s: %w", id, err)
					return
				}
				time.Sleep(time.Duration(w%3) * 5 * time.Millisecond)
				if ok, err := st.Release(ctx, tk, store.Released); err != nil || !ok {
					errs <- fmt.Errorf("release %s: %v, %v", id, ok, err)
					return
				}
			}
			errs <- nil
		}()
	}
	deadline := time.After(60 * time.Second)
	for range 12 {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-deadline:
			t.Fatal("the workers did not finish within 60s: a ticket was never admitted")
		}
	}
	close(done)
	if n := <-checked; n == 0 {
		t.Fatal("no snapshot was checked")
	}
	sn, err := handles[0].Snapshot(ctx)
	if err != nil || len(sn.Tickets) != 0 {
		t.Fatalf("after every release: %+v, %v; want no tickets", sn.Tickets, err)
	}
}

// The handoff of a ticket of several limits is one commit and one watch
// event too: its bell, outlasting a holder in its second limit, sees its
// promotion in that limit's keys (a release rewrites its keys in every
// limit in one revision), and its Get answers from it: the waiter's handle
// makes no request between the release and its Get's answer.
func TestPromotionInAnotherLimitAnswersGet(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx := context.Background()
	holders := open(t, srv, etcdstore.Options{Prefix: "/handoff2"})
	count, calls := countCalls()
	waiter := open(t, srv, etcdstore.Options{Prefix: "/handoff2", DialOptions: []grpc.DialOption{count}})
	for round := range 5 {
		full := fmt.Sprintf("full%d", round)
		h := mustEnqueue(t, holders, req("h-"+full, full, 1, 10*time.Second), store.Held)
		id := fmt.Sprintf("w%d", round)
		bell, err := waiter.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer bell.Close()
		mustEnqueue(t, waiter, multi(id, []string{"free", full}, 1, 1), store.Waiting)
		settle(bell)
		before := calls.Load()
		if _, err := holders.Release(ctx, h, store.Released); err != nil {
			t.Fatal(err)
		}
		if !rings(bell) {
			t.Fatalf("%s: the promoted waiter's bell did not ring", id)
		}
		got, err := waiter.Get(ctx, id)
		if err != nil || got.State != store.Held || !slices.Equal(got.In(full), []int{0}) {
			t.Fatalf("%s: Get after the ring: %+v, %v; want held", id, got, err)
		}
		if n := calls.Load() - before; n != 0 {
			t.Errorf("%s: %d requests between the release and the Get's answer; want none (the watch event showed the promotion)", id, n)
		}
		if ok, err := holders.Release(ctx, got, store.Released); !ok || err != nil {
			t.Fatalf("%s: release: %v, %v", id, ok, err)
		}
	}
}

// A closure longer than one transaction reads (30 limits, chained by
// tickets of two) and a settle longer than one commits (29 admissions):
// one release admits them all, a prefix per transaction, in fence order.
func TestLongClosure(t *testing.T) {
	parallel(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, srv, etcdstore.Options{})
	ctx := context.Background()
	const n = 30
	name := func(i int) string { return fmt.Sprintf("c%02d", i) }
	// Nobody renews: the leases outlast the 31 steps however slow the
	// machine, as a lease is not what this test is about.
	long := func(r store.EnqueueRequest) store.EnqueueRequest {
		r.TTL = 10 * time.Minute
		return r
	}
	h := mustEnqueue(t, st, long(multi("h", []string{name(n - 1)}, 2, 2)), store.Held)
	for i := n - 2; i >= 0; i-- {
		// Each waits behind the one before it in c(i+1).
		mustEnqueue(t, st, long(multi(fmt.Sprintf("t%02d", i), []string{name(i), name(i + 1)}, 1, 2)), store.Waiting)
	}
	if ok, err := st.Release(ctx, h, store.Released); err != nil || !ok {
		t.Fatalf("Release H: %v, %v", ok, err)
	}
	for i := n - 2; i >= 0; i-- {
		tk := mustGet(t, st, fmt.Sprintf("t%02d", i))
		wantHigh := 1
		if i == n-2 {
			wantHigh = 0 // H's slots were both free
		}
		if tk.State != store.Held || !slices.Equal(tk.In(name(i)), []int{0}) || !slices.Equal(tk.In(name(i+1)), []int{wantHigh}) {
			t.Fatalf("t%02d after H's release: %+v, want held: %s 0, %s %d", i, tk, name(i), name(i+1), wantHigh)
		}
	}
}
