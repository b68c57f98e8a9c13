package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slotctl/slotctl/store"
)

// The etcd store's own faults (fault "etcd-lost-answer"): what a real
// cluster does to the store's client that the host-local stores never see.
// They are injected in the real client of each handle, a gRPC interceptor
// among the store's DialOptions, inside every attempt of the store's own
// (failover.go), so the store's retries meet them as they would meet a
// member's.

// lostAnswerP is the chance that a write's answer is lost after it
// committed. A handle's next writes get their answers (lostAnswerCool),
// so a retry reaches the server and reads what the lost one did: a store
// that then writes again, or gives up on what committed, is caught by the
// model as a ticket booked twice, lost or duplicated. A handle loses no
// answer before its first one: a handle that never heard the server
// fails at once until it does, which is another fault (an unreachable
// cluster).
const (
	lostAnswerP    = 0.1
	lostAnswerCool = 3
)

// lostAnswers is one handle's injector of lost answers.
type lostAnswers struct {
	e *Etcd

	mu       sync.Mutex
	rng      *rand.Rand
	answered bool // the handle has had an answer
	cool     int  // writes left that keep their answers
}

// writes reports whether method, with req, writes: its answer may be lost
// after it committed. A lease's keep-alive is a stream (keepalive.go), a
// renewal's lost answer is the renew-fail fault's.
func writes(method string, req any) bool {
	switch method {
	case "/etcdserverpb.KV/Put", "/etcdserverpb.KV/DeleteRange", "/etcdserverpb.Lease/LeaseGrant", "/etcdserverpb.Lease/LeaseRevoke":
		return true
	case "/etcdserverpb.KV/Txn":
		t, ok := req.(*pb.TxnRequest)
		return ok && (txnWrites(t.Success) || txnWrites(t.Failure))
	}
	return false
}

func txnWrites(ops []*pb.RequestOp) bool {
	for _, op := range ops {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut, *pb.RequestOp_RequestDeleteRange:
			return true
		case *pb.RequestOp_RequestTxn:
			if txnWrites(r.RequestTxn.Success) || txnWrites(r.RequestTxn.Failure) {
				return true
			}
		}
	}
	return false
}

// unary sends the request; when the fault strikes a write, the server runs
// it and the caller gets codes.Unavailable, as from a member that went
// away after it applied the entry.
func (l *lostAnswers) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	dead, dies := l.dies(ctx, method, req)
	if dead {
		return status.Error(codes.Canceled, "sim: the caller died")
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if dies {
		l.e.note(fmt.Sprintf("etcd: %s committed, its caller dies", method), false)
		ctx.Value(dyingKey{}).(*dying).cancel()
		return status.Error(codes.Canceled, "sim: the caller died")
	}
	if err != nil || !l.e.lostOn.Load() || !writes(method, req) {
		if err == nil {
			l.mu.Lock()
			l.answered = true
			l.mu.Unlock()
		}
		return err
	}
	l.mu.Lock()
	lose := l.answered && l.cool == 0 && l.rng.Float64() < lostAnswerP
	switch {
	case lose:
		l.cool = lostAnswerCool
	case l.cool > 0:
		l.cool--
	}
	l.answered = true
	l.mu.Unlock()
	if !lose {
		return err
	}
	l.e.note(fmt.Sprintf("etcd: the answer of a committed %s is lost", method), true)
	return status.Error(codes.Unavailable, "sim: the answer was lost after the write committed")
}

// note keeps a line for the trace: the injectors run in the store's
// goroutines, the trace is the step's.
func (e *Etcd) note(line string, lost bool) {
	e.mu.Lock()
	e.notes = append(e.notes, line)
	if lost {
		e.lost++
	}
	e.mu.Unlock()
}

