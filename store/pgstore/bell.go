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

// Watch implements policy.Backend. The listening connection is made in the
// background, beside the caller's first step: a connection costs the server
// a process, as long as a whole step on some machines. Once it listens,
// every bell rings once, so that a step committed before then is not
// missed (a ring is only a hint: each waiter reads its ticket again).
func (b *backend) Watch(ctx context.Context, id string) (store.Bell, error) {
	done, err := b.open()
	if err != nil {
		return nil, err
	}
	defer done()
	bl := &bell{c: make(chan struct{}, 1), bs: &b.bells, id: id}
	b.bells.mu.Lock()
	defer b.bells.mu.Unlock()
	if b.bells.m[id] == nil {
		b.bells.m[id] = map[*bell]bool{}
	}
	b.bells.m[id][bl] = true
	if b.bells.done == nil && !b.bells.stopped {
		lctx, cancel := context.WithCancel(context.Background())
		b.bells.cancel, b.bells.done = cancel, make(chan struct{})
		go b.bells.run(lctx, b)
	}
	return bl, nil
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

// run listens and delivers notifications until stopped. A connection that
// cannot be made, or is lost, is made again a second later; each time it
// listens again every bell rings, so that a waiter never sleeps through a
// change. A connection under way when the handle closes is finished, not
// cut, so that it can be hung up cleanly (see hangUp).
func (bs *bells) run(ctx context.Context, b *backend) {
	defer close(bs.done)
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		if b.beforeListen != nil {
			b.beforeListen()
		}
		cctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		conn, err := listen(cctx, b)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		bs.ringAll()
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				hangUp(conn, ctx.Err() != nil)
				break
			}
			bs.ringID(n.Payload)
		}
		if ctx.Err() != nil {
			return
		}
		bs.ringAll()
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
		select {
		case <-done:
		case <-time.After(stopWait):
		}
	}
}

// stopWait bounds how long a closing handle waits for its listener to hang
// up: a connection under way is finished first, unless the server is that
// slow to answer.
const stopWait = 2 * time.Second

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
