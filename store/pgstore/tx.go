package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// Retention of the bounded logs.
const (
	maxTombstones = 100000
	tombstoneAge  = 24 * time.Hour
)

// ptx is one step: a transaction, the clock reading taken in it, and the
// tickets to wake once it commits.
type ptx struct {
	b     *backend
	ctx   context.Context
	tx    pgx.Tx
	write bool
	now   policy.Instant
	err   error // a failure where the interface has no error to return

	rings []string
	// prune: a log passed a multiple of pruneEvery, so the step trims it.
	pruneEvents, pruneTombs bool
	// limits and counts read or written in this step (nil: absent).
	limits map[string]*policy.LimitRec
	counts map[string]store.Counts
	dirty  map[string]bool // counts to write at the end
}

// pruneEvery is how often (in log entries) a step trims a log to its bound.
const pruneEvery = 64

var _ policy.Tx = (*ptx)(nil)

func (t *ptx) Now() policy.Instant           { return t.now }
func (t *ptx) PreviousBoot(boot string) bool { return false } // one clock: the server's

// fail is the error of a failed statement.
func (t *ptx) fail(err error) error { return t.b.unavailable(err) }

func (t *ptx) readOnly() error {
	if !t.write {
		return fmt.Errorf("pgstore: a write in a read-only step")
	}
	return nil
}

// corrupt is the error of a row nobody running slotctl could have written.
func corrupt(what string, err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, store.ErrInvalid.Error()+": ")
	return fmt.Errorf("%w: %s: %s", store.ErrCorrupt, what, msg)
}

// decode reads one stored JSON value, refusing one too large to be ours.
func decode(raw []byte, v any, what string) error {
	if err := store.CheckRecordSize(len(raw)); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return corrupt(what, fmt.Errorf("undecodable record: %v", err))
	}
	return nil
}

func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are encoded
	}
	return string(b)
}

func (t *ptx) LimitNames() ([]string, error) {
	rows, err := t.tx.Query(t.ctx, `SELECT name FROM slotctl_limits ORDER BY name`)
	if err != nil {
		return nil, t.fail(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, t.fail(err)
	}
	for _, n := range names {
		if !store.ValidLimitName(n) {
			return nil, fmt.Errorf("%w: limit named %q", store.ErrCorrupt, n)
		}
	}
	slices.Sort(names) // by bytes, whatever the database's collation
	return names, nil
}

func (t *ptx) Limit(name string) (policy.LimitRec, bool, error) {
	if l, ok := t.limits[name]; ok {
		if l == nil {
			return policy.LimitRec{}, false, nil
		}
		return *l, true, nil
	}
	var raw []byte
	err := t.tx.QueryRow(t.ctx, `SELECT rec FROM slotctl_limits WHERE name = $1`, name).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		t.cacheLimit(name, nil)
		return policy.LimitRec{}, false, nil
	}
	if err != nil {
		return policy.LimitRec{}, false, t.fail(err)
	}
	var l policy.LimitRec
	what := fmt.Sprintf("limit %q", name)
	if err := decode(raw, &l, what); err != nil {
		return l, false, err
	}
	if err := l.Check(); err != nil {
		return l, false, corrupt(what, err)
	}
	t.cacheLimit(name, &l)
	return l, true, nil
}

// cacheLimit remembers what this step read or wrote of a limit: the lock
// row keeps every other step from changing it meanwhile.
func (t *ptx) cacheLimit(name string, l *policy.LimitRec) {
	if t.limits == nil {
		t.limits = map[string]*policy.LimitRec{}
	}
	t.limits[name] = l
}

func (t *ptx) PutLimit(name string, l policy.LimitRec) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	_, err := t.tx.Exec(t.ctx, `INSERT INTO slotctl_limits (name, rec) VALUES ($1, $2::jsonb)
		ON CONFLICT (name) DO UPDATE SET rec = EXCLUDED.rec`, name, encode(l))
	t.cacheLimit(name, &l)
	return t.failed(err)
}

func (t *ptx) DeleteLimit(name string) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	if _, err := t.tx.Exec(t.ctx, `DELETE FROM slotctl_limits WHERE name = $1`, name); err != nil {
		return t.fail(err)
	}
	t.cacheLimit(name, nil)
	delete(t.counts, name)
	delete(t.dirty, name)
	_, err := t.tx.Exec(t.ctx, `DELETE FROM slotctl_counts WHERE name = $1`, name)
	return t.failed(err)
}

