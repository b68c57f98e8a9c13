package etcdstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// formatVersion is the version of the records this package writes: 2
// gives a ticket several limits, a weight and its slot indexes in each. The
// previous release wrote version 1 (one limit, weight 1), which reads and
// works unchanged (docs/leases.md §2.1 item 9).
const formatVersion = 2

// MaxTicketKeys bounds the keys one ticket's admission or removal writes in
// one transaction: per limit its ticket key, record and event and one slot
// key per unit of weight, k*(w+3). etcd refuses a transaction of more than
// 128 operations (--max-txn-ops), and a ticket that could never be written
// in one would wait forever; with the limits it creates, their counts keys
// (P/counts/<limit>, countsrec.go) and its id key, at most 64+16+16+1, it
// stays within maxPlanOps.
const MaxTicketKeys = 64

// ticketKeys is how many keys a ticket of k limits and weight w writes.
func ticketKeys(k, w int) int { return k * (max(w, 1) + 3) }

// checkFits refuses a ticket too big for one etcd transaction.
func checkFits(names []string, weight int) error {
	if n := ticketKeys(len(names), weight); n > MaxTicketKeys {
		return fmt.Errorf("%w: a ticket of %d limits (%s) and weight %d writes %d keys in one etcd transaction (per limit 3 and one per unit of weight): the etcd store allows at most %d (limits x (weight+3) <= %d): want fewer limits or a lower weight",
			store.ErrInvalid, len(names), strings.Join(names, ", "), max(weight, 1), n, MaxTicketKeys, MaxTicketKeys)
	}
	return nil
}

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

// limitRec is the value of P/limits/<name>: its size, its scheduling
// policy and, when the policy has a rate, the starts of the admissions
// within its window (by the admitting clients' clocks, oldest first, at
// most Rate.N), which the transaction that admits writes.
type limitRec struct {
	V       int          `json:"v"`
	Slots   int          `json:"slots"`
	Created time.Time    `json:"created"`
	Policy  store.Policy `json:"policy,omitzero"`
	Starts  []time.Time  `json:"starts,omitempty"`
}

// decodeLimit decodes and checks the record of limit name: a size, a
// policy and rate starts a request could have written.
func decodeLimit(name string, b []byte) (limitRec, error) {
	var l limitRec
	if err := decode("limit "+name, b, &l); err != nil {
		return l, err
	}
	if err := store.CheckSlots(l.Slots); err != nil {
		return l, fmt.Errorf("%w: limit %s: %v", store.ErrCorrupt, name, err)
	}
	if l.V < 2 && (l.Policy != (store.Policy{}) || l.Starts != nil) {
		return l, fmt.Errorf("%w: limit %s: a version 1 record has a policy", store.ErrCorrupt, name)
	}
	if err := l.Policy.Check(); err != nil {
		return l, fmt.Errorf("%w: limit %s: %v", store.ErrCorrupt, name, err)
	}
	if len(l.Starts) > l.Policy.Rate.N {
		return l, fmt.Errorf("%w: limit %s: %d rate starts: want at most %d", store.ErrCorrupt, name, len(l.Starts), l.Policy.Rate.N)
	}
	return l, nil
}

// view is the limit as a Snapshot lists it before its tickets are counted
// (store.Snapshot.AddLimit).
func (l *limitRec) view(name string) store.Limit {
	return store.Limit{Name: name, Slots: l.Slots, Created: l.Created, Policy: l.Policy, Starts: l.Starts}
}

// rec is a ticket: the value of both P/tickets/<limit>/<id> (while its lease
// lives) and P/records/<limit>/<id> (until it is removed). Its fence is the
// create revision of those keys, written together.
//
// A ticket of several limits has these two keys under each of them, all
// with the same value and written together (one create revision: its
// fence). Version 2 adds Limits (when more than one), Weight (when more
// than 1) and Indexes (while held, when either is), and, all optional, the
// ticket's Key, the Stop request a newer run of its key made of it while
// held, the held tickets it Replaces and its Superseding mark
// (docs/leases.md §2.1 item 10).
type rec struct {
	V        int              `json:"v"`
	ID       string           `json:"id"`
	Limit    string           `json:"limit"`
	Limits   []string         `json:"limits,omitempty"`
	Weight   int              `json:"weight,omitempty"`
	Lease    int64            `json:"lease"`
	State    store.State      `json:"state"`
	Slot     int              `json:"slot"`
	Indexes  map[string][]int `json:"indexes,omitempty"`
	TTL      time.Duration    `json:"ttl"`
	Holder   store.Holder     `json:"holder"`
	Created  time.Time        `json:"created"`
	Admitted time.Time        `json:"admitted,omitzero"`
	Key      string           `json:"key,omitempty"`
	Stop     *store.Successor `json:"stop,omitempty"`
	Replaces []string         `json:"replaces,omitempty"`
	// Priority and Share order the ticket in the limits whose policy asks
	// for them (store.Ticket.Priority, store.Ticket.ShareKey).
	Priority int    `json:"priority,omitempty"`
	Share    string `json:"share,omitempty"`
	// Superseding marks a ticket whose supersede did not fit in one
	// transaction: it was written first, with what fit, and every settle
	// goes on removing the older waiting tickets of its Key that share one
	// of its limits, and asking those it Replaces to stop, until none is
	// left; those are never admitted meanwhile (store/policy: step.carryOn). A reader
	// that does not know the field only leaves the rest to the newer run.
	Superseding bool `json:"superseding,omitempty"`
	// Term is the raft term known when the ticket's lease was granted (at
	// most the term it was granted in), and Hold the lease that keeps a
	// held ticket's slots once its own lease vanished after an election
	// (quarantine.go).
	Term uint64 `json:"term,omitempty"`
	Hold int64  `json:"hold,omitempty"`
}

