package etcdstore

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
)

// lstate is one limit as read at one revision.
type lstate struct {
	name    string
	rev     int64
	lim     *limitRec        // nil: no such limit
	limKV   *mvccpb.KeyValue // nil: no such limit
	entries []*entry         // the limit's records, by fence (queue order)
	slots   map[int]*mvccpb.KeyValue
	idKV    *mvccpb.KeyValue // P/ids/<id> of the ticket asked about, if any was
	dayKV   *mvccpb.KeyValue
}

// entry is one ticket of a limit: its record, and its ticket key while its
// lease lives.
type entry struct {
	r     rec
	fence int64
	rkv   *mvccpb.KeyValue // P/records/<limit>/<id>
	tkv   *mvccpb.KeyValue // P/tickets/<limit>/<id>; nil once the lease expired
	isNew bool             // written by the plan being built (Enqueue)
}

func (e *entry) live() bool { return e.tkv != nil || e.isNew }

func (s *lstate) find(id string) (*entry, int) {
	for i, e := range s.entries {
		if e.r.ID == id {
			return e, i
		}
	}
	return nil, -1
}

// readOps read a limit (and an id's key, when id is not "") at one revision.
func (s *Store) readOps(limit, id string, serializable bool) []clientv3.Op {
	opt := func(o ...clientv3.OpOption) []clientv3.OpOption {
		if serializable {
			o = append(o, clientv3.WithSerializable())
		}
		return o
	}
	byFence := clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)
	ops := []clientv3.Op{
		clientv3.OpGet(s.k.limit(limit), opt()...),
		clientv3.OpGet(s.k.records(limit), opt(clientv3.WithPrefix(), byFence)...),
		clientv3.OpGet(s.k.tickets(limit), opt(clientv3.WithPrefix(), clientv3.WithKeysOnly())...),
		clientv3.OpGet(s.k.slots(limit), opt(clientv3.WithPrefix())...),
		clientv3.OpGet(s.k.dayLease(), opt()...),
	}
	if id != "" {
		ops = append(ops, clientv3.OpGet(s.k.id(id), opt()...))
	}
	return ops
}

// parseState decodes the answers to readOps.
func (s *Store) parseState(limit string, rev int64, rs []*clientv3.GetResponse, withID bool) (*lstate, error) {
	st := &lstate{name: limit, rev: rev, slots: map[int]*mvccpb.KeyValue{}}
	if kvs := rs[0].Kvs; len(kvs) > 0 {
		var l limitRec
		if err := decode("limit "+limit, kvs[0].Value, &l); err != nil {
			return nil, err
		}
		st.lim, st.limKV = &l, kvs[0]
	}
	live := map[string]*mvccpb.KeyValue{}
	for _, kv := range rs[2].Kvs {
		live[last(kv.Key)] = kv
	}
	for _, kv := range rs[1].Kvs {
		var r rec
		if err := decode("ticket record "+string(kv.Key), kv.Value, &r); err != nil {
			return nil, err
		}
		e := &entry{r: r, fence: kv.CreateRevision, rkv: kv, tkv: live[r.ID]}
		if e.tkv != nil && e.tkv.CreateRevision != e.fence {
			return nil, fmt.Errorf("%w: ticket %s: key created at revision %d, its record at %d", store.ErrCorrupt, r.ID, e.tkv.CreateRevision, e.fence)
		}
		st.entries = append(st.entries, e)
	}
	sort.SliceStable(st.entries, func(i, j int) bool { return st.entries[i].fence < st.entries[j].fence })
	for _, kv := range rs[3].Kvs {
		i, err := strconv.Atoi(last(kv.Key))
		if err != nil {
			return nil, fmt.Errorf("%w: slot key %s", store.ErrCorrupt, kv.Key)
		}
		st.slots[i] = kv
	}
	if kvs := rs[4].Kvs; len(kvs) > 0 {
		st.dayKV = kvs[0]
	}
	if withID && len(rs) > 5 && len(rs[5].Kvs) > 0 {
		st.idKV = rs[5].Kvs[0]
	}
	return st, nil
}

// getResponses turns a transaction's answers into range answers.
func getResponses(rs []*pb.ResponseOp) []*clientv3.GetResponse {
	out := make([]*clientv3.GetResponse, len(rs))
	for i, r := range rs {
		out[i] = (*clientv3.GetResponse)(r.GetResponseRange())
	}
	return out
}

// read reads a limit's state (and id's key) in one round trip.
func (s *Store) read(ctx context.Context, limit, id string, serializable bool) (*lstate, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Txn(cctx).Then(s.readOps(limit, id, serializable)...).Commit()
	if err != nil {
		return nil, s.unavailable(err, false)
	}
	s.answered()
	return s.parseState(limit, resp.Header.Revision, getResponses(resp.Responses), id != "")
}

