package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// observer watches the store's keys through every member at once, so that
// a failed check can say when (by the test's clock) each change of a
// ticket happened: the first member to report a revision gives its time.
// It is diagnostics only; the checks use the replay and the jobs' times.
type observer struct {
	mu     sync.Mutex
	seen   map[int64]time.Time
	events []obsEvent
	stop   context.CancelFunc
	wg     sync.WaitGroup

	leaders []string // "15:04:05.000 m1 says m2 leads (term 3)", on each change
}

type obsEvent struct {
	rev   int64
	put   bool
	key   string
	state string // a ticket's state, for puts of ticket keys
	val   string // a slot key's value: the ticket holding it
	lease int64
	at    time.Time
}

func (c *cluster) observe(prefix string) *observer {
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{seen: map[int64]time.Time{}, stop: cancel}
	for _, ep := range c.endpoints() {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			defer cli.Close()
			for resp := range cli.Watch(ctx, "/"+prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(1)) {
				now := time.Now()
				for _, ev := range resp.Events {
					o.note(ev, now)
				}
			}
		}()
	}
	// Who leads, as each member says, every 100 ms: changes are noted.
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		last := make([]string, len(c.members))
		names := map[uint64]string{}
		for ctx.Err() == nil {
			for i, m := range c.members {
				sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
				r, err := c.cli.Status(sctx, m.cfg.Client)
				scancel()
				now := "no answer"
				if err == nil {
					names[r.Header.MemberId] = m.cfg.Name
					lead := names[r.Leader]
					if lead == "" {
						lead = fmt.Sprintf("%x", r.Leader)
					}
					now = fmt.Sprintf("%s leads (term %d)", lead, r.RaftTerm)
				}
				if now != last[i] {
					last[i] = now
					o.mu.Lock()
					o.leaders = append(o.leaders, fmt.Sprintf("%s %s says %s", time.Now().Format("15:04:05.000"), m.cfg.Name, now))
					o.mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	c.t.Cleanup(o.close)
	return o
}

// leadership is what the members said of who leads, when it changed.
func (o *observer) leadership() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return "  " + strings.Join(o.leaders, "\n  ")
}

func (o *observer) note(ev *clientv3.Event, at time.Time) {
	rev := ev.Kv.ModRevision
	o.mu.Lock()
	defer o.mu.Unlock()
	key := string(ev.Kv.Key)
	for i := range o.events { // a revision may carry several keys: note each once
		if o.events[i].rev == rev && o.events[i].key == key {
			if at.Before(o.events[i].at) {
				o.events[i].at = at
			}
			return
		}
	}
	e := obsEvent{rev: rev, put: ev.Type == clientv3.EventTypePut, key: key, lease: ev.Kv.Lease, at: at}
	if e.put && strings.Contains(key, "/tickets/") {
		var r struct {
			State string `json:"state"`
		}
		_ = json.Unmarshal(ev.Kv.Value, &r)
		e.state = r.State
	}
	if e.put && strings.Contains(key, "/slots/") {
		e.val = string(ev.Kv.Value)
	}
	o.events = append(o.events, e)
}

func (o *observer) close() {
	o.stop()
	o.wg.Wait()
}

// about lists what happened to the keys naming any of ids (ticket, slot
// value, record), in revision order.
func (o *observer) about(ids ...string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	evs := append([]obsEvent(nil), o.events...)
	sort.Slice(evs, func(a, b int) bool { return evs[a].rev < evs[b].rev })
	var b strings.Builder
	for _, e := range evs {
		for _, id := range ids {
			if id != "" && (strings.Contains(e.key, id) || e.val == id) {
				kind := "delete"
				if e.put {
					kind = "put " + e.state + e.val
				}
				fmt.Fprintf(&b, "  rev %d %s %s %s (lease %x)\n", e.rev, e.at.Format("15:04:05.000000"), kind, e.key, e.lease)
				break
			}
		}
	}
	return b.String()
}

// slotHistory lists the puts and deletes of the limit's slot keys (whose
// values are the ticket ids holding them; a delete names the key only).
func (o *observer) slotHistory(prefix, limit string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	evs := append([]obsEvent(nil), o.events...)
	sort.Slice(evs, func(a, b int) bool { return evs[a].rev < evs[b].rev })
	var b strings.Builder
	p := "/" + prefix + "/slots/" + limit + "/"
	for _, e := range evs {
		if strings.HasPrefix(e.key, p) {
			kind := "delete"
			if e.put {
				kind = "put " + e.val
			}
			fmt.Fprintf(&b, "  rev %d %s %s %s (lease %x)\n", e.rev, e.at.Format("15:04:05.000000"), kind, e.key, e.lease)
		}
	}
	return b.String()
}

// deletedTicketsBetween counts the ticket keys deleted in [from, to].
func (o *observer) deletedTicketsBetween(from, to time.Time) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, e := range o.events {
		if !e.put && strings.Contains(e.key, "/tickets/") && !e.at.Before(from) && !e.at.After(to) {
			n++
		}
	}
	return n
}