// keyLease is the lease the ticket's live keys are under: its own, or its
// hold's once held in quarantine.
func (r *rec) keyLease() int64 {
	if r.Hold != 0 {
		return r.Hold
	}
	return r.Lease
}

// maxReplaces bounds the held tickets one ticket replaces: its record is
// written under each of its limits in one transaction, which etcd bounds
// in bytes too (--max-request-bytes, 1.5 MiB by default).
const maxReplaces = 256

// idRec is the value of P/ids/<id>: where a live ticket is, or, once it was
// removed, why (the tombstone, under the day lease).
type idRec struct {
	V       int          `json:"v"`
	Limit   string       `json:"limit"`
	Limits  []string     `json:"limits,omitempty"` // version 2: all of its limits, when several
	Lease   int64        `json:"lease,omitempty"`
	Removed store.Reason `json:"removed,omitempty"`
	At      time.Time    `json:"at,omitzero"`
	// By names the newer run that superseded the ticket (Removed is
	// store.Superseded; docs/leases.md §2.1 item 10).
	By *store.Successor `json:"by,omitempty"`
}

// checkSuccessor holds a stored successor to what a request may name.
func checkSuccessor(by *store.Successor) error {
	if err := store.CheckID(by.Ticket); err != nil {
		return err
	}
	if !store.IsPrintable(by.Host) || by.Pid < 0 {
		return fmt.Errorf("host %q, pid %d: want printable, a pid of 0 or more", by.Host, by.Pid)
	}
	return store.CheckURL(by.URL)
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
	// Measured before it is decoded: a member can write a value as large as
	// the server accepts (--max-request-bytes).
	if err := store.CheckRecordSize(len(b)); err != nil {
		return fmt.Errorf("%w: %s: %v", store.ErrCorrupt, what, strings.TrimPrefix(err.Error(), store.ErrCorrupt.Error()+": "))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %v", store.ErrCorrupt, what, err)
	}
	var ver struct {
		V int `json:"v"`
	}
	_ = json.Unmarshal(b, &ver)
	if ver.V < 1 || ver.V > formatVersion {
		return fmt.Errorf("%w: %s: record version %d, this slotctl reads versions 1 to %d", store.ErrCorrupt, what, ver.V, formatVersion)
	}
	return nil
}

// names is the record's limits in order.
func (r *rec) names() []string {
	if len(r.Limits) > 0 {
		return r.Limits
	}
	return []string{r.Limit}
}

func (r *rec) weighs() int { return max(r.Weight, 1) }

// in is the record's slot indexes in limit while held.
func (r *rec) in(limit string) []int {
	if r.State != store.Held {
		return nil
	}
	if r.Indexes != nil {
		return r.Indexes[limit]
	}
	if limit == r.Limit {
		return []int{r.Slot}
	}
	return nil
}

// check holds a record read from the store to what a request may ask for
// (names, counts, weight, indexes) and to the key it was read under
// (limit, id): a hostile record is ErrCorrupt, never a panic or a ticket no
// transaction can hold.
func (r *rec) check(what, limit, id string) error {
	if r.ID != id || store.CheckID(r.ID) != nil {
		return corruptRec(what, "ticket id %q under key of id %q", r.ID, id)
	}
	if r.V < 2 && r.setsVersion2Fields() {
		return corruptRec(what, "a version 1 record names limits, a weight, indexes, a key, a stop request, tickets it replaces, a supersede, a priority or a share")
	}
	if err := r.checkKeyed(what); err != nil {
		return err
	}
	if err := r.checkNames(what, limit); err != nil {
		return err
	}
	if r.Lease < 0 || r.TTL < 0 {
		return corruptRec(what, "lease %d, ttl %s", r.Lease, r.TTL)
	}
	switch r.State {
	case store.Waiting:
		if r.Indexes != nil {
			return corruptRec(what, "a waiting ticket holds indexes")
		}
		return nil
	case store.Held:
		return r.checkHeld(what)
	default:
		return corruptRec(what, "state %q: want waiting or held", r.State)
	}
}

