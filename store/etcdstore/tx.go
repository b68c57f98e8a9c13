package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// The rules of admission (store/policy) run on etcd as steps of an etx: it
// reads limits lazily, as the rules ask for them, all at the revision of
// its first read, and keeps the rules' writes; commit turns those into one
// transaction with the compares they rest on, and a conflict runs the step
// again on a new read (etcd's concurrency.NewSTM, with compares narrower
// than "everything read"):
//
//   - a ticket rewritten or removed: its ticket key (or, expired, its
//     record) as read;
//   - an admission or a growth: its limits' sizes, their slot keys (no
//     slot was taken since) and, in a limit ordered by policy, that no
//     ticket joined it since;
//   - a new ticket: its id key absent, and no ticket joined its limits since
//     (its place, a supersede of every older ticket of its key and a
//     max-waiting count all rest on the queues read);
//   - a limit written or removed: its key as read; a tombstone of an id
//     read absent: still absent.
//
// Deadlines are not stored: etcd's server expires leases. A record read
// with its ticket key is live, its deadline now plus what this handle knows
// of its lease (else its TTL); one without it is expired (Expired), unless
// a hold keeps it (quarantine.go). A Put that renews (Renewed set) keeps
// the lease alive before the commit.

// etcdBoot names the clock of an etcd step: the planning client's boot-time
// clock, which only measures what remains of leases read in that step.
const etcdBoot = "etcd"

// freshFence stands in for the fence of the ticket a step creates: the
// create revision of its keys, known once the step commits. Above every
// revision, it comes last in fence order, as the new ticket does.
const freshFence = uint64(math.MaxInt64)

// maxTxnOps is etcd's default bound on one transaction's compares, and on
// its operations (--max-txn-ops).
const maxTxnOps = 128

// backend is the store's policy.Backend.
type backend struct{ s *Store }

var _ policy.Backend = backend{}

func (b backend) String() string { return b.s.String() }
func (b backend) Close() error   { return nil } // the Store closes its client

func (b backend) Watch(ctx context.Context, id string) (store.Bell, error) { return b.s.Watch(ctx, id) }

// Update runs fn as one step, again on a conflict.
func (b backend) Update(ctx context.Context, fn func(policy.Tx) error) error {
	if b.s.closed.Load() {
		return b.s.errClosed()
	}
	g := &freshLease{}
	sd, _ := ctx.Value(seedKey{}).(*seed)
	if sd != nil {
		g = sd.g
	}
	defer g.release(ctx, b.s)
	var r retrier
	start := time.Now()
	for {
		t := b.s.newTx(ctx, g, true)
		if sd != nil && !sd.used {
			sd.used = true
			t.seed(sd)
		}
		err := fn(t)
		if err == nil {
			err = t.commit()
		}
		if t.unanswered && !t.sent && b.retry(ctx, start, err) {
			// No answer before the step's transaction was sent (a read, a
			// lease's grant, the day lease's): nothing of it was
			// written, so it runs again, on another member if need be.
			continue
		}
		if !errors.Is(err, errRetry) {
			return err
		}
		if err := r.next(ctx); err != nil {
			return err
		}
	}
}

// retry reports whether a step that got no answer runs again: the store
// has answered before (an election, a member gone: another answers), and
// the request's time lasts. A store that never answered fails at once.
func (b backend) retry(ctx context.Context, start time.Time, err error) bool {
	return unknownOutcome(err) && b.s.connected.Load() && b.s.again(ctx, start)
}

// Again implements policy.Againer: a step whose answer was lost runs
// again while the request's time lasts (an election takes a second or two).
func (b backend) Again(ctx context.Context, start time.Time, _ int) bool {
	return b.s.again(ctx, start)
}