// etcdNotes moves the injectors' notes into the trace, and reports
// whether an answer was lost since the last call (in the one just made:
// the simulation makes one at a time).
func (s *sim) etcdNotes() bool {
	e, ok := s.be.(*Etcd)
	if !ok {
		return false
	}
	e.mu.Lock()
	notes := e.notes
	e.notes = nil
	s.stats.LostAnswers = e.lost
	e.mu.Unlock()
	for _, n := range notes {
		s.tracef("%s", n)
	}
	return len(notes) > 0
}

// lostAnswer reports whether err is a call's failure on an answer lost in
// it: its outcome is unknown, as a caller of slotctl would see it.
func (c *conn) lostAnswer(err error) bool {
	return errors.Is(err, store.ErrUnavailable) && c.s.etcdNotes()
}

// enqueueUnknown is an Enqueue whose answer was lost (the store gave up
// retrying, or the write's answer it does not retry was lost: its lease's
// grant): slotctl's gate cancels the ticket if it is there. The model
// learns what the store did from a read of the id, as the answer it would
// have had: the ticket, or nothing written.
func (c *conn) enqueueUnknown(ctx context.Context, req store.EnqueueRequest, err error, remember func()) (store.Ticket, error) {
	remember()
	t, gerr := c.s.checker.Get(untimed(ctx), req.ID)
	c.s.etcdNotes()
	switch {
	case gerr == nil:
		c.s.tracef("%s's enqueue of %s: %v; the store has it: %s", c.who, short(req.ID), err, result(t, nil))
		c.record(&op{kind: "enqueue", req: req, res: t})
	case errors.Is(gerr, store.ErrNotFound):
		c.s.tracef("%s's enqueue of %s: %v; nothing written", c.who, short(req.ID), err)
	default:
		c.s.fail("S12", "enqueue of %s: %v, and its read: %v", short(req.ID), err, gerr)
	}
	return store.Ticket{}, err
}

// etcdFaults switches the etcd store's faults on for the random phase
// (on etcd, if the run has them) or off for the quiescent one.
func (s *sim) etcdFaults(on bool) {
	if e, ok := s.be.(*Etcd); ok {
		e.lostOn.Store(on && s.cfg.Faults.Has(EtcdLostAnswer))
	}
}

// unknownOutcome applies a call whose outcome is unknown (its answer was
// lost, op.unknown) and reports whether it did: the model learns what the
// store did from the step's snapshot. A renewal (its takeHold may have
// admitted the ticket) and a record of the child's group are Run's to
// retry, as they are in slotctl; so is the release of a ticket the store
// no longer has (it logs the holder's "lost" and a tombstone, once: the
// compares see to it; a late enqueue of its id may then be refused, as
// after a cancel before the create). The other calls retry a lost answer inside the
// store, so theirs failing is the store's failure (S12).
//
// A reap retries its lost answer too, but the retry finds nothing left of
// what the lost attempt removed, and lists only what it removes itself
// (etcdstore's Reap): such a reap is not held to L1, the snapshot shows
// what it removed.
func (m *model) unknownOutcome(o *op) bool {
	switch {
	case o.kind == "renew", o.kind == "setchild", o.kind == "get", o.kind == "snapshot",
		o.kind == "release" && m.live[o.t.ID] == nil:
		m.s.tracef("%s's %s of %s: outcome unknown (%v)", o.who, o.kind, short(o.t.ID), o.err)
		if o.kind == "release" {
			if m.mayRefuse == nil {
				m.mayRefuse = map[string]bool{}
			}
			m.mayRefuse[o.t.ID] = true
		}
		return true
	}
	return false
}

// Stale leadership (fault "etcd-revoke"): a member that lost its
// leadership without knowing it, or a client on its word, revokes a lease
// that its holder renewed on time elsewhere. The ticket's keys go with the
// lease, its slot with them, and the next settle admits another: for the
// store and the next holder it is an operator's forced release, done
// behind the holder's back, so the model takes it as one (S2 allows its
// job to run to its lease's end, as its holder counts it, + the kill
// grace: the holder learns at its next renewal, which the store refuses as
// lost, and stops its job then). The revoke is sent by a client of its
// own, as another member's would be: no handle of the store hears of it.
const revokeP = 0.004

