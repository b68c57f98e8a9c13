// Package etcdstore is the [store.Store] of slotctl on an etcd v3 cluster:
// the same limits across many hosts, with expiry judged by the etcd server.
//
// # Keys
//
// Under the store's prefix P (default /slotctl):
//
//	P/limits/<limit>          {slots, created, policy, starts}       no lease
//	P/tickets/<limit>/<id>    the live ticket                         the ticket's own lease
//	P/slots/<limit>/<00000>   the id of the ticket holding slot i     the holder's lease
//	P/records/<limit>/<id>    the same ticket, outliving its lease    no lease
//	P/ids/<id>                {limit, limits} while live; the tombstone after  none; then a day lease
//	P/events/<limit>/<id>.<kind>[.<n>]  one event of the log          a day lease, trimmed to MaxEvents
//	P/meta/day-lease          the current day lease                   no lease
//
// One etcd lease per ticket: the ticket key and, once held, its slot key are
// bound to it, so when the server expires the lease both vanish together and
// the slot is free; no client clock takes part. A ticket is created with
// create-if-absent on P/ids/<id> in one transaction, so a retried create
// finds its own ticket and a removed id (whose ids key became a tombstone)
// is refused. The fence is the create revision of the ticket key, and so is
// the queue order: FIFO is the order of create revisions.
//
// The rules are store/policy's, written once for every store: each step
// of them is an etx (tx.go), which reads the limits the rules ask for at
// one revision and commits their writes in one transaction that compares
// what they rest on (txcommit.go). What is etcd's own: the lease granted
// beside Enqueue's first read, the light paths of a waiter joining or
// leaving a long queue (light.go), a renewal that is a keep-alive, bells
// that watch keys, and holds after an election (quarantine.go).
//
// A ticket is held when its record says so, which a transaction writes
// together with its slot key (create-if-absent, the lowest free index
// below the limit's size). Every write that can free or add capacity
// (enqueue, release, reap, resize, the renewal of a waiter) ends by
// "settling" the limit in the same transaction: it removes the records of
// tickets whose lease the server expired (P/records without P/tickets; their
// slot went with the lease) and of holders proven dead, then promotes the
// waiters among the first <slots> live tickets. The transaction compares the
// revisions of what its decision rests on, so a decision made on a stale
// read never commits: the step runs again on a new read.
// Release and removal compare the ticket key's revision before deleting, so
// a stale retry never deletes a newer ticket.
//
// A ticket of several limits (docs/leases.md §2.1 item 9) has its ticket
// key and record under each of them, with one value, all created by one
// transaction: one create revision, its fence, so every queue orders the
// same tickets the same way. Its admission is one transaction too: its keys
// rewritten held in every limit and Weight slot keys in each, under its
// lease, or nothing. A settle reads the limits it touches and, at the same
// revision, every limit their tickets name, until no ticket names a limit
// it has not read (the closure), and plans them all with one
// policy.PlanSettle. One ticket's admission or removal must fit in one
// transaction, which etcd bounds (--max-txn-ops, 128 by default): a ticket
// of k limits and weight w writes k*(w+3) keys, at most 64 (so 16 limits of
// weight 1, or one limit of weight 61); Enqueue refuses more.
//
// A held ticket's weight changes with Resize (docs/leases.md §2.1 item 12),
// in one transaction on the revision of its ticket key: its keys rewritten
// in every limit (keeping its lease) and its slot keys following its
// indexes, a shrink's freed ones deleted and the closure settled in the
// same transaction, a growth's new ones put under its lease, compared so
// that no slot key was written, no ticket joined and no size changed in its
// limits since the read. A growth stops at the same bound of 64 keys. The
// events a ticket logs more than once have keys of their own: a "replaced"
// event's ends in the newer run's id, a "resized" one's in the revision of
// the ticket key it rewrote.
//
// A waiter watches its own ticket key (promoted: rewritten; removed or
// expired: deleted) and, in each of its limits, the one key it must
// outlast there: the live ticket just ahead of it, or, at the head of the
// queue, the holders. When that key goes without anyone settling (its lease
// expired), the waiter settles the limits itself. A release thus wakes the
// waiter it promoted and the one behind it, not the queue.
//
// # Scheduling policies
//
// A limit's key keeps its policy (order, aging, rate) and, when it has a
// rate, the start of each admission within the window. Every settle plans
// with the policies of the limits it read; an admission to a rated limit
// rewrites the limit's key with its start in the same transaction, which
// compares that key's revision as read, so two clients never spend one
// token: the loser plans again on the starts the winner wrote. An
// admission to a limit ordered by priority or fair share also compares
// that no ticket joined the limit since the read (a newcomer may come
// first there; in ticket order it comes last). etcd has no clock a
// transaction could read, so "now" is the clock of the client that plans:
// rate windows and aging are measured by the clocks of the hosts that
// admit, and assume those clocks in sync (a host whose clock runs ahead
// opens a window early by as much). The steps that skip the settle or
// place a waiter without reading its limit's records (light.go; Get's and
// a renewal's light reads; Heads) take the full path for a limit with a
// policy, whose order a count of the tickets ahead does not give. A
// waiter's bell reads its limits again when a spent rate's window opens.
//
// Newer runs first (docs/leases.md §2.1 item 10): a ticket's record carries
// its key. An Enqueue with Supersede removes, in its own transaction, the
// older live waiting tickets of its key that share a limit (their
// tombstones name the successor, so Get and Renew can say who took their
// place); with Replace it also rewrites the held ones' keys with a stop
// request (keeping their lease: a restart keeps it), and the new ticket's
// Replaces names them: it is admitted only once they are gone. A holder
// hears the request through its bell, which goes on watching its own key
// while it is held (one watch event), or at its next renewal.
package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/slotctl/slotctl/internal/mutation"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// DefaultPrefix is the key prefix of a store URL without one.
const DefaultPrefix = "/slotctl"

