package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
)

// headScan is how many ticket keys, oldest first, Heads reads to find a
// limit's first waiter past its holders; a limit with more holders among
// its oldest tickets is read again with room for all of them.
const headScan = 32

// headsPerTxn is how many limits one Heads transaction reads (four reads
// each, within etcd's default of 128 operations a transaction).
const headsPerTxn = 25

// Heads implements [store.HeadReader]: per limit, its key, its slot keys
// (the holders' ids), a count of its live ticket keys and the oldest of
// them (keys only), then the records of its holders and of its first
// waiter at that revision. No waiting ticket but the first is decoded and
// no lease is asked for its remaining time, so the cost is the limit's
// size, not its queue's: a waiting run's status line reads this every time
// it is drawn. A limit whose policy orders its waiters otherwise than by
// ticket is the exception: any of them may be first, and its records are
// read whole to find which (arrangedFirst).
//
// The first waiter is the oldest ticket key that is not a holder's. A
// waiter kept under a hold after an election (quarantine.go) has a key
// newer than its record, so until it is admitted a younger waiter may be
// named first here: what Heads feeds (a gauge, an estimate) tolerates
// that; Snapshot orders by the records.
func (s *Store) Heads(ctx context.Context, limits ...string) (store.Snapshot, error) {
	if s.closed.Load() {
		return store.Snapshot{}, s.errClosed()
	}
	for _, l := range limits {
		if err := store.CheckLimitName(l); err != nil {
			return store.Snapshot{}, err
		}
	}
	named := len(limits) > 0
	names := slices.Clone(limits)
	slices.Sort(names)
	names = slices.Compact(names)
	if !named {
		var err error
		if names, err = s.limitNames(ctx, nil); err != nil {
			return store.Snapshot{}, err
		}
	}
	out := store.Snapshot{Now: time.Now(), Limits: []store.Limit{}, Tickets: []store.Ticket{}}
	for chunk := range slices.Chunk(names, headsPerTxn) {
		if err := s.headsOf(ctx, chunk, named, &out); err != nil {
			return store.Snapshot{}, err
		}
	}
	return out, nil
}

// headsOf adds the heads of names, read at one revision, to out. A limit
// removed since it was listed is left out, unless the caller named it.
func (s *Store) headsOf(ctx context.Context, names []string, named bool, out *store.Snapshot) error {
	rev, rs, err := s.readHeadKeys(ctx, names)
	if err != nil {
		return err
	}
	heads := make([]limitHead, len(names))
	var reads []clientv3.Op
	for i, n := range names {
		r := rs[4*i : 4*i+4]
		if len(r[0].Kvs) == 0 {
			if named {
				return fmt.Errorf("%w: %q", store.ErrLimitNotFound, n)
			}
			continue
		}
		h, err := s.headOf(ctx, n, r, rev, out.Now)
		if err != nil {
			return err
		}
		heads[i] = h
		for _, id := range h.held {
			reads = append(reads, clientv3.OpGet(s.k.record(n, id), clientv3.WithRev(rev)))
		}
		if h.first != "" {
			reads = append(reads, clientv3.OpGet(s.k.record(n, h.first), clientv3.WithRev(rev)))
		}
	}
	recs, err := s.readHeadRecords(ctx, reads)
	if err != nil {
		return err
	}
	for i, n := range names {
		h := heads[i]
		if h.lim == nil {
			continue
		}
		var ts []store.Ticket
		if ts, recs, err = s.headTickets(n, h, recs); err != nil {
			return err
		}
		out.AddLimit(h.lim.view(n), ts)
		out.Limits[len(out.Limits)-1].Waiting = h.waiting
	}
	return nil
}

// limitHead is what Heads reads of one limit.
type limitHead struct {
	lim     *limitRec
	held    []string // ids, in slot order, each once
	first   string   // the oldest live ticket not held
	waiting int
}

// headsByFence orders ticket keys oldest first.
func headsByFence() clientv3.OpOption {
	return clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)
}

// readHeadKeys reads, in one transaction, four responses per limit of
// names: its key, its slot keys, a count of its ticket keys and the oldest
// headScan of them (keys only).
func (s *Store) readHeadKeys(ctx context.Context, names []string) (int64, []*clientv3.GetResponse, error) {
	var ops []clientv3.Op
	for _, n := range names {
		ops = append(ops, clientv3.OpGet(s.k.limit(n)),
			clientv3.OpGet(s.k.slots(n), clientv3.WithPrefix()),
			clientv3.OpGet(s.k.tickets(n), clientv3.WithPrefix(), clientv3.WithCountOnly()),
			clientv3.OpGet(s.k.tickets(n), clientv3.WithPrefix(), clientv3.WithKeysOnly(), headsByFence(), clientv3.WithLimit(headScan)))
	}
	cctx, cancel := s.ctx(ctx)
	resp, err := s.c.Txn(cctx).Then(ops...).Commit()
	cancel()
	if err != nil {
		return 0, nil, s.unavailable(err, false)
	}
	s.answered()
	return resp.Header.Revision, getResponses(resp.Responses), nil
}