// revokeOne revokes the lease of a live held ticket whose holder runs;
// false if there is none or the run has not the fault.
func (s *sim) revokeOne() bool {
	e, ok := s.be.(*Etcd)
	if !ok || s.quiet || !s.cfg.Faults.Has(EtcdRevoke) {
		return false
	}
	s.revokedRunOn(e)
	e.mu.Lock()
	draw := e.rng.Float64()
	e.mu.Unlock()
	if draw >= revokeP {
		return false
	}
	var held []*mTicket
	now := s.now()
	for _, t := range s.m.sorted() {
		if t.state == store.Held && t.owner != nil && t.owner.live() && t.owner.id == t.id && !s.m.expired(t, now) && !s.m.near(t, now) {
			held = append(held, t)
		}
	}
	if len(held) == 0 {
		return false
	}
	e.mu.Lock()
	t := held[e.rng.IntN(len(held))]
	e.mu.Unlock()
	lease, err := e.revoke(s.ctx, t.limits[0], t.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// Its lease ended on the server's clock, ahead of the model's by
		// up to the slack: no revoke, and the model learns it as any end.
		s.tracef("a member with stale leadership would revoke the lease of %s's ticket %s: gone already", t.owner.name, short(t.id))
		return true
	}
	if err != nil {
		s.fail("S12", "revoke of ticket %s's lease: %v", short(t.id), err)
		return true
	}
	s.stats.Revokes++
	e.revoked = append(e.revoked, revoked{h: t.owner, at: s.now().Mono})
	s.tracef("a member with stale leadership revokes lease %x of %s's held ticket %s (renewed on time, local deadline in %v)",
		lease, t.owner.name, short(t.id), t.owner.lease.Deadline()-t.owner.hostNow())
	s.m.remove(t, goneRec{why: "revoked by a member with stale leadership", force: true, swept: true})
	// A settle follows (a reaper's, here at once): it removes the record
	// and gives the slot to the next waiter. The store's next write would;
	// L3 judges the step that made the room, which a revoke, no write of
	// the store's, cannot be.
	rm, err := s.netConn.Reap(s.ctx, store.ReapOptions{Limits: t.limits})
	s.tracef("a reaper settles %v: %d removed %s", t.limits, len(rm), errString(err))
	return true
}

// revoke revokes the lease of ticket id (its record under limit), with the
// model's own client, and returns the lease.
func (e *Etcd) revoke(ctx context.Context, limit, id string) (int64, error) {
	var lease int64
	err := e.peek(ctx, func(ctx context.Context, c *clientv3.Client) error {
		// The store's record of the ticket: its lease (etcdstore's keys).
		r, err := c.Get(ctx, e.opts.Prefix+"/records/"+limit+"/"+id)
		if err != nil {
			return err
		}
		if len(r.Kvs) == 0 {
			return fmt.Errorf("no record of ticket %s under %s", id, limit)
		}
		var rec struct {
			Lease int64 `json:"lease"`
		}
		if err := json.Unmarshal(r.Kvs[0].Value, &rec); err != nil {
			return err
		}
		lease = rec.Lease
		_, err = c.Revoke(ctx, clientv3.LeaseID(rec.Lease))
		return err
	})
	return lease, err
}