// Options configure a Store. Endpoints is required.
type Options struct {
	// Endpoints are the cluster's client URLs as host:port.
	Endpoints []string
	// Prefix is the key prefix (default DefaultPrefix): several stores can
	// share one cluster under different prefixes.
	Prefix string
	// DialTimeout bounds the first request, which connects (default 5s): an
	// unreachable cluster is ErrUnavailable within it.
	DialTimeout time.Duration
	// RequestTimeout bounds every later request, all of its attempts
	// together (default 5s; a caller's earlier deadline bounds it too). One
	// attempt waits for one member at most AttemptTimeout of that before
	// the request fails over to another (failover.go).
	RequestTimeout time.Duration
	// TLS, if not nil, is used for every endpoint.
	TLS *tls.Config
	// Username and Password authenticate to a cluster with auth enabled.
	Username, Password string
	// Dead proves a ticket's holder dead on this host (docs/leases.md §4.3); nil
	// leaves every ticket to its lease.
	Dead store.Judge
	// DialOptions are added to the gRPC connection's (tests use them to
	// inject faults).
	DialOptions []grpc.DialOption
	// Mutations switches known bugs back on (tests only, with the build
	// tag slotctl_mutations; see internal/mutation).
	Mutations mutation.Set

	// skew (tests only, through the export_test.go hook): a reaper whose
	// reading of the leases is skew ahead, so that its dry run lists leases
	// about to expire.
	skew time.Duration
	// clock (tests only): share one handle's knowledge of lease send times
	// with another handle in the same process.
	clock *leaseClock
}

// Store is a [store.Store] on etcd. It is safe for concurrent use.
type Store struct {
	o    Options
	c    *clientv3.Client
	k    keys
	url  string
	dead store.Judge
	pol  *policy.Store // the rules, over this store's steps (tx.go)

	closed     atomic.Bool // Close was called
	closeOnce  sync.Once
	connected  atomic.Bool // a request has been answered: later ones use RequestTimeout
	dialFailed atomic.Bool // no answer within the dial timeout: fail at once until one comes
	probeOnce  sync.Once   // after a dial timeout: what TLS says (tlsprobe.go)
	probe      string
	leases     *leaseClock
	fo         *failover     // the endpoints in use (failover.go)
	ka         *kaStreams    // the keep-alive stream every renewal shares (keepalive.go)
	term       atomic.Uint64 // the highest raft term of an answer (failover.go)

	mu       sync.Mutex
	known    map[string]known // ticket id -> what this handle learned of it
	bells    map[string]*bell // id -> the bell waiting for its Enqueue
	day      int64            // the current day lease, 0 if unknown
	staleDay int64            // a day lease the server no longer has
}