// View runs fn on one revision.
func (b backend) View(ctx context.Context, fn func(policy.Tx) error) error {
	if b.s.closed.Load() {
		return b.s.errClosed()
	}
	var r retrier
	start := time.Now()
	for {
		t := b.s.newTx(ctx, nil, false)
		err := fn(t)
		if t.unanswered && b.retry(ctx, start, err) {
			continue
		}
		if !errors.Is(err, errRetry) {
			return err
		}
		if err := r.next(ctx); err != nil {
			return err
		}
	}
}

// revokeWait marks the context of an operator's command (limit rm, reap):
// its steps return once the leases of the tickets they removed are
// revoked, not only their keys gone.
type revokeWait struct{}

func withRevokeWait(ctx context.Context) context.Context {
	return context.WithValue(ctx, revokeWait{}, true)
}

// freshLease is the lease of the ticket an Update creates: granted once,
// kept across its conflicts, revoked unless a step committed it.
type freshLease struct {
	lease int64
	term  uint64
	sent  time.Duration // when the grant was sent (leaseClock.now)
	used  bool          // committed, or perhaps (an answer lost): never revoked
}

func (g *freshLease) get(ctx context.Context, s *Store, ttl time.Duration) (int64, uint64, error) {
	if g.lease != 0 {
		return g.lease, g.term, nil
	}
	sent := s.leases.now()
	known := s.term.Load() // at most the term the grant commits in
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Grant(cctx, leaseTTL(ttl))
	if err != nil {
		return 0, 0, s.unavailable(err, false)
	}
	s.answered()
	g.lease, g.term, g.sent = int64(resp.ID), grantTerm(known, resp.ResponseHeader), sent
	s.leases.acked(g.lease, sent, time.Duration(resp.TTL)*time.Second)
	return g.lease, g.term, nil
}

func (g *freshLease) release(ctx context.Context, s *Store) {
	if g.lease == 0 || g.used {
		return
	}
	s.leases.forget(g.lease)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = s.c.Revoke(rctx, clientv3.LeaseID(g.lease))
	g.lease = 0
}

// seed is a state read before the step (Enqueue's first read, beside its
// lease grant) and that lease: the first step of an Update starts from
// them, with no read of its own.
type seed struct {
	st   *lstate // nil: none
	id   string  // the id whose key st read
	g    *freshLease
	used bool
}

type seedKey struct{}

func withSeed(ctx context.Context, st *lstate, id string, g *freshLease) context.Context {
	return context.WithValue(ctx, seedKey{}, &seed{st: st, id: id, g: g})
}

// etx is one step.
type etx struct {
	s     *Store
	ctx   context.Context
	g     *freshLease // nil in a View
	now   policy.Instant
	st    *lstate // the limits read, at st.rev; nil before the first read
	p     *plan   // the holds the step's reads keep (quarantine.go), then its writes
	ids   map[string]*mvccpb.KeyValue
	names []string // every limit's name, once read (namesRead)

	namesRead bool
	limW      map[string]*policy.LimitRec // limits written; nil: removed
	recW      map[string]*policy.Rec      // tickets written; nil: removed
	order     []string                    // the ids of recW, in the order written
	fresh     string                      // the id of the ticket the step creates
	tombs     map[string]policy.Tomb
	events    []store.Event
	counts    map[string]store.Counts
	rings     []string
	unlogged  []string // event keys the step creates, which must still be absent
	rev       int64    // the revision the step committed at
	// sent: the step's transaction was sent (its answer may be lost);
	// unanswered: a request before it got no answer (nothing was written)
	sent, unanswered bool
	rewrote          map[string]bool // the tickets whose keys the commit writes again
	looked           map[string]bool // the tickets the step looked up by id (its caller's own)
}

var (
	_ policy.Tx        = (*etx)(nil)
	_ policy.Expirer   = (*etx)(nil)
	_ policy.LateFence = (*etx)(nil)
)

func (s *Store) newTx(ctx context.Context, g *freshLease, write bool) *etx {
	return &etx{s: s, ctx: ctx, g: g, now: policy.Instant{Boot: etcdBoot, Mono: proc.Boottime(), Wall: time.Now()},
		ids: map[string]*mvccpb.KeyValue{}, looked: map[string]bool{}, limW: map[string]*policy.LimitRec{}, recW: map[string]*policy.Rec{},
		tombs: map[string]policy.Tomb{}, counts: map[string]store.Counts{}}
}