// notYetRevoked: on etcd, t's lease is past its end by the model's clock
// but the server had not revoked it when the reap read. The server revokes
// up to etcdJitter late on a quiet machine, on a loaded one later still;
// the store's part is to sweep what the server ended, not to end it. A
// revoke is for good, so a ticket key still there after the reap was
// there when the reap read; one there at rev0, the revision just before
// the reap (0: not known), may have gone while the reap ran, after its
// read. Only a key gone by rev0 was surely gone when the reap read.
func (s *sim) notYetRevoked(t *mTicket, now Instant, rev0 int64) bool {
	e, ok := s.be.(*Etcd)
	if !ok {
		return false
	}
	late := now.Mono - s.m.expiry(t, now)
	if there, err := e.ticketKey(s.ctx, t.limits[0], t.id, 0); err == nil && there {
		s.stats.RevokedLate++
		s.tracef("the server has not revoked the lease of ticket %s yet, %v past its end by the simulation's clock", short(t.id), late)
		return true
	}
	if rev0 == 0 {
		return false
	}
	if there, err := e.ticketKey(s.ctx, t.limits[0], t.id, rev0); err == nil && there {
		s.stats.RevokedLate++
		s.tracef("the server revoked the lease of ticket %s while the reap ran (its key was there at revision %d, before the reap), %v past its end by the simulation's clock", short(t.id), rev0, late)
		return true
	}
	return false
}

// ticketKey reports whether ticket id's key under limit is there (its
// lease not revoked), now or at revision rev (0: now), read with the
// model's own client.
func (e *Etcd) ticketKey(ctx context.Context, limit, id string, rev int64) (bool, error) {
	var there bool
	err := e.peek(ctx, func(ctx context.Context, c *clientv3.Client) error {
		opts := []clientv3.OpOption{clientv3.WithKeysOnly()}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		r, err := c.Get(ctx, e.opts.Prefix+"/tickets/"+limit+"/"+id, opts...)
		there = err == nil && len(r.Kvs) > 0
		return err
	})
	return there, err
}

// revision is the server's revision now, 0 if it cannot be read.
func (e *Etcd) revision(ctx context.Context) int64 {
	var rev int64
	_ = e.peek(ctx, func(ctx context.Context, c *clientv3.Client) error {
		r, err := c.Get(ctx, e.opts.Prefix+"/revision", clientv3.WithKeysOnly())
		if err == nil {
			rev = r.Header.Revision
		}
		return err
	})
	return rev
}

