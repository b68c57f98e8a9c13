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
	"github.com/jackc/pgx/v5/pgconn"

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
	b   *backend
	ctx context.Context
	tx  pgx.Tx
	rw  bool // a writing step (Update)
	// shared: a step beside other shared steps (UpdateShared), which may
	// write a ticket and nothing else.
	shared bool
	now    policy.Instant
	err    error // a failure where the interface has no error to return

	rings  []string
	writes []write // queued: sent with the next read, or at the end
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
	if !t.rw {
		return fmt.Errorf("pgstore: a write in a read-only step")
	}
	if t.shared {
		return fmt.Errorf("pgstore: a write other than a ticket's in a shared step")
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

// A write is a statement queued until the step's next read or its end,
// and sent with it in one round trip: a step holds the store's lock for
// as few round trips as its reads need.
type write struct {
	sql  string
	args []any
	row  func(pgx.Row) error           // reads what the statement returns, or nil
	tag  func(pgconn.CommandTag) error // checks what it did, or nil
}

// write queues a statement.
func (t *ptx) write(w write) { t.writes = append(t.writes, w) }

// stepError is an error of the step's own (a check that failed), not of
// the server's: it passes through as it is.
type stepError struct{ err error }

func (e stepError) Error() string { return e.err.Error() }

// batch sends the queued writes and then read (nil for none) in one round
// trip, each in order.
func (t *ptx) batch(read func(b *pgx.Batch)) error {
	b := &pgx.Batch{}
	for _, w := range t.writes {
		q := b.Queue(w.sql, w.args...)
		switch {
		case w.row != nil:
			q.QueryRow(func(r pgx.Row) error { return wrap(w.row(r)) })
		case w.tag != nil:
			q.Exec(func(ct pgconn.CommandTag) error { return wrap(w.tag(ct)) })
		}
	}
	t.writes = t.writes[:0]
	if read != nil {
		read(b)
	}
	if b.Len() == 0 {
		return nil
	}
	err := t.tx.SendBatch(t.ctx, b).Close()
	var se stepError
	if errors.As(err, &se) {
		return se.err
	}
	if err != nil {
		return t.fail(err)
	}
	return nil
}

func wrap(err error) error {
	if err != nil {
		return stepError{err}
	}
	return nil
}

// query runs a read after the queued writes; fn reads its rows.
func (t *ptx) query(fn func(pgx.Rows) error, sql string, args ...any) error {
	return t.batch(func(b *pgx.Batch) {
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error { return wrap(fn(rows)) })
	})
}

// queryRow runs a read of one row after the queued writes: found is false
// when there is none.
func (t *ptx) queryRow(sql string, args []any, dest ...any) (found bool, err error) {
	err = t.batch(func(b *pgx.Batch) {
		b.Queue(sql, args...).QueryRow(func(r pgx.Row) error {
			err := r.Scan(dest...)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			found = err == nil
			return err
		})
	})
	return found, err
}

func (t *ptx) LimitNames() ([]string, error) {
	var names []string
	err := t.query(func(rows pgx.Rows) error {
		var err error
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}, `SELECT name FROM slotctl_limits ORDER BY name`)
	if err != nil {
		return nil, err
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
	found, err := t.queryRow(`SELECT rec FROM slotctl_limits WHERE name = $1`, []any{name}, &raw)
	if err != nil {
		return policy.LimitRec{}, false, err
	}
	if !found {
		t.cacheLimit(name, nil)
		return policy.LimitRec{}, false, nil
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
	t.write(write{sql: `INSERT INTO slotctl_limits (name, rec) VALUES ($1, $2::jsonb)
		ON CONFLICT (name) DO UPDATE SET rec = EXCLUDED.rec`, args: []any{name, encode(l)}})
	t.cacheLimit(name, &l)
	return nil
}

func (t *ptx) DeleteLimit(name string) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	t.write(write{sql: `DELETE FROM slotctl_limits WHERE name = $1`, args: []any{name}})
	t.write(write{sql: `DELETE FROM slotctl_counts WHERE name = $1`, args: []any{name}})
	t.cacheLimit(name, nil)
	delete(t.counts, name)
	delete(t.dirty, name)
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
	var out []policy.Rec
	err := t.query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				fence  int64
				id     string
				limits []string
				raw    []byte
			)
			if err := rows.Scan(&fence, &id, &limits, &raw); err != nil {
				return err
			}
			r, err := ticket(fence, id, limits, raw)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	}, `SELECT fence, id, limits, rec FROM slotctl_tickets WHERE limits @> ARRAY[$1::text] ORDER BY fence`, limit)
	return out, err
}

