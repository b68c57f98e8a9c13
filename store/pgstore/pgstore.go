package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// Options configure a store.
type Options struct {
	// Judge proves holders dead (store.Judge); nil leaves them to the TTL.
	Judge store.Judge
	// Timeout bounds the wait for the store's lock (another step holding
	// it); 0 is DefaultTimeout. A step that waits longer fails with a
	// *store.LockTimeoutError. A client paused in the middle of a step
	// loses its transaction after half of it, so that it holds up the
	// others for no longer.
	Timeout time.Duration
	// Mutations is test-only: planted bugs the simulation must catch.
	Mutations mutation.Set
	// Now is test-only: the store's clock reads it instead of the
	// server's (the simulation's own clock).
	Now func() time.Time
	// Skew is test-only: the store's clock reads the server's plus what it
	// returns, so that a test can move time without waiting.
	Skew func() time.Duration
}

// Open connects to the database at url (postgres://USER@HOST/DB?..., in
// libpq's form: PGPASSWORD, .pgpass and sslmode apply) and returns the
// store kept there. It connects lazily: a server that is down fails the
// first operation, not Open.
func Open(ctx context.Context, rawURL string, o Options) (*policy.Store, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: store %s: %v", store.ErrInvalid, redact(rawURL), err)
	}
	// A slotctl process sends each statement a few times at most: one
	// round trip each (parameters typed by their Go types) rather than a
	// prepare first.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.MaxConns = 1 // with the listener, two per process: a handle's steps take turns
	cfg.MinConns = 0
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	idle := max(timeout/2, time.Second)
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(idle.Milliseconds())
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = fmt.Sprint(timeout.Milliseconds())
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: store %s: %v", store.ErrUnavailable, redact(rawURL), err)
	}
	b := &backend{pool: pool, name: redact(rawURL), skew: o.Skew, clock: o.Now, cfg: cfg.ConnConfig, timeout: timeout}
	b.bells.m = map[string]map[*bell]bool{}
	return policy.New(b, policy.Options{Judge: o.Judge, Mutations: o.Mutations}), nil
}

// DefaultTimeout is Options.Timeout's default.
const DefaultTimeout = 10 * time.Second