// peek runs f with the model's own client (no injected faults), made on
// first use and kept for the run: a reap's revision is read before each
// reap.
func (e *Etcd) peek(ctx context.Context, f func(context.Context, *clientv3.Client) error) error {
	e.mu.Lock()
	if e.peeker == nil {
		c, err := clientv3.New(clientv3.Config{Endpoints: e.opts.Endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			e.mu.Unlock()
			return err
		}
		e.peeker = c
	}
	c := e.peeker
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return f(ctx, c)
}

// A process that dies inside a store call (fault "etcd-crash-in-call"):
// slotctl run killed (SIGKILL, the OOM killer, its host lost) between the
// store's writes of one call. The host-local stores write a call in one
// transaction; etcd's may take several (a lease, then a transaction; a
// supersede too large for one), and a call's later writes must never be
// what makes its earlier ones safe. The process dies right after the
// call's first transaction that writes commits: what it sends later is
// never sent (the injector cancels the call, so the store's retries end).
// Armed on a share of the holders' enqueues, most of them superseding or
// replacing ones. What the store did is then read back, as slotctl's
// next run would find it: the ticket, which the model takes as answered
// (its lease runs out, a reaper removes it), or nothing, and then nothing
// of the enqueue's step may have happened: no older run of its key
// superseded for it (S40).
const (
	diePSupersede = 0.5  // an enqueue that supersedes or replaces
	dieP          = 0.02 // any other
)

// dying marks, in a call's context, a caller armed to die.
type dying struct {
	cancel context.CancelFunc
	died   bool
}

type dyingKey struct{}

// dies is the injector's part: once a call's writing transaction committed,
// the caller is dead; nothing more of it is sent.
func (l *lostAnswers) dies(ctx context.Context, method string, req any) (dead, now bool) {
	d, _ := ctx.Value(dyingKey{}).(*dying)
	if d == nil {
		return false, false
	}
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	if d.died {
		return true, false
	}
	if method == "/etcdserverpb.KV/Txn" && writes(method, req) {
		d.died = true
		return false, true
	}
	return false, false
}

// armDeath decides whether this enqueue's caller dies in it; if so, it
// returns the call's context and its mark.
func (c *conn) armDeath(ctx context.Context, req store.EnqueueRequest) (context.Context, *dying) {
	e, ok := c.s.be.(*Etcd)
	if !ok || c.s.quiet || !c.s.cfg.Faults.Has(EtcdCrashInCall) || c.owner == nil || c == c.s.netConn {
		return ctx, nil
	}
	p := dieP
	if req.Supersede || req.Replace {
		p = diePSupersede
	}
	e.mu.Lock()
	draw := e.rng.Float64()
	e.mu.Unlock()
	if draw >= p {
		return ctx, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &dying{cancel: cancel}
	return context.WithValue(ctx, dyingKey{}, d), d
}

// enqueueDied: the caller died in its enqueue. The model learns what the
// store did by reading it back; the caller is gone.
func (c *conn) enqueueDied(ctx context.Context, req store.EnqueueRequest, remember func()) (store.Ticket, error) {
	s, h := c.s, c.owner
	remember() // a request sent is a request that may arrive late
	t, gerr := s.checker.Get(ctx, req.ID)
	s.etcdNotes()
	s.stats.DiedInCall++
	if req.Supersede && len(s.m.olderWaiting(req)) > 0 {
		s.stats.DiedSuperseding++
	}
	switch {
	case gerr == nil:
		s.tracef("%s dies in its enqueue of %s, after its first write: the store has %s", h.name, short(req.ID), result(t, nil))
		h.crashAfterCall = true
		c.record(&op{kind: "enqueue", req: req, res: t})
	case errors.Is(gerr, store.ErrNotFound):
		s.tracef("%s dies in its enqueue of %s, after its first write: no ticket", h.name, short(req.ID))
		c.superseded(ctx, req)
		h.crash()
	default:
		s.fail("S12", "enqueue of %s: its caller died in it, and its read: %v", short(req.ID), gerr)
		h.crash()
	}
	return store.Ticket{}, errDead
}

// superseded checks that no older run of req's key was superseded for it
// (S40): req's ticket was never written.
func (c *conn) superseded(ctx context.Context, req store.EnqueueRequest) {
	s := c.s
	if !req.Supersede {
		return
	}
	for _, t := range s.m.olderWaiting(req) {
		_, err := s.checker.Get(ctx, t.id)
		var se *store.SupersededError
		if errors.As(err, &se) && se.By.Ticket == req.ID {
			s.fail("S40", "ticket %s of %s was superseded by %s, which was never written (its enqueue's caller died in it)", short(t.id), ownerName(t.owner), short(req.ID))
			return
		}
	}
}

// olderWaiting lists the live waiting tickets of req's key that share a
// limit with it: what its supersede removes.
func (m *model) olderWaiting(req store.EnqueueRequest) []*mTicket {
	var out []*mTicket
	for _, t := range m.sorted() {
		if t.id != req.ID && t.key == req.Key && t.state != store.Held && slices.ContainsFunc(req.Names(), t.names) {
			out = append(out, t)
		}
	}
	return out
}

// A revoked holder whose job still ran when last looked at.
type revoked struct {
	h  *holder
	at time.Duration // the revoke, on the store's clock
}

// revokedRunOn measures how long the jobs of revoked holders run on after
// the revoke (Stats.RevokeOverlap), when their slot may be another's: S2
// bounds it by the lease's end as the holder counted it + the kill grace
// (a supervisor stopped meanwhile is S24's, and not counted here).
func (s *sim) revokedRunOn(e *Etcd) {
	now := s.now().Mono
	kept := e.revoked[:0]
	for _, r := range e.revoked {
		if r.h.child.running {
			if !r.h.paused && !r.h.resumedLate { // (a stopped supervisor's is S24's, PauseOverlap)
				s.stats.RevokeOverlap = max(s.stats.RevokeOverlap, now-r.at)
			}
			kept = append(kept, r)
		}
	}
	e.revoked = kept
}
