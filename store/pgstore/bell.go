package pgstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// channel is the NOTIFY channel a step names each ticket it changed on.
const channel = "slotctl"

// bells are a handle's watches: one listening connection, started by the
// first Watch, that rings the bells of the ids it is told of.
type bells struct {
	mu      sync.Mutex
	m       map[string]map[*bell]bool
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
}

type bell struct {
	c  chan struct{}
	bs *bells
	id string
}

func (b *bell) C() <-chan struct{} { return b.c }

func (b *bell) Close() error {
	b.bs.mu.Lock()
	defer b.bs.mu.Unlock()
	delete(b.bs.m[b.id], b)
	if len(b.bs.m[b.id]) == 0 {
		delete(b.bs.m, b.id)
	}
	return nil
}

func (b *bell) ring() {
	select {
	case b.c <- struct{}{}:
	default:
	}
}

// Watch implements policy.Backend. The listener is up before Watch
// returns, so that no step committed after it is missed.
func (b *backend) Watch(ctx context.Context, id string) (store.Bell, error) {
	done, err := b.open()
	if err != nil {
		return nil, err
	}
	defer done()
	if err := b.bells.start(ctx, b); err != nil {
		return nil, err
	}
	bl := &bell{c: make(chan struct{}, 1), bs: &b.bells, id: id}
	b.bells.mu.Lock()
	if b.bells.m[id] == nil {
		b.bells.m[id] = map[*bell]bool{}
	}
	b.bells.m[id][bl] = true
	b.bells.mu.Unlock()
	return bl, nil
}

// start connects the listener, if it is not running.
func (bs *bells) start(ctx context.Context, b *backend) error {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.done != nil {
		return nil
	}
	conn, err := listen(ctx, b)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(context.Background())
	bs.cancel, bs.done = cancel, make(chan struct{})
	go bs.run(lctx, b, conn)
	return nil
}

func listen(ctx context.Context, b *backend) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, b.cfg.Copy())
	if err != nil {
		return nil, b.unavailable(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		conn.Close(context.Background())
		return nil, b.unavailable(err)
	}
	return conn, nil
}

// run delivers notifications until stopped. A lost connection rings every
// bell (a ring is only a hint: each waiter reads its ticket again) and is
// made again, so that a waiter never sleeps through a change.
func (bs *bells) run(ctx context.Context, b *backend, conn *pgx.Conn) {
	defer close(bs.done)
	for {
		for conn != nil {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				hangUp(conn, ctx.Err() != nil)
				conn = nil
				break
			}
			bs.ringID(n.Payload)
		}
		if ctx.Err() != nil {
			return
		}
		bs.ringAll()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, _ = listen(cctx, b)
		cancel()
		if conn != nil {
			bs.ringAll() // what changed while it was down
		}
	}
}

// hangUp closes the listening connection. When the handle closes, it
// first stops listening and reads the server's answer, and with it any
// notification already on its way: a notification the server writes after
// the client hung up fails its write, and the server logs that as a lost
// client ("could not send data to client"), a FATAL line per job.
func hangUp(conn *pgx.Conn, closing bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if closing {
		_, _ = conn.Exec(ctx, "UNLISTEN *")
	}
	conn.Close(ctx)
}

func (bs *bells) ringID(id string) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for bl := range bs.m[id] {
		bl.ring()
	}
}

func (bs *bells) ringAll() {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, m := range bs.m {
		for bl := range m {
			bl.ring()
		}
	}
}

// stop ends the listener; bells stay valid but ring no more.
func (bs *bells) stop() {
	bs.mu.Lock()
	cancel, done := bs.cancel, bs.done
	bs.stopped = true
	bs.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Events implements policy.EventReader.
func (b *backend) Events(ctx context.Context, limit string, n int) ([]store.Event, error) {
	out := []store.Event{}
	if n <= 0 {
		return out, nil
	}
	err := b.View(ctx, func(tx policy.Tx) error {
		t := tx.(*ptx)
		q := `SELECT rec FROM slotctl_events ORDER BY seq DESC LIMIT $1`
		args := []any{n}
		if limit != "" {
			q = `SELECT rec FROM slotctl_events WHERE name = $2 ORDER BY seq DESC LIMIT $1`
			args = append(args, limit)
		}
		rows, err := t.tx.Query(ctx, q, args...)
		if err != nil {
			return t.fail(err)
		}
		raws, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			return t.fail(err)
		}
		for _, raw := range raws {
			var e store.Event
			if err := decode(raw, &e, "event"); err != nil {
				return err
			}
			if err := policy.CheckEvent(e); err != nil {
				return corrupt("event", err)
			}
			out = append(out, e)
		}
		return nil
	})
	slices.Reverse(out)
	return out, err
}