func (t *ptx) failed(err error) error {
	if err != nil {
		return t.fail(err)
	}
	return nil
}

// ticket reads one row of slotctl_tickets and checks that its columns and
// its record agree.
func ticket(fence int64, id string, limits []string, raw []byte) (policy.Rec, error) {
	what := fmt.Sprintf("ticket %q", id)
	var r policy.Rec
	if err := decode(raw, &r, what); err != nil {
		return r, err
	}
	if err := r.Check(); err != nil {
		return r, corrupt(what, err)
	}
	if r.ID != id || int64(r.Fence) != fence || !slices.Equal(r.Names(), limits) {
		return r, fmt.Errorf("%w: ticket row %q (fence %d, limits %q) holds ticket %q (fence %d, limits %q)",
			store.ErrCorrupt, id, fence, limits, r.ID, r.Fence, r.Names())
	}
	return r, nil
}

func (t *ptx) Queue(limit string) ([]policy.Rec, error) {
	rows, err := t.tx.Query(t.ctx, `SELECT fence, id, limits, rec FROM slotctl_tickets WHERE limits @> ARRAY[$1::text] ORDER BY fence`, limit)
	if err != nil {
		return nil, t.fail(err)
	}
	defer rows.Close()
	var out []policy.Rec
	for rows.Next() {
		var (
			fence  int64
			id     string
			limits []string
			raw    []byte
		)
		if err := rows.Scan(&fence, &id, &limits, &raw); err != nil {
			return nil, t.fail(err)
		}
		r, err := ticket(fence, id, limits, raw)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, t.fail(err)
	}
	return out, nil
}

func (t *ptx) Lookup(id string) (policy.Rec, bool, error) {
	var (
		fence  int64
		limits []string
		raw    []byte
	)
	err := t.tx.QueryRow(t.ctx, `SELECT fence, limits, rec FROM slotctl_tickets WHERE id = $1`, id).Scan(&fence, &limits, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return policy.Rec{}, false, nil
	}
	if err != nil {
		return policy.Rec{}, false, t.fail(err)
	}
	r, err := ticket(fence, id, limits, raw)
	return r, err == nil, err
}

func (t *ptx) Put(r policy.Rec) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	_, err := t.tx.Exec(t.ctx, `INSERT INTO slotctl_tickets (fence, id, limits, rec) VALUES ($1, $2, $3, $4::jsonb)
		ON CONFLICT (fence) DO UPDATE SET rec = EXCLUDED.rec, limits = EXCLUDED.limits`,
		int64(r.Fence), r.ID, r.Names(), encode(r))
	return t.failed(err)
}

func (t *ptx) Delete(r policy.Rec) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	tag, err := t.tx.Exec(t.ctx, `DELETE FROM slotctl_tickets WHERE fence = $1 AND id = $2`, int64(r.Fence), r.ID)
	if err != nil {
		return t.fail(err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("%w: removing ticket %s (fence %d) that is not stored", store.ErrCorrupt, r.ID, r.Fence)
	}
	return nil
}

func (t *ptx) NextFence() (uint64, error) {
	if err := t.readOnly(); err != nil {
		return 0, err
	}
	var n int64
	if err := t.tx.QueryRow(t.ctx, `SELECT nextval('slotctl_fence')`).Scan(&n); err != nil {
		return 0, t.fail(err)
	}
	return uint64(n), nil
}

func (t *ptx) Tomb(id string) (policy.Tomb, bool, error) {
	var raw []byte
	err := t.tx.QueryRow(t.ctx, `SELECT rec FROM slotctl_tombs WHERE id = $1`, id).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return policy.Tomb{}, false, nil
	}
	if err != nil {
		return policy.Tomb{}, false, t.fail(err)
	}
	var tb policy.Tomb
	what := fmt.Sprintf("tombstone %q", id)
	if err := decode(raw, &tb, what); err != nil {
		return tb, false, err
	}
	if err := tb.Check(); err != nil {
		return tb, false, corrupt(what, err)
	}
	return tb, true, nil
}

