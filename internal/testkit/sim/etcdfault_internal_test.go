package sim

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store/etcdstore/etcdtest"
)

// TestRevokedWhileTheReapRan: L1 holds an etcd reap only to the leases the
// server had ended when the reap read. A ticket key still there at the
// revision read just before the reap may have gone while it ran, after
// its read, and is excused; one gone by then is not, nor one whose reap's
// revision is unknown.
func TestRevokedWhileTheReapRan(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	nb := NewEtcd(srv.Endpoint)
	be, err := nb(t.TempDir(), Judges{}, mutation.Set{})
	if err != nil {
		t.Fatal(err)
	}
	e := be.(*Etcd)
	defer e.Close()
	s := &sim{be: e, ctx: context.Background()}
	s.m = newModel(s)

	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := c.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	tk := &mTicket{id: "a9ffa4000000", limits: []string{"L3", "L1"}}
	if _, err := c.Put(ctx, e.opts.Prefix+"/tickets/L3/"+tk.id, "", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	now := e.Now()
	if !s.notYetRevoked(tk, now, 0) {
		t.Fatal("a key still there after the reap is not excused")
	}
	before := e.revision(ctx)
	if before == 0 {
		t.Fatal("no revision read")
	}
	if _, err := c.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	after := e.revision(ctx)
	switch {
	case !s.notYetRevoked(tk, now, before):
		t.Error("a key there just before the reap, revoked since, is not excused")
	case s.notYetRevoked(tk, now, after):
		t.Error("a key revoked before the reap is excused")
	case s.notYetRevoked(tk, now, 0):
		t.Error("a key revoked, with the reap's revision unknown, is excused")
	}
	if got := s.stats.RevokedLate; got != 2 {
		t.Errorf("RevokedLate %d, want 2", got)
	}
}