// corruptRec is the ErrCorrupt of a record (what) that check refuses.
func corruptRec(what, format string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", store.ErrCorrupt, what, fmt.Sprintf(format, a...))
}

// setsVersion2Fields reports whether the record sets a field that only
// version 2 records have.
func (r *rec) setsVersion2Fields() bool {
	return len(r.Limits) > 0 || r.Weight != 0 || r.Indexes != nil || r.Key != "" || r.Stop != nil || r.Replaces != nil || r.Superseding ||
		r.Priority != 0 || r.Share != ""
}

// checkKeyed checks the record's key and holder, the tickets it replaces,
// and that only a held ticket has a hold or a stop request.
func (r *rec) checkKeyed(what string) error {
	if err := store.CheckKey(r.Key); err != nil {
		return corruptRec(what, "%v", err)
	}
	if err := store.CheckStoredHolder(r.Holder); err != nil {
		return corruptRec(what, "%v", err)
	}
	if err := store.CheckPriority(r.Priority); err != nil {
		return corruptRec(what, "%v", err)
	}
	if err := store.CheckShare(r.Share); err != nil {
		return corruptRec(what, "%v", err)
	}
	if len(r.Replaces) > maxReplaces {
		return corruptRec(what, "it replaces %d tickets: at most %d", len(r.Replaces), maxReplaces)
	}
	for _, id := range r.Replaces {
		if err := store.CheckID(id); err != nil {
			return corruptRec(what, "it replaces: %v", err)
		}
	}
	if r.Hold != 0 && r.State != store.Held {
		return corruptRec(what, "a hold on a %s ticket: only a held one keeps its slots", r.State)
	}
	if r.Stop != nil {
		if err := checkSuccessor(r.Stop); err != nil {
			return corruptRec(what, "stop request: %v", err)
		}
		if r.State != store.Held {
			return corruptRec(what, "a stop request on a %s ticket: only a held one is asked to stop", r.State)
		}
	}
	return nil
}

// checkNames checks the record's limits, that it names the limit it was
// read under, and its weight.
func (r *rec) checkNames(what, limit string) error {
	if len(r.Limits) > 0 && r.Limits[0] != r.Limit {
		return corruptRec(what, "limit %q is not the first of its limits %q", r.Limit, r.Limits)
	}
	names := r.names()
	if err := store.CheckLimits(names); err != nil {
		return corruptRec(what, "%v", err)
	}
	if !slices.Contains(names, limit) {
		return corruptRec(what, "under limit %q, which it does not name (%s)", limit, strings.Join(names, ", "))
	}
	if err := store.CheckWeight(r.Weight); err != nil {
		return corruptRec(what, "%v", err)
	}
	if ticketKeys(len(names), r.Weight) > MaxTicketKeys {
		return corruptRec(what, "%d limits of weight %d: more than one transaction can hold", len(names), r.weighs())
	}
	return nil
}

// checkHeld checks a held record's slot, or its indexes: its weight of
// ascending indexes in each of its limits, its slot the lowest in the
// first.
func (r *rec) checkHeld(what string) error {
	names := r.names()
	if r.Indexes == nil {
		if len(names) > 1 || r.weighs() > 1 {
			return corruptRec(what, "a held ticket of %d limits and weight %d without its indexes", len(names), r.weighs())
		}
		if r.Slot < 0 || r.Slot >= store.MaxSlots {
			return corruptRec(what, "slot %d: want 0..%d", r.Slot, store.MaxSlots-1)
		}
		return nil
	}
	if len(r.Indexes) != len(names) {
		return corruptRec(what, "indexes in %d limits, it names %d", len(r.Indexes), len(names))
	}
	for _, n := range names {
		ix := r.Indexes[n]
		if len(ix) != r.weighs() {
			return corruptRec(what, "%d indexes in limit %q, its weight is %d", len(ix), n, r.weighs())
		}
		for j, i := range ix {
			if i < 0 || i >= store.MaxSlots || j > 0 && i <= ix[j-1] {
				return corruptRec(what, "indexes %v in limit %q: want %d ascending of 0..%d", ix, n, r.weighs(), store.MaxSlots-1)
			}
		}
	}
	if r.Slot != r.Indexes[r.Limit][0] {
		return corruptRec(what, "slot %d is not its lowest index in %q", r.Slot, r.Limit)
	}
	return nil
}

// decodeRec decodes and checks the record at key (under limit, of id).
func decodeRec(key []byte, limit, id string, b []byte) (rec, error) {
	var r rec
	what := "ticket record " + string(key)
	if err := decode(what, b, &r); err != nil {
		return r, err
	}
	return r, r.check(what, limit, id)
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
