package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/slotctl/slotctl/store"
)

// Counters (docs/leases.md §2.8): P/counts/<limit> holds the
// limit's store.Counts, without a lease (like its limit key). Every plan
// that logs an event of the limit reads the key with the limit's state (at
// the plan's revision), adds the event (plan.count) and writes it back in
// the plan's own transaction, compared by mod revision: two writers never
// both add to one reading, and a plan committed in parts (a supersede or a
// limit rm too big for one transaction) carries in each part the counts of
// that part's events. Removing the limit deletes the key.
//
// A step that reads no limit (a waiter behind another waiter leaving,
// releaseWaiting in light.go) cannot add to that key without making every
// such step of the limit conflict with every other (a mass cancel of 1,000
// waiters would retry ~N² times): it writes its event's count in a key of
// its own instead, P/countd/<limit>/<ticket>.<kind> (created, never
// changed), in its own transaction. Counts adds those deltas to the key;
// the next plan that counts in the limit folds up to maxFold of them into
// it, deleting them in the same transaction (its compare on the counts key
// fails if another plan folded them first), so each is counted once.

func (k keys) countsPrefix() string       { return string(k) + "counts/" }
func (k keys) counts(limit string) string { return k.countsPrefix() + limit }

func (k keys) deltasPrefix() string            { return string(k) + "countd/" }
func (k keys) countDeltas(limit string) string { return k.deltasPrefix() + limit + "/" }
func (k keys) countDelta(limit, id, kind string) string {
	return k.countDeltas(limit) + id + "." + kind
}

// maxFold is how many deltas a plan reads and folds per limit.
const maxFold = 16

// A delta is the count of one event that a light step logged: what
// store.Counts.Add reads of it.
type delta struct {
	key    string
	Kind   string        `json:"kind"`
	Waited time.Duration `json:"waited,omitempty"`
	Held   time.Duration `json:"held,omitempty"`
}

type deltaRec struct {
	V int `json:"v"`
	delta
}

func (d delta) event() store.Event { return store.Event{Kind: d.Kind, Waited: d.Waited, Held: d.Held} }

// decodeDelta decodes and checks one delta key of limit.
func decodeDelta(limit string, kv *mvccpb.KeyValue) (delta, error) {
	var r deltaRec
	if err := decode("count of limit "+limit, kv.Value, &r); err != nil {
		return delta{}, err
	}
	switch r.Kind {
	case string(store.Released), string(store.Cancelled), string(store.Busy), string(store.Lost), string(store.ForceReleased):
	default:
		return delta{}, fmt.Errorf("%w: count %s of limit %s: kind %q", store.ErrCorrupt, kv.Key, limit, r.Kind)
	}
	if r.V != formatVersion || r.Waited < 0 || r.Held < 0 {
		return delta{}, fmt.Errorf("%w: count %s of limit %s: version %d, waited %v, held %v", store.ErrCorrupt, kv.Key, limit, r.V, r.Waited, r.Held)
	}
	r.key = string(kv.Key)
	return r.delta, nil
}

// addDeltas decodes the deltas of a limit as read into ls.
func addDeltas(ls *limState, kvs []*mvccpb.KeyValue) error {
	for _, kv := range kvs {
		d, err := decodeDelta(ls.name, kv)
		if err != nil {
			return err
		}
		ls.deltas = append(ls.deltas, d)
	}
	return nil
}