// headOf decodes the head of limit n from its four responses r of
// readHeadKeys (at rev), reading more ticket keys when every one read is
// a holder's, or the limit's records when its policy orders its waiters
// otherwise than by ticket (arrangedFirst).
func (s *Store) headOf(ctx context.Context, n string, r []*clientv3.GetResponse, rev int64, now time.Time) (limitHead, error) {
	l, err := decodeLimit(n, r[0].Kvs[0].Value)
	if err != nil {
		return limitHead{}, err
	}
	h := limitHead{lim: &l}
	seen := map[string]bool{}
	for _, kv := range r[1].Kvs {
		i, err := strconv.Atoi(last(kv.Key))
		id := string(kv.Value)
		if err != nil || i < 0 || i >= store.MaxSlots || store.CheckID(id) != nil {
			return limitHead{}, fmt.Errorf("%w: slot key %s", store.ErrCorrupt, kv.Key)
		}
		if !seen[id] {
			seen[id] = true
			h.held = append(h.held, id)
		}
	}
	h.waiting = max(int(r[2].Count)-len(h.held), 0)
	if h.waiting > 0 && l.Policy.Ordered() != store.FIFO {
		h.first, err = s.arrangedFirst(ctx, n, l.Policy, rev, now)
		return h, err
	}
	keys := r[3].Kvs
	if h.waiting > 0 && len(keys) == headScan && len(h.held) >= headScan {
		// Every key read is a holder's: read as many as there are
		// holders, and one more.
		cctx, cancel := s.ctx(ctx)
		more, err := s.c.Get(cctx, s.k.tickets(n), clientv3.WithPrefix(), clientv3.WithKeysOnly(), headsByFence(),
			clientv3.WithLimit(int64(len(h.held)+1)), clientv3.WithRev(rev))
		cancel()
		if err != nil {
			return limitHead{}, s.unavailable(err, false)
		}
		keys = more.Kvs
	}
	for _, kv := range keys {
		if id := last(kv.Key); !seen[id] {
			h.first = id
			break
		}
	}
	return h, nil
}

// arrangedFirst is the first waiter of limit n at rev in the order its
// policy p admits them at now, as Snapshot numbers them: any waiter may
// be first, so every record of the limit is read (the holders' too: a
// fair order counts what each share holds). "" when none waits.
func (s *Store) arrangedFirst(ctx context.Context, n string, p store.Policy, rev int64, now time.Time) (string, error) {
	cctx, cancel := s.ctx(ctx)
	resp, err := s.c.Get(cctx, s.k.records(n), clientv3.WithPrefix(), headsByFence(), clientv3.WithRev(rev))
	cancel()
	if err != nil {
		return "", s.unavailable(err, false)
	}
	var held, waiting []*store.Ticket
	for _, kv := range resp.Kvs {
		r, err := decodeRec(kv.Key, n, last(kv.Key), kv.Value)
		if err != nil {
			return "", err
		}
		t := new(s.view(&entry{r: r, fence: kv.CreateRevision, rkv: kv}, 0, 0))
		if r.State == store.Held {
			held = append(held, t)
		} else {
			waiting = append(waiting, t)
		}
	}
	if order := p.Arrange(held, waiting, now); len(order) > 0 {
		return waiting[order[0]].ID, nil
	}
	return "", nil
}

// readHeadRecords reads the records of reads, in transactions within
// etcd's limit of operations.
func (s *Store) readHeadRecords(ctx context.Context, reads []clientv3.Op) ([]*clientv3.GetResponse, error) {
	var recs []*clientv3.GetResponse
	for part := range slices.Chunk(reads, 4*headsPerTxn) {
		cctx, cancel := s.ctx(ctx)
		resp, err := s.c.Txn(cctx).Then(part...).Commit()
		cancel()
		if err != nil {
			return nil, s.unavailable(err, false)
		}
		recs = append(recs, getResponses(resp.Responses)...)
	}
	return recs, nil
}

// headTickets decodes the tickets of head h of limit n from the front of
// recs (its holders', then its first waiter's) and returns the rest.
func (s *Store) headTickets(n string, h limitHead, recs []*clientv3.GetResponse) ([]store.Ticket, []*clientv3.GetResponse, error) {
	var ts []store.Ticket
	ids := h.held
	if h.first != "" {
		ids = append(slices.Clip(ids), h.first)
	}
	for _, id := range ids {
		got := recs[0]
		recs = recs[1:]
		if len(got.Kvs) == 0 {
			continue // a ticket key without its record: Snapshot and reap name it
		}
		kv := got.Kvs[0]
		r, err := decodeRec(kv.Key, n, id, kv.Value)
		if err != nil {
			return nil, nil, err
		}
		if (id == h.first) == (r.State == store.Held) {
			continue // not what its keys say (both read at one revision): Snapshot and reap judge it
		}
		ts = append(ts, s.view(&entry{r: r, fence: kv.CreateRevision, rkv: kv}, 0, 0))
	}
	return ts, recs, nil
}