// known is what a handle remembers of a ticket it wrote or read.
type known struct {
	limit string
	lease int64
	fence int64
	rev   int64 // the revision its ticket key was last written at, 0 if unknown
	r     rec   // its record as of rev
	// promoted: rev and r come from the watch event that showed the ticket
	// promoted; the next Get answers from them without a read (the gate
	// confirms every ring with a Get, and a read right after the release's
	// commit can wait behind the server's next write).
	promoted bool
}

// ParseURL splits an etcd://HOST:PORT[,HOST:PORT...][/PREFIX] store URL into
// its endpoints and key prefix (DefaultPrefix when it has none). The error
// names the URL and says what would be accepted.
func ParseURL(url string) (endpoints []string, prefix string, err error) {
	rest, ok := strings.CutPrefix(url, "etcd://")
	if !ok {
		return nil, "", fmt.Errorf("store %q: want etcd://HOST:PORT[,HOST:PORT...][/PREFIX]", url)
	}
	if strings.ContainsAny(rest, "?#@") {
		return nil, "", fmt.Errorf("store %q: no user, query or fragment in an etcd URL: credentials and TLS are the store's options, not part of its URL", url)
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if hosts == "" {
		return nil, "", fmt.Errorf("store %q: no endpoint: want etcd://HOST:PORT[,HOST:PORT...][/PREFIX]", url)
	}
	for _, h := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" {
			return nil, "", fmt.Errorf("store %q: endpoint %q: want HOST:PORT", url, h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, "", fmt.Errorf("store %q: endpoint %q: port %q: want 1..65535", url, h, port)
		}
		endpoints = append(endpoints, strings.ToLower(h))
	}
	prefix, err = cleanPrefix("/" + path)
	if err != nil {
		return nil, "", fmt.Errorf("store %q: %v", url, err)
	}
	return endpoints, prefix, nil
}

// cleanPrefix normalises a key prefix: one leading slash, no trailing or
// doubled ones, DefaultPrefix when empty.
func cleanPrefix(p string) (string, error) {
	var parts []string
	for _, seg := range strings.Split(p, "/") {
		if seg == "" {
			continue
		}
		if seg == "." || seg == ".." {
			return "", fmt.Errorf("prefix %q: no . or .. segments", p)
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
				return "", fmt.Errorf("prefix %q: want segments of [A-Za-z0-9._:-]", p)
			}
		}
		parts = append(parts, seg)
	}
	if len(parts) == 0 {
		return DefaultPrefix, nil
	}
	return "/" + strings.Join(parts, "/"), nil
}

// New returns a store on the cluster. It does not connect: the first request
// does, within DialTimeout.
func New(o Options) (*Store, error) {
	if len(o.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: etcd store without endpoints", store.ErrInvalid)
	}
	prefix, err := cleanPrefix(o.Prefix)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", store.ErrInvalid, err)
	}
	o.Prefix = prefix
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 5 * time.Second
	}
	if (o.Username == "") != (o.Password == "") {
		return nil, fmt.Errorf("%w: etcd username and password: give both or neither", store.ErrInvalid)
	}
	s := &Store{o: o, k: keys(prefix + "/"), dead: o.Dead,
		url:   "etcd://" + strings.Join(o.Endpoints, ",") + prefix,
		known: map[string]known{}, bells: map[string]*bell{}, leases: o.clock,
		fo: newFailover(o.Endpoints)}
	if s.leases == nil {
		s.leases = newLeaseClock()
	}
	s.pol = policy.New(backend{s}, policy.Options{Judge: o.Dead, Mutations: o.Mutations,
		MaxWeight: func(limits int) int { return MaxTicketKeys/limits - 3 }})
	cfg := clientv3.Config{
		Endpoints:   o.Endpoints,
		DialTimeout: o.DialTimeout,
		// gRPC's keepalive: the safety net under failover.go, which
		// notices a stalled member at the first request that times out on
		// it. A ping goes only after this long without a read on the
		// connection, and its timer wakes the process that often: at 30 s
		// a waiter's renewals (every 15 s at the default TTL) leave it
		// nothing to send, and an idle waiter wakes about 40% less often
		// than at gRPC's shortest, 10 s.
		DialKeepAliveTime:    30 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		TLS:                  o.TLS,
		Username:             o.Username,
		Password:             o.Password,
		// Ours first: the test's fault injectors (o.DialOptions) run
		// inside each attempt.
		DialOptions: append([]grpc.DialOption{
			grpc.WithChainUnaryInterceptor(s.unary),
			grpc.WithChainStreamInterceptor(s.stream),
			grpc.WithContextDialer(s.fo.dial),
		}, o.DialOptions...),
		Logger:          zap.NewNop(),
		MaxUnaryRetries: 2,
	}
	// With a username, New authenticates at once (bounded by DialTimeout).
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, s.unavailable(err, true)
	}
	s.c = c
	s.ka = newKAStreams(s)
	s.fo.mu.Lock()
	s.fo.c = c
	s.fo.mu.Unlock()
	if o.Username != "" {
		s.connected.Store(true)
	}
	return s, nil
}

