package etcdstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// formatVersion is the version of the records this package writes.
const formatVersion = 1

// keys is the store's prefix with a trailing slash; its methods name the keys.
type keys string

func (k keys) limits() string                 { return string(k) + "limits/" }
func (k keys) limit(name string) string       { return string(k) + "limits/" + name }
func (k keys) tickets(limit string) string    { return string(k) + "tickets/" + limit + "/" }
func (k keys) ticket(limit, id string) string { return k.tickets(limit) + id }
func (k keys) allTickets() string             { return string(k) + "tickets/" }
func (k keys) records(limit string) string    { return string(k) + "records/" + limit + "/" }
func (k keys) record(limit, id string) string { return k.records(limit) + id }
func (k keys) allRecords() string             { return string(k) + "records/" }
func (k keys) slots(limit string) string      { return string(k) + "slots/" + limit + "/" }
func (k keys) slot(limit string, i int) string {
	return fmt.Sprintf("%s%05d", k.slots(limit), i)
}
func (k keys) id(id string) string        { return string(k) + "ids/" + id }
func (k keys) events(limit string) string { return string(k) + "events/" + limit + "/" }
func (k keys) allEvents() string          { return string(k) + "events/" }
func (k keys) dayLease() string           { return string(k) + "meta/day-lease" }
func (k keys) event(limit, id, kind string) string {
	return k.events(limit) + id + "." + kind
}

// last returns the last path segment of key.
func last(key []byte) string {
	s := string(key)
	return s[strings.LastIndexByte(s, '/')+1:]
}

// limitRec is the value of P/limits/<name>.
type limitRec struct {
	V       int       `json:"v"`
	Slots   int       `json:"slots"`
	Created time.Time `json:"created"`
}

// rec is a ticket: the value of both P/tickets/<limit>/<id> (while its lease
// lives) and P/records/<limit>/<id> (until it is removed). Its fence is the
// create revision of those keys, written together.
type rec struct {
	V        int           `json:"v"`
	ID       string        `json:"id"`
	Limit    string        `json:"limit"`
	Lease    int64         `json:"lease"`
	State    store.State   `json:"state"`
	Slot     int           `json:"slot"`
	TTL      time.Duration `json:"ttl"`
	Holder   store.Holder  `json:"holder"`
	Created  time.Time     `json:"created"`
	Admitted time.Time     `json:"admitted,omitzero"`
}

// idRec is the value of P/ids/<id>: where a live ticket is, or, once it was
// removed, why (the tombstone, under the day lease).
type idRec struct {
	V       int          `json:"v"`
	Limit   string       `json:"limit"`
	Lease   int64        `json:"lease,omitempty"`
	Removed store.Reason `json:"removed,omitempty"`
	At      time.Time    `json:"at,omitzero"`
}

// eventRec is the value of an event key. I orders the events written by one
// transaction (they share its revision): Seq is revision<<8 | I.
type eventRec struct {
	V int `json:"v"`
	I int `json:"i"`
	// NewFence: the ticket was created by the transaction that wrote the
	// event, so its fence is the event's revision (unknown before it).
	NewFence bool `json:"new_fence,omitempty"`
	store.Event
}

// dayRec is the value of P/meta/day-lease: the lease tombstones and events
// are put under, so that they go after a day.
type dayRec struct {
	V       int       `json:"v"`
	Lease   int64     `json:"lease"`
	Granted time.Time `json:"granted"`
}

func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // our own plain structs
	}
	return string(b)
}

func decode(what string, b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %v", store.ErrCorrupt, what, err)
	}
	var ver struct {
		V int `json:"v"`
	}
	_ = json.Unmarshal(b, &ver)
	if ver.V != formatVersion {
		return fmt.Errorf("%w: %s: record version %d, this slotctl reads %d", store.ErrCorrupt, what, ver.V, formatVersion)
	}
	return nil
}

// leaseTTL is the whole seconds etcd grants for ttl: rounded up, so that the
// server never expires a lease before the holder's own deadline.
func leaseTTL(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

// leaseClock remembers, for the leases a process granted or renewed, the
// send time of the last acknowledged grant or keep-alive on the boot-time
// clock: the server's expiry is at least that + TTL, which gives a lease's
// remaining time to the millisecond (the server reports whole seconds).
// It is display, never judgement: only the server expires a lease.
type leaseClock struct {
	mu sync.Mutex
	m  map[int64]leaseSeen
}

type leaseSeen struct {
	sent time.Duration
	ttl  time.Duration
}

func newLeaseClock() *leaseClock { return &leaseClock{m: map[int64]leaseSeen{}} }

func (c *leaseClock) now() time.Duration { return proc.Boottime() }

func (c *leaseClock) acked(lease int64, sent, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[lease]; !ok || old.sent < sent {
		c.m[lease] = leaseSeen{sent, ttl}
	}
}

func (c *leaseClock) forget(lease int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, lease)
}

// remaining is the lower bound this process knows, ok false if it knows none.
func (c *leaseClock) remaining(lease int64) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen, ok := c.m[lease]
	if !ok {
		return 0, false
	}
	return seen.ttl - (c.now() - seen.sent), true
}

// --- errors ---

func grpcCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return codes.Unknown
}

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) ||
		grpcCode(err) == codes.NotFound && strings.Contains(err.Error(), "lease not found")
}

func isAuthError(err error) bool {
	switch grpcCode(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return true
	case codes.InvalidArgument:
		return strings.Contains(err.Error(), "authentication failed")
	}
	return false
}

// errorDesc is an error's message without gRPC's "rpc error: code = ..." noise.
func errorDesc(err error) string {
	if st, ok := status.FromError(err); ok && st.Message() != "" {
		return st.Message()
	}
	return err.Error()
}

// ago renders a duration for evidence strings.
func ago(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func itoa(i int) string { return strconv.Itoa(i) }