// seed starts the step from sd's state.
func (t *etx) seed(sd *seed) {
	if sd.st == nil {
		return
	}
	t.st = sd.st
	t.p = t.s.newPlan(t.st)
	t.p.now = t.now.Wall
	t.ids[sd.id] = sd.st.idKV
}

func (t *etx) Now() policy.Instant      { return t.now }
func (t *etx) PreviousBoot(string) bool { return false }

// Fence implements policy.LateFence: the fence of the ticket the step
// created, once it committed.
func (t *etx) Fence(f uint64) uint64 {
	if f == freshFence && t.rev != 0 {
		return uint64(t.rev)
	}
	return f
}

// compacted reports whether a read at a revision failed because the server
// compacted it: the step runs again, at a new one.
func compacted(err error) bool {
	return grpcCode(err) == codes.OutOfRange || strings.Contains(err.Error(), "compacted")
}

// at is the option that reads at the step's revision, once it has one.
func (t *etx) at() []clientv3.OpOption {
	if t.st == nil {
		return nil
	}
	return []clientv3.OpOption{clientv3.WithRev(t.st.rev)}
}

// read runs ops at the step's revision, which the first read sets.
func (t *etx) read(ops ...clientv3.Op) ([]*clientv3.GetResponse, error) {
	// The first read also reads the day lease's key, if the handle has
	// none yet: a step that logs takes that lease over instead of
	// granting one of its own and asking whether the key is there.
	day := t.st == nil && t.s.dayKnown() == 0
	if day {
		ops = append(slices.Clip(ops), clientv3.OpGet(t.s.k.dayLease()))
	}
	cctx, cancel := t.s.ctx(t.ctx)
	defer cancel()
	resp, err := t.s.c.Txn(cctx).Then(ops...).Commit()
	if err != nil {
		if t.st != nil && compacted(err) {
			return nil, errRetry
		}
		t.unanswered = true
		return nil, t.s.unavailable(err, false)
	}
	t.s.answered()
	rs := getResponses(resp.Responses)
	if t.st == nil {
		t.st = newState(nil, resp.Header.Revision)
		t.p = t.s.newPlan(t.st)
		t.p.now = t.now.Wall
	}
	if day {
		if kvs := rs[len(rs)-1].Kvs; len(kvs) > 0 {
			t.st.dayKV = kvs[0]
		}
		rs = rs[:len(rs)-1]
	}
	return rs, nil
}

// load reads the limits of names not read yet.
func (t *etx) load(names ...string) error {
	var miss []string
	for _, n := range names {
		if (t.st == nil || t.st.lims[n] == nil) && !slices.Contains(miss, n) {
			miss = append(miss, n)
		}
	}
	for len(miss) > 0 {
		chunk := miss[:min(len(miss), maxPlanOps/opsPerLimit)]
		rev := int64(0)
		if t.st != nil {
			rev = t.st.rev
		}
		rs, err := t.read(t.s.limitOps(chunk, rev, false)...)
		if err != nil {
			return err
		}
		if err := t.s.addLimits(t.st, chunk, rs); err != nil {
			return err
		}
		t.st.sort()
		miss = miss[len(chunk):]
	}
	return t.checkRecorded()
}

// checkRecorded refuses a ticket read under every limit it names but
// recorded under fewer (its keys are written under all of them at once).
func (t *etx) checkRecorded() error {
	for _, e := range t.st.entries {
		names := e.r.names()
		if !slices.ContainsFunc(names, func(n string) bool { return t.st.lims[n] == nil }) && (e.at != e.r.Limit || e.seen != len(names)) {
			return fmt.Errorf("%w: ticket %s names limits %s but is recorded under %d of them", store.ErrCorrupt, e.r.ID, strings.Join(names, ", "), e.seen)
		}
	}
	return nil
}