// lookup finds where a ticket is: from what this handle knows, else from P/ids/<id>.
// ok is false when the id is not live (never seen, or tombstoned: idr says why).
func (s *Store) lookup(ctx context.Context, id string) (limit string, idr *idRec, err error) {
	s.mu.Lock()
	k, ok := s.known[id]
	s.mu.Unlock()
	if ok {
		return k.limit, nil, nil
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Get(cctx, s.k.id(id))
	if err != nil {
		return "", nil, s.unavailable(err, false)
	}
	s.answered()
	if len(resp.Kvs) == 0 {
		return "", nil, nil
	}
	var r idRec
	if err := decode("ticket id "+id, resp.Kvs[0].Value, &r); err != nil {
		return "", nil, err
	}
	if r.Removed != "" {
		return "", &r, nil
	}
	return r.Limit, nil, nil
}

// remember notes what this handle learned of a live ticket; rev is the
// revision its ticket key was last written at (0: unknown).
func (s *Store) remember(e *entry, rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known[e.r.ID] = known{limit: e.r.Limit, lease: e.r.Lease, fence: e.fence, rev: rev, r: e.r}
}

// promoted notes a watch event showing a known ticket promoted: kv is its
// ticket key as of then. It reports whether kv was news (the ticket's own,
// newer than what this handle knew, held).
func (s *Store) promoted(id string, kv *mvccpb.KeyValue) bool {
	var r rec
	if decode("ticket "+id, kv.Value, &r) != nil || r.State != store.Held {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.known[id]
	if !ok || k.fence != kv.CreateRevision || kv.ModRevision <= k.rev {
		return false
	}
	k.rev, k.r, k.promoted = kv.ModRevision, r, true
	s.known[id] = k
	return true
}

func (s *Store) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.known, id)
}

// notFound is the error for an id that is not live.
func notFound(id string, idr *idRec) error {
	if idr != nil && idr.Removed != "" {
		return fmt.Errorf("%w: ticket %s was %s", store.ErrNotFound, id, idr.Removed)
	}
	return fmt.Errorf("%w: ticket %s", store.ErrNotFound, id)
}

// --- views ---

// remaining estimates a live lease's remaining time: what this process
// knows from its own grants and keep-alives (precise), else the server's
// answer (whole seconds, rounded down, plus half a second). A live ticket is
// never shown expired: expiry is the server's, and it has not expired it.
func (s *Store) remaining(ctx context.Context, lease int64) time.Duration {
	if d, ok := s.leases.remaining(lease); ok {
		return max(d, time.Millisecond)
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.TimeToLive(cctx, clientv3.LeaseID(lease))
	if err != nil || resp.TTL < 0 {
		return time.Millisecond // unknown; live by its key
	}
	return time.Duration(resp.TTL)*time.Second + 500*time.Millisecond
}

// remainingAll estimates the leases of many live entries at once.
func (s *Store) remainingAll(ctx context.Context, es []*entry) map[int64]time.Duration {
	out := map[int64]time.Duration{}
	var ask []int64
	for _, e := range es {
		if !e.live() {
			continue
		}
		if d, ok := s.leases.remaining(e.r.Lease); ok {
			out[e.r.Lease] = max(d, time.Millisecond)
		} else {
			ask = append(ask, e.r.Lease)
		}
	}
	if len(ask) == 0 {
		return out
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for _, l := range ask {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			d := s.remaining(ctx, l)
			mu.Lock()
			out[l] = d
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// view turns an entry into the caller's Ticket.
func (s *Store) view(e *entry, position int, remaining time.Duration) store.Ticket {
	t := store.Ticket{ID: e.r.ID, Limit: e.r.Limit, State: e.r.State, Fence: uint64(e.fence), Slot: e.r.Slot,
		TTL: e.r.TTL, Holder: e.r.Holder, Created: e.r.Created, Admitted: e.r.Admitted}
	if t.State != store.Held {
		t.State, t.Slot, t.Position = store.Waiting, -1, position
	}
	if e.live() {
		t.Remaining = remaining
	}
	return t
}

// positions numbers the waiting entries 1, 2, ... in queue order (expired
// ones too, as a snapshot lists them).
func positions(es []*entry) map[*entry]int {
	out := map[*entry]int{}
	n := 0
	for _, e := range es {
		if e.r.State != store.Held {
			n++
			out[e] = n
		}
	}
	return out
}

// viewOf is the Ticket of id in st.
func (s *Store) viewOf(ctx context.Context, st *lstate, id string) (store.Ticket, bool) {
	e, _ := st.find(id)
	if e == nil {
		return store.Ticket{}, false
	}
	var rem time.Duration
	if e.live() {
		rem = s.remaining(ctx, e.r.Lease)
	}
	return s.view(e, positions(st.entries)[e], rem), true
}

// limitName extracts <limit> from P/<kind>/<limit>/<rest>.
func (s *Store) limitName(key []byte, kind string) (string, bool) {
	rest, ok := strings.CutPrefix(string(key), string(s.k)+kind)
	if !ok {
		return "", false
	}
	name, _, ok := strings.Cut(rest, "/")
	return name, ok
}