// Close implements [store.Store]: it stops every bell's watches (bells
// stop ringing; they stay safe to Close) and closes the client and its
// connection. Idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.fo.close()
		s.mu.Lock()
		for _, b := range s.bells {
			b.cancel() // its goroutine ends instead of retrying on a closed client
		}
		s.mu.Unlock()
		if err = s.c.Close(); errors.Is(err, context.Canceled) {
			err = nil
		}
	})
	return err
}

// errClosed is the error of an operation on a closed store.
func (s *Store) errClosed() error { return fmt.Errorf("%w: %s", store.ErrClosed, s.url) }

// String implements [store.Store]: etcd://HOST:PORT[,...]/PREFIX.
func (s *Store) String() string { return s.url }

// Endpoints are the cluster's endpoints as configured.
func (s *Store) Endpoints() []string { return s.o.Endpoints }

// ctx bounds one request: by the dial timeout until the cluster has
// answered once, then by the request timeout.
//
// A process that could not reach the cluster within the dial timeout does
// not wait that long again (slotctl run would otherwise wait once more to
// cancel a ticket it never wrote): its later requests fail at once.
func (s *Store) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	if s.connected.Load() {
		return context.WithTimeout(parent, s.o.RequestTimeout)
	}
	if s.dialFailed.Load() {
		return context.WithDeadline(parent, time.Time{})
	}
	return context.WithTimeout(parent, s.o.DialTimeout)
}

// answered notes that the cluster answered.
func (s *Store) answered() { s.connected.Store(true) }

// unavailable turns a failed request into an error wrapping
// store.ErrUnavailable (and the cause) that names the cluster. The caller's
// own cancellation passes through.
func (s *Store) unavailable(err error, dial bool) error {
	if err == nil {
		return nil
	}
	if s.closed.Load() {
		return s.errClosed()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, store.ErrUnavailable) {
		return err
	}
	what := fmt.Sprintf("etcd at %s", strings.Join(s.o.Endpoints, ", "))
	var msg string
	switch {
	case isAuthError(err):
		msg = fmt.Sprintf("%s refused user %q: %v", what, s.o.Username, errorDesc(err))
		if grpcCode(err) != codes.PermissionDenied {
			msg = fmt.Sprintf("%s refused the credentials of user %q: %v", what, s.o.Username, errorDesc(err))
		}
	case dial || !s.connected.Load():
		timeout := errors.Is(err, context.DeadlineExceeded) || grpcCode(err) == codes.DeadlineExceeded
		if timeout || grpcCode(err) == codes.Unavailable {
			s.dialFailed.Store(true)
		}
		if timeout {
			msg = fmt.Sprintf("%s did not answer within %s (the dial timeout)", what, s.o.DialTimeout)
			if cause := s.probeTLS(); cause != "" { // grpc says only "timeout" of a failed handshake
				msg = fmt.Sprintf("%s: %s", what, cause)
			}
		} else {
			msg = fmt.Sprintf("%s cannot be reached: %v", what, errorDesc(err))
		}
	default:
		msg = fmt.Sprintf("%s: %v", what, errorDesc(err))
	}
	return &unavailableError{msg: store.ErrUnavailable.Error() + ": " + msg, cause: err}
}

// unavailableError is store.ErrUnavailable with its cause.
type unavailableError struct {
	msg   string
	cause error
}

func (e *unavailableError) Error() string   { return e.msg }
func (e *unavailableError) Unwrap() []error { return []error{store.ErrUnavailable, e.cause} }