func (t *ptx) Lookup(id string) (policy.Rec, bool, error) {
	var (
		fence  int64
		limits []string
		raw    []byte
	)
	found, err := t.queryRow(`SELECT fence, limits, rec FROM slotctl_tickets WHERE id = $1`, []any{id}, &fence, &limits, &raw)
	if err != nil || !found {
		return policy.Rec{}, false, err
	}
	r, err := ticket(fence, id, limits, raw)
	return r, err == nil, err
}

func (t *ptx) Put(r policy.Rec) error {
	if !t.rw {
		return fmt.Errorf("pgstore: a write in a read-only step")
	}
	t.write(write{sql: `INSERT INTO slotctl_tickets (fence, id, limits, rec) VALUES ($1, $2, $3, $4::jsonb)
		ON CONFLICT (fence) DO UPDATE SET rec = EXCLUDED.rec, limits = EXCLUDED.limits`,
		args: []any{int64(r.Fence), r.ID, r.Names(), encode(r)}})
	return nil
}

func (t *ptx) Delete(r policy.Rec) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	t.write(write{sql: `DELETE FROM slotctl_tickets WHERE fence = $1 AND id = $2`, args: []any{int64(r.Fence), r.ID},
		tag: func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("%w: removing ticket %s (fence %d) that is not stored", store.ErrCorrupt, r.ID, r.Fence)
			}
			return nil
		}})
	return nil
}

func (t *ptx) NextFence() (uint64, error) {
	if err := t.readOnly(); err != nil {
		return 0, err
	}
	var n int64
	if _, err := t.queryRow(`SELECT nextval('slotctl_fence')`, nil, &n); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

func (t *ptx) Tomb(id string) (policy.Tomb, bool, error) {
	var raw []byte
	found, err := t.queryRow(`SELECT rec FROM slotctl_tombs WHERE id = $1`, []any{id}, &raw)
	if err != nil || !found {
		return policy.Tomb{}, false, err
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
	t.write(write{sql: `INSERT INTO slotctl_tombs (id, at, rec) VALUES ($1, $2, $3::jsonb)
		ON CONFLICT (id) DO UPDATE SET rec = EXCLUDED.rec, at = EXCLUDED.at RETURNING seq`, args: []any{id, tb.Wall, encode(tb)},
		row: func(r pgx.Row) error {
			var seq int64
			err := r.Scan(&seq)
			t.pruneTombs = t.pruneTombs || seq%pruneEvery == 0
			return err
		}})
	return nil
}

func (t *ptx) Log(e store.Event) error {
	if err := t.readOnly(); err != nil {
		return err
	}
	// The record carries the row's sequence number.
	t.write(write{sql: `WITH s AS (SELECT nextval(pg_get_serial_sequence('slotctl_events', 'seq')) AS n)
		INSERT INTO slotctl_events (seq, name, rec) SELECT n, $1, jsonb_set($2::jsonb, '{seq}', to_jsonb(n)) FROM s RETURNING seq`,
		args: []any{e.Limit, encode(e)},
		row: func(r pgx.Row) error {
			var seq int64
			err := r.Scan(&seq)
			t.pruneEvents = t.pruneEvents || seq%pruneEvery == 0
			return err
		}})
	return nil
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
	found, err := t.queryRow(`SELECT rec FROM slotctl_counts WHERE name = $1`, []any{limit}, &raw)
	if err != nil {
		return store.Counts{}, err
	}
	if !found {
		return store.Counts{Limit: limit}, nil
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
		t.write(write{sql: `INSERT INTO slotctl_counts (name, rec) VALUES ($1, $2::jsonb)
			ON CONFLICT (name) DO UPDATE SET rec = EXCLUDED.rec`, args: []any{c.Limit, encode(c)}})
	}
	if len(t.rings) > 0 {
		slices.Sort(t.rings)
		ids := slices.Compact(t.rings)
		t.write(write{sql: `SELECT pg_notify($1, id) FROM unnest($2::text[]) AS id`, args: []any{channel, ids}})
	}
	// The writes so far may trim a log (their RETURNING says): trims go in
	// a second batch only then, every pruneEvery entries.
	if err := t.batch(nil); err != nil {
		return err
	}
	if t.pruneEvents {
		t.write(write{sql: `DELETE FROM slotctl_events WHERE seq <= (SELECT max(seq) FROM slotctl_events) - $1`, args: []any{store.MaxEvents}})
	}
	if t.pruneTombs {
		t.write(write{sql: `DELETE FROM slotctl_tombs WHERE at < $1 OR seq <= (SELECT max(seq) FROM slotctl_tombs) - $2`,
			args: []any{t.now.Wall.Add(-tombstoneAge), maxTombstones}})
	}
	return t.batch(nil)
}