func (t *ptx) PutTomb(id string, tb policy.Tomb) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	var seq int64
	err := t.tx.QueryRow(t.ctx, `INSERT INTO slotctl_tombs (id, at, rec) VALUES ($1, $2, $3::jsonb)
		ON CONFLICT (id) DO UPDATE SET rec = EXCLUDED.rec, at = EXCLUDED.at RETURNING seq`, id, tb.Wall, encode(tb)).Scan(&seq)
	t.pruneTombs = t.pruneTombs || seq%pruneEvery == 0
	return t.failed(err)
}

func (t *ptx) Log(e store.Event) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	// The record carries the row's sequence number.
	var seq int64
	err := t.tx.QueryRow(t.ctx, `WITH s AS (SELECT nextval(pg_get_serial_sequence('slotctl_events', 'seq')) AS n)
		INSERT INTO slotctl_events (seq, name, rec) SELECT n, $1, jsonb_set($2::jsonb, '{seq}', to_jsonb(n)) FROM s RETURNING seq`,
		e.Limit, encode(e)).Scan(&seq)
	t.pruneEvents = t.pruneEvents || seq%pruneEvery == 0
	return t.failed(err)
}

func (t *ptx) Counts(limit string) (store.Counts, error) {
	if c, ok := t.counts[limit]; ok {
		return c, nil
	}
	c, err := t.readCounts(limit)
	if err == nil {
		t.cacheCounts(c)
	}
	return c, err
}

func (t *ptx) readCounts(limit string) (store.Counts, error) {
	var raw []byte
	err := t.tx.QueryRow(t.ctx, `SELECT rec FROM slotctl_counts WHERE name = $1`, limit).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Counts{Limit: limit}, nil
	}
	if err != nil {
		return store.Counts{}, t.fail(err)
	}
	var c store.Counts
	what := fmt.Sprintf("counts of limit %q", limit)
	if err := decode(raw, &c, what); err != nil {
		return c, err
	}
	if c.Limit != limit {
		return c, fmt.Errorf("%w: counts of limit %q stored under %q", store.ErrCorrupt, c.Limit, limit)
	}
	if err := c.Check(); err != nil {
		return c, corrupt(what, err)
	}
	return c, nil
}

func (t *ptx) cacheCounts(c store.Counts) {
	if t.counts == nil {
		t.counts = map[string]store.Counts{}
	}
	t.counts[c.Limit] = c
}

// PutCounts implements policy.Tx. The counters are written once, when the
// step ends: a step that logs several events of a limit counts each.
func (t *ptx) PutCounts(c store.Counts) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	t.cacheCounts(c)
	if t.dirty == nil {
		t.dirty = map[string]bool{}
	}
	t.dirty[c.Limit] = true
	return nil
}

func (t *ptx) Ring(r policy.Rec) { t.rings = append(t.rings, r.ID) }
func (t *ptx) Gone(r policy.Rec) { t.rings = append(t.rings, r.ID) }

// finish ends a writing step: the wake-ups, delivered by the server only if
// it commits, and the logs pruned to their bounds.
func (t *ptx) finish() error {
	for _, name := range slices.Sorted(maps.Keys(t.dirty)) {
		c := t.counts[name]
		if _, err := t.tx.Exec(t.ctx, `INSERT INTO slotctl_counts (name, rec) VALUES ($1, $2::jsonb)
			ON CONFLICT (name) DO UPDATE SET rec = EXCLUDED.rec`, c.Limit, encode(c)); err != nil {
			return t.fail(err)
		}
	}
	if len(t.rings) > 0 {
		slices.Sort(t.rings)
		ids := slices.Compact(t.rings)
		if _, err := t.tx.Exec(t.ctx, `SELECT pg_notify($1, id) FROM unnest($2::text[]) AS id`, channel, ids); err != nil {
			return t.fail(err)
		}
	}
	if t.pruneEvents {
		if _, err := t.tx.Exec(t.ctx, `DELETE FROM slotctl_events WHERE seq <= (SELECT max(seq) FROM slotctl_events) - $1`, store.MaxEvents); err != nil {
			return t.fail(err)
		}
	}
	if t.pruneTombs {
		if _, err := t.tx.Exec(t.ctx, `DELETE FROM slotctl_tombs WHERE at < $1 OR seq <= (SELECT max(seq) FROM slotctl_tombs) - $2`,
			t.now.Wall.Add(-tombstoneAge), maxTombstones); err != nil {
			return t.fail(err)
		}
	}
	return nil
}