// redact is the URL without its password: the store's name in messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "postgres://"
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	q := u.Query()
	if q.Has("password") {
		q.Del("password")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// backend is the PostgreSQL step beneath the rules.
type backend struct {
	pool  *pgxpool.Pool
	cfg   *pgx.ConnConfig
	name  string
	skew  func() time.Duration
	clock func() time.Time
	// timeout is the longest a step waits for the lock (lock_timeout).
	timeout time.Duration
	// afterLock is test-only: called once a step holds the lock, it
	// stands for a client paused there.
	afterLock func()
	// beforeListen is test-only: called before the listening connection
	// is made, it stands for a connection slow to come.
	beforeListen func()

	schemaOnce sync.Mutex
	schemaOK   bool

	closeMu sync.RWMutex
	closed  bool

	bells bells
}

var _ policy.Backend = (*backend)(nil)

func (b *backend) String() string { return b.name }

// Close implements policy.Backend.
func (b *backend) Close() error {
	b.closeMu.Lock()
	if b.closed {
		b.closeMu.Unlock()
		return nil
	}
	b.closed = true
	b.closeMu.Unlock()
	b.bells.stop()
	b.pool.Close()
	return nil
}

// open holds off Close while a step runs.
func (b *backend) open() (func(), error) {
	b.closeMu.RLock()
	if b.closed {
		b.closeMu.RUnlock()
		return nil, fmt.Errorf("%w: %s", store.ErrClosed, b.name)
	}
	return b.closeMu.RUnlock, nil
}

// Update implements policy.Backend: one READ COMMITTED transaction that
// first takes the lock row, so every later statement of the step reads what
// the steps before it committed.
func (b *backend) Update(ctx context.Context, fn func(policy.Tx) error) error {
	return b.update(ctx, fn, false)
}

// UpdateShared implements policy.Sharer: the same step with the lock row
// taken FOR SHARE, which excludes every Update (FOR UPDATE) but not other
// shared steps; such a step may write nothing but a ticket.
func (b *backend) UpdateShared(ctx context.Context, fn func(policy.Tx) error) error {
	return b.update(ctx, fn, true)
}

// A step first takes the schema's step lock, a transaction-scoped advisory
// lock, and then the lock row, reading the clock once it holds both; the
// two statements go in one round trip. The lock row alone would let shared
// steps starve an Update: a FOR SHARE request is granted beside the FOR
// SHARE holders even while a FOR UPDATE waits, so a steady stream of
// overlapping renewals would hold an enqueue off for as long as it lasted.
// The server's lock manager queues a request behind any waiting request it
// conflicts with, so behind the step lock a renewal that comes after a
// waiting Update waits for it. The lock row stays: a step that finds it
// missing refuses to write (ErrCorrupt).
const (
	stepLock       = `SELECT pg_advisory_xact_lock(` + stepLockKeys + `)`
	stepLockShared = `SELECT pg_advisory_xact_lock_shared(` + stepLockKeys + `)`
	lockRow        = `SELECT clock_timestamp() FROM (SELECT v FROM slotctl_meta WHERE k = 'lock' FOR UPDATE) AS l`
	lockRowShared  = `SELECT clock_timestamp() FROM (SELECT v FROM slotctl_meta WHERE k = 'lock' FOR SHARE) AS l`
	// stepLockKeys: slotctl's own first key (the two-key space does not
	// meet the one-key space of the schema lock) and the schema's name,
	// so stores in two schemas of one database do not wait for each other.
	stepLockKeys = `1936486260, hashtext(coalesce(current_schema(), ''))`
)

// lockStep takes the step lock and the lock row, shared or not, and reads
// the server's clock.
func (b *backend) lockStep(ctx context.Context, tx pgx.Tx, shared bool) (now time.Time, err error) {
	step, row := stepLock, lockRow
	if shared {
		step, row = stepLockShared, lockRowShared
	}
	batch := &pgx.Batch{}
	batch.Queue(step)
	batch.Queue(row)
	br := tx.SendBatch(ctx, batch)
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&now)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return now, err
}

func (b *backend) update(ctx context.Context, fn func(policy.Tx) error, shared bool) error {
	done, err := b.open()
	if err != nil {
		return err
	}
	defer done()
	if err := b.ensureSchema(ctx); err != nil {
		return err
	}
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return b.unavailable(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	now, err := b.lockStep(ctx, tx, shared)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available: lock_timeout ran out
			return &store.LockTimeoutError{Path: b.name, Waited: b.timeout}
		}
		if errors.Is(err, pgx.ErrNoRows) {
			// Without its lock row no step would exclude another: refuse
			// every write rather than admit two jobs to one slot.
			return fmt.Errorf("%w: %s: the lock row of slotctl_meta is missing", store.ErrCorrupt, b.name)
		}
		return b.unavailable(err)
	}
	if b.afterLock != nil {
		b.afterLock()
	}
	t := b.step(ctx, tx, true, now)
	t.shared = shared
	if err := fn(t); err != nil {
		return err
	}
	if t.err != nil {
		return t.err
	}
	if err := t.finish(); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return b.commitFailed(err)
	}
	return nil
}

// commitFailed is the error of a COMMIT that failed. The server's answer
// says it did not take effect; anything else leaves that unknown. (pgx's
// SafeToRetry cannot tell: a connection cut while the answer is read is
// reported as "conn closed", which it calls safe, though the request was
// sent.)
func (b *backend) commitFailed(err error) error {
	if answered(err) {
		return b.unavailable(err)
	}
	return fmt.Errorf("%w (%w)", b.unavailable(err), store.ErrUnknownOutcome)
}

// answered reports whether err is the server's answer.
func answered(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) || errors.Is(err, pgx.ErrTxCommitRollback)
}