// idKV is P/ids/<id> at the step's revision (nil: absent).
func (t *etx) idKV(id string) (*mvccpb.KeyValue, error) {
	if kv, ok := t.ids[id]; ok {
		return kv, nil
	}
	ops := []clientv3.Op{clientv3.OpGet(t.s.k.id(id), t.at()...)}
	var names []string
	if t.st == nil {
		// A ticket this handle knows: its limits in the same round trip.
		t.s.mu.Lock()
		k, ok := t.s.known[id]
		t.s.mu.Unlock()
		if ok {
			names = k.r.names()
			ops = append(ops, t.s.limitOps(names, 0, false)...)
		}
	}
	rs, err := t.read(ops...)
	if err != nil {
		return nil, err
	}
	if len(names) > 0 {
		if err := t.s.addLimits(t.st, names, rs[1:]); err != nil {
			return nil, err
		}
		t.st.sort()
	}
	var kv *mvccpb.KeyValue
	if len(rs[0].Kvs) > 0 {
		kv = rs[0].Kvs[0]
	}
	t.ids[id] = kv
	return kv, nil
}

// LimitNames implements policy.Tx.
func (t *etx) LimitNames() ([]string, error) {
	if !t.namesRead {
		rs, err := t.read(clientv3.OpGet(t.s.k.limits(), append(t.at(), clientv3.WithPrefix(), clientv3.WithKeysOnly())...))
		if err != nil {
			return nil, err
		}
		for _, kv := range rs[0].Kvs {
			n := strings.TrimPrefix(string(kv.Key), t.s.k.limits())
			if !store.ValidLimitName(n) {
				return nil, fmt.Errorf("%w: limit key %s", store.ErrCorrupt, kv.Key)
			}
			t.names = append(t.names, n)
		}
		t.namesRead = true
	}
	out := slices.Clone(t.names)
	for n, l := range t.limW {
		if l == nil {
			out = slices.DeleteFunc(out, func(o string) bool { return o == n })
		} else if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Limit implements policy.Tx.
func (t *etx) Limit(name string) (policy.LimitRec, bool, error) {
	if l, ok := t.limW[name]; ok {
		if l == nil {
			return policy.LimitRec{}, false, nil
		}
		return *l, true, nil
	}
	if err := t.load(name); err != nil {
		return policy.LimitRec{}, false, err
	}
	l := t.st.lim(name)
	if l == nil {
		return policy.LimitRec{}, false, nil
	}
	return policy.LimitRec{Slots: l.Slots, Created: l.Created, Policy: l.Policy, Starts: slices.Clone(l.Starts)}, true, nil
}

func (t *etx) PutLimit(name string, l policy.LimitRec) error {
	if err := t.writable(); err != nil {
		return err
	}
	if err := t.load(name); err != nil {
		return err
	}
	t.limW[name] = &l
	return nil
}

func (t *etx) DeleteLimit(name string) error {
	if err := t.writable(); err != nil {
		return err
	}
	if err := t.load(name); err != nil {
		return err
	}
	t.limW[name] = nil
	return nil
}

func (t *etx) writable() error {
	if t.g == nil {
		return fmt.Errorf("etcdstore: a write in a read-only step")
	}
	return nil
}

// Queue implements policy.Tx: the tickets of limit as read, with the
// step's own writes.
func (t *etx) Queue(limit string) ([]policy.Rec, error) {
	if err := t.load(limit); err != nil {
		return nil, err
	}
	var out []policy.Rec
	for _, e := range t.st.queue(limit) {
		if w, ok := t.recW[e.r.ID]; ok {
			if w != nil {
				out = append(out, *w)
			}
			continue
		}
		out = append(out, t.recOf(e))
	}
	if w := t.recW[t.fresh]; t.fresh != "" && w != nil && w.Has(limit) {
		out = append(out, *w)
	}
	return out, nil
}

// Lookup implements policy.Tx.
func (t *etx) Lookup(id string) (policy.Rec, bool, error) {
	if w, ok := t.recW[id]; ok {
		if w == nil {
			return policy.Rec{}, false, nil
		}
		return *w, true, nil
	}
	kv, err := t.idKV(id)
	if err != nil || kv == nil {
		return policy.Rec{}, false, err
	}
	ir, err := decodeID(id, kv.Value)
	if err != nil || ir.Removed != "" {
		return policy.Rec{}, false, err
	}
	names := ir.names()
	if err := t.load(names...); err != nil {
		return policy.Rec{}, false, err
	}
	e := t.st.byID[id]
	if e == nil || !slices.Contains(t.st.queue(names[0]), e) {
		return policy.Rec{}, false, nil
	}
	t.looked[id] = true
	if t.g != nil && t.g.lease != 0 && e.r.Lease == t.g.lease {
		// An enqueue whose write landed unanswered (its own, or the light
		// path's) finds its ticket: the lease is the ticket's now.
		t.g.used = true
	}
	return t.recOf(e), true, nil
}

// recOf is the rules' record of e, its deadline as its lease stands.
func (t *etx) recOf(e *entry) policy.Rec {
	r := &e.r
	out := policy.Rec{ID: r.ID, Limit: r.Limit, State: r.State, Fence: uint64(e.fence), Slot: r.Slot, TTL: r.TTL,
		DeadlineBoot: etcdBoot, DeadlineMono: t.now.Mono, Created: r.Created, Admitted: r.Admitted, Holder: r.Holder,
		Key: r.Key, Replaces: slices.Clone(r.Replaces), Priority: r.Priority, Share: r.Share, Superseding: r.Superseding}
	if r.Stop != nil {
		stop := *r.Stop
		out.Stop = &stop
	}
	if names := r.names(); len(names) > 1 || r.weighs() > 1 {
		out.Limits, out.Weight = slices.Clone(names), r.weighs()
		if r.State == store.Held {
			out.Indexes = map[string][]int{}
			for _, n := range names {
				out.Indexes[n] = slices.Clone(r.in(n))
			}
		}
	}
	if r.State != store.Held {
		out.State, out.Slot = store.Waiting, -1
	}
	if e.live() || e.onHold() || t.p != nil && t.p.kept[e] {
		rem := r.TTL
		if d, ok := t.s.leases.remaining(r.keyLease()); ok {
			rem = d
		}
		out.DeadlineMono += max(rem, time.Millisecond)
	}
	return out
}

// Expired implements policy.Expirer: the server expires leases, and a
// record without its ticket key has lost its lease, unless a hold keeps it.
func (t *etx) Expired(r policy.Rec) string {
	if r.ID == t.fresh || t.st == nil {
		return ""
	}
	e := t.st.byID[r.ID]
	if e == nil || uint64(e.fence) != r.Fence {
		return ""
	}
	if e.live() {
		if t.g == nil && t.s.o.skew > 0 { // a reaper whose reading of the leases is skew ahead (tests)
			if rem := t.s.remaining(t.ctx, e.r.keyLease()); rem-t.s.o.skew <= 0 {
				return "expired " + ago(t.s.o.skew-rem) + " ago by this reaper's reading (the server has not expired it)"
			}
		}
		return ""
	}
	if t.p.holds(e) {
		return ""
	}
	return expiredEvidence
}

// Put implements policy.Tx.
func (t *etx) Put(r policy.Rec) error {
	if err := t.writable(); err != nil {
		return err
	}
	if r.Fence == freshFence {
		if t.fresh != "" && t.fresh != r.ID {
			return fmt.Errorf("etcdstore: two new tickets in one step")
		}
		t.fresh = r.ID
	} else if e := t.entryOf(r); e == nil {
		return fmt.Errorf("etcdstore: a write of ticket %s, which the step did not read", r.ID)
	}
	if _, ok := t.recW[r.ID]; !ok {
		t.order = append(t.order, r.ID)
	}
	t.recW[r.ID] = &r
	return nil
}

// Delete implements policy.Tx.
func (t *etx) Delete(r policy.Rec) error {
	if err := t.writable(); err != nil {
		return err
	}
	if t.entryOf(r) == nil {
		return fmt.Errorf("etcdstore: a removal of ticket %s, which the step did not read", r.ID)
	}
	if _, ok := t.recW[r.ID]; !ok {
		t.order = append(t.order, r.ID)
	}
	t.recW[r.ID] = nil
	return nil
}

// entryOf is r's entry as read, or nil.
func (t *etx) entryOf(r policy.Rec) *entry {
	if t.st == nil {
		return nil
	}
	if e := t.st.byID[r.ID]; e != nil && uint64(e.fence) == r.Fence {
		return e
	}
	return nil
}

func (t *etx) NextFence() (uint64, error) { return freshFence, nil }

// Tomb implements policy.Tx.
func (t *etx) Tomb(id string) (policy.Tomb, bool, error) {
	if tb, ok := t.tombs[id]; ok {
		return tb, true, nil
	}
	kv, err := t.idKV(id)
	if err != nil || kv == nil {
		return policy.Tomb{}, false, err
	}
	ir, err := decodeID(id, kv.Value)
	if err != nil || ir.Removed == "" {
		return policy.Tomb{}, false, err
	}
	return policy.Tomb{Reason: ir.Removed, Wall: ir.At, Boot: etcdBoot, By: ir.By}, true, nil
}

func (t *etx) PutTomb(id string, tb policy.Tomb) error {
	if err := t.writable(); err != nil {
		return err
	}
	if _, err := t.idKV(id); err != nil {
		return err
	}
	t.tombs[id] = tb
	return nil
}

// Log implements policy.Tx. A holder's "lost" is logged once: its key
// would be written over, and counted twice (a retried or repeated request,
// or the release that removed the ticket logged it).
func (t *etx) Log(e store.Event) error {
	if err := t.writable(); err != nil {
		return err
	}
	if e.Kind == string(store.Lost) && !t.s.o.Mutations.Has(mutation.LostRecounted) { // mutation (test-only): a repeated "lost" counted again
		key := t.s.k.event(e.Limit, e.Ticket, e.Kind)
		rs, err := t.read(clientv3.OpGet(key, append(t.at(), clientv3.WithKeysOnly())...))
		if err != nil {
			return err
		}
		if len(rs[0].Kvs) > 0 {
			return nil
		}
		t.unlogged = append(t.unlogged, key)
	}
	t.events = append(t.events, e)
	return nil
}

// Counts implements policy.Tx: the counts key as read, with its deltas
// (countsrec.go), and what the step added.
func (t *etx) Counts(limit string) (store.Counts, error) {
	if c, ok := t.counts[limit]; ok {
		return cloneCounts(c), nil
	}
	if err := t.load(limit); err != nil {
		return store.Counts{}, err
	}
	ls := t.st.lims[limit]
	c := cloneCounts(ls.counts)
	c.Limit = limit
	if ls.lim == nil {
		c = store.Counts{Limit: limit} // left behind without its limit: not counted
	}
	for _, d := range ls.deltas {
		c.Add(d.event())
	}
	return c, nil
}

func cloneCounts(c store.Counts) store.Counts {
	c.Wait.Buckets, c.Hold.Buckets = slices.Clone(c.Wait.Buckets), slices.Clone(c.Hold.Buckets)
	return c
}

// PutCounts implements policy.Tx. The counts the commit writes are made
// from the events logged (plan.count, the same sums), so this only keeps
// them for the step's own reads.
func (t *etx) PutCounts(c store.Counts) error {
	if err := t.writable(); err != nil {
		return err
	}
	t.counts[c.Limit] = cloneCounts(c)
	return nil
}

func (t *etx) Ring(r policy.Rec) { t.rings = append(t.rings, r.ID) }
func (t *etx) Gone(policy.Rec)   {}