// countDelta counts the event of a light plan in a key of its own.
func (p *plan) countDelta(e store.Event) {
	key := p.s.k.countDelta(e.Limit, e.Ticket, e.Kind)
	p.cmp(clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
	p.put(key, writeOp{val: encode(deltaRec{V: formatVersion, delta: delta{Kind: e.Kind, Waited: e.Waited, Held: e.Held}})})
}

// countsRec is the value of P/counts/<limit>; version 2 only (the previous
// release kept no counts).
type countsRec struct {
	V int `json:"v"`
	store.Counts
}

// decodeCounts decodes and checks a limit's counts: what Add could have
// made (store.Counts.Check, one wait per admission), of this limit.
func decodeCounts(limit string, b []byte) (store.Counts, error) {
	var r countsRec
	if err := decode("counts of limit "+limit, b, &r); err != nil {
		return store.Counts{}, err
	}
	bad := func(format string, a ...any) (store.Counts, error) {
		return store.Counts{}, fmt.Errorf("%w: counts of limit %s: %s", store.ErrCorrupt, limit, fmt.Sprintf(format, a...))
	}
	switch {
	case r.V != formatVersion:
		return bad("record version %d: counts are version %d", r.V, formatVersion)
	case r.Limit != limit:
		return bad("they name limit %q", r.Limit)
	case r.Wait.Count != r.Admitted:
		return bad("%d waits observed for %d admissions", r.Wait.Count, r.Admitted)
	}
	if err := r.Counts.Check(); err != nil {
		return bad("%v", strings.TrimPrefix(err.Error(), store.ErrCorrupt.Error()+": "))
	}
	return r.Counts, nil
}

// addCounts decodes a limit's counts key as read into ls (absent: zero).
// Counts found without their limit are not decoded (limState.cntKV only): a
// plan that makes the limit counts from zero over them.
func addCounts(ls *limState, kvs []*mvccpb.KeyValue) error {
	ls.counts = store.Counts{Limit: ls.name}
	if len(kvs) == 0 {
		return nil
	}
	c, err := decodeCounts(ls.name, kvs[0].Value)
	if err != nil {
		return err
	}
	ls.cntKV, ls.counts = kvs[0], c
	return nil
}

// countRoom is the room the counts of names take in the plan beyond what
// it holds already: a write and a compare per limit not counted in yet.
func (p *plan) countRoom(names []string) int {
	n := 0
	for _, name := range names {
		if p.counted[name] == nil {
			n++
			if ls := p.st.lims[name]; ls != nil {
				n += len(ls.deltas) // folded: deleted
			}
		}
	}
	return n
}

// count adds one event to its limit's counts in this plan: the first time,
// compared on the counts key as read; the key written with the plan. An
// event of a limit that does not exist (any more) counts nowhere. Every
// plan reads the limits of the events it logs (its tickets' closure;
// releaseAbsent reads them for its "lost"), so a limit not read is one
// that does not exist.
func (p *plan) count(e store.Event) {
	if p.light {
		p.countDelta(e)
		return
	}
	ls := p.st.lims[e.Limit]
	if ls == nil || ls.lim == nil {
		return
	}
	c := p.counted[e.Limit]
	if c == nil {
		key := p.s.k.counts(e.Limit)
		if ls.cntKV == nil {
			p.cmp(clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
		} else {
			p.cmp(clientv3.Compare(clientv3.ModRevision(key), "=", ls.cntKV.ModRevision))
		}
		v := ls.counts
		v.Limit = e.Limit
		v.Wait.Buckets, v.Hold.Buckets = slices.Clone(v.Wait.Buckets), slices.Clone(v.Hold.Buckets)
		for _, d := range ls.deltas {
			v.Add(d.event())
			p.del(d.key)
		}
		c = &v
		if p.counted == nil {
			p.counted = map[string]*store.Counts{}
		}
		p.counted[e.Limit] = c
	}
	c.Add(e)
	p.put(p.s.k.counts(e.Limit), writeOp{val: encode(countsRec{V: formatVersion, Counts: *c})})
}

// dropCounts deletes a limit's counts key with the limit: over any write
// of it this plan made (its last tickets' force-released events).
func (p *plan) dropCounts(limit string) {
	key := p.s.k.counts(limit)
	if _, ok := p.w[key]; !ok {
		p.keys = append(p.keys, key)
	}
	p.w[key] = writeOp{del: true}
	delete(p.counted, limit)
	if key := p.s.k.countDeltas(limit); !p.hasWrite(key) {
		p.keys = append(p.keys, key)
		p.w[key] = writeOp{del: true, all: true}
	}
}

func (p *plan) hasWrite(key string) bool { _, ok := p.w[key]; return ok }

// newCounts starts the counts of a limit the plan makes from zero: counts
// a limit left behind (written by hand: a limit's removal deletes them)
// are deleted, on the revision read.
func (p *plan) newCounts(limit string) {
	if ls := p.st.lims[limit]; ls != nil && (ls.cntKV != nil || len(ls.deltas) > 0) {
		if ls.cntKV != nil {
			p.cmp(clientv3.Compare(clientv3.ModRevision(p.s.k.counts(limit)), "=", ls.cntKV.ModRevision))
		}
		p.dropCounts(limit)
	}
}

// counts is Counts: the limits and their counts read at one revision.
func (s *Store) counts(ctx context.Context, limits []string) ([]store.Counts, error) {
	if s.closed.Load() {
		return nil, s.errClosed()
	}
	for _, n := range limits {
		if err := store.CheckLimitName(n); err != nil {
			return nil, err
		}
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.c.Txn(cctx).Then(
		clientv3.OpGet(s.k.limits(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(s.k.countsPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(s.k.deltasPrefix(), clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, s.unavailable(err, false)
	}
	s.answered()
	rs := getResponses(resp.Responses)
	var have []string
	for _, kv := range rs[0].Kvs {
		n := strings.TrimPrefix(string(kv.Key), s.k.limits())
		if !store.ValidLimitName(n) {
			return nil, fmt.Errorf("%w: limit key %s", store.ErrCorrupt, kv.Key)
		}
		have = append(have, n)
	}
	kvOf := map[string]*mvccpb.KeyValue{}
	for _, kv := range rs[1].Kvs {
		kvOf[strings.TrimPrefix(string(kv.Key), s.k.countsPrefix())] = kv
	}
	deltas := map[string][]*mvccpb.KeyValue{}
	for _, kv := range rs[2].Kvs {
		n, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), s.k.deltasPrefix()), "/")
		if !ok || !store.ValidLimitName(n) {
			return nil, fmt.Errorf("%w: count key %s", store.ErrCorrupt, kv.Key)
		}
		deltas[n] = append(deltas[n], kv)
	}
	names := slices.Clone(limits)
	if len(names) == 0 {
		names = have
	}
	slices.Sort(names)
	names = slices.Compact(names)
	out := make([]store.Counts, 0, len(names))
	for _, n := range names {
		if !slices.Contains(have, n) {
			return nil, fmt.Errorf("%w: %q", store.ErrLimitNotFound, n)
		}
		c := store.Counts{Limit: n}
		if kv := kvOf[n]; kv != nil {
			if c, err = decodeCounts(n, kv.Value); err != nil {
				return nil, err
			}
		}
		for _, kv := range deltas[n] {
			d, err := decodeDelta(n, kv)
			if err != nil {
				return nil, err
			}
			c.Add(d.event())
		}
		out = append(out, c)
	}
	return out, nil
}