// View implements policy.Backend: one read-only snapshot.
func (b *backend) View(ctx context.Context, fn func(policy.Tx) error) error {
	done, err := b.open()
	if err != nil {
		return err
	}
	defer done()
	if err := b.ensureSchema(ctx); err != nil {
		return err
	}
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return b.unavailable(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	t, err := b.begin(ctx, tx, false)
	if err != nil {
		return err
	}
	if err := fn(t); err != nil {
		return err
	}
	return t.err
}

// begin reads the server's clock for a step that takes no lock.
func (b *backend) begin(ctx context.Context, tx pgx.Tx, write bool) (*ptx, error) {
	var now time.Time
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		return nil, b.unavailable(err)
	}
	return b.step(ctx, tx, write, now), nil
}

// step is a step at the server's clock reading now (or the test's clock).
func (b *backend) step(ctx context.Context, tx pgx.Tx, write bool, now time.Time) *ptx {
	if b.clock != nil {
		now = b.clock()
	}
	if b.skew != nil {
		now = now.Add(b.skew())
	}
	return &ptx{b: b, ctx: ctx, tx: tx, rw: write,
		now: policy.Instant{Boot: serverClock, Mono: time.Duration(now.UnixNano()), Wall: now}}
}

// serverClock is the boot every deadline is on: the server's wall clock.
const serverClock = "postgres"

// unavailable is the error of a failed statement: the server is down,
// unreachable or refused the step (a cancelled context among them).
func (b *backend) unavailable(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Errorf("%w: %s: %s (SQLSTATE %s)", store.ErrUnavailable, b.name, pe.Message, pe.Code)
	}
	return fmt.Errorf("%w: %s: %v", store.ErrUnavailable, b.name, err)
}

// schema creates the tables of a new store. It runs under a
// transaction-scoped advisory lock so that two first steps do not race.
const schema = `
SELECT pg_advisory_xact_lock(7216120611392094515);
CREATE TABLE IF NOT EXISTS slotctl_meta (k text PRIMARY KEY, v bigint NOT NULL);
INSERT INTO slotctl_meta (k, v) VALUES ('lock', 0), ('format', 1) ON CONFLICT (k) DO NOTHING;
CREATE SEQUENCE IF NOT EXISTS slotctl_fence;
CREATE TABLE IF NOT EXISTS slotctl_limits (name text PRIMARY KEY, rec jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS slotctl_counts (name text PRIMARY KEY, rec jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS slotctl_tickets (
	fence bigint PRIMARY KEY,
	id text NOT NULL UNIQUE,
	limits text[] NOT NULL,
	rec jsonb NOT NULL);
CREATE INDEX IF NOT EXISTS slotctl_tickets_limits ON slotctl_tickets USING gin (limits);
CREATE TABLE IF NOT EXISTS slotctl_tombs (
	id text PRIMARY KEY,
	seq bigserial NOT NULL,
	at timestamptz NOT NULL,
	rec jsonb NOT NULL);
CREATE INDEX IF NOT EXISTS slotctl_tombs_seq ON slotctl_tombs (seq);
CREATE TABLE IF NOT EXISTS slotctl_events (
	seq bigserial PRIMARY KEY,
	name text NOT NULL,
	rec jsonb NOT NULL);
CREATE INDEX IF NOT EXISTS slotctl_events_name ON slotctl_events (name, seq);
`

// ensureSchema creates the tables once per handle.
func (b *backend) ensureSchema(ctx context.Context) error {
	b.schemaOnce.Lock()
	defer b.schemaOnce.Unlock()
	if b.schemaOK {
		return nil
	}
	var format int64
	err := b.pool.QueryRow(ctx, `SELECT v FROM slotctl_meta WHERE k = 'format'`).Scan(&format)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table: a new store
		// After a creation whose answer was lost, what it did is read back.
		if err = b.create(ctx); err == nil || !answered(err) {
			err = b.pool.QueryRow(ctx, `SELECT v FROM slotctl_meta WHERE k = 'format'`).Scan(&format)
		}
	}
	if err != nil {
		return b.unavailable(err)
	}
	if format != formatVersion {
		return fmt.Errorf("%w: %s: store format %d: this slotctl reads format %d", store.ErrCorrupt, b.name, format, formatVersion)
	}
	b.schemaOK = true
	return nil
}

const formatVersion = 1

// create makes the tables of a new store.
func (b *backend) create(ctx context.Context) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, schema); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
