package cli

// The etcd store. The etcd client is linked in only by cmd/slotctl-etcd,
// which registers it (RegisterEtcd, with cmd/internal/etcdcli); cmd/slotctl has
// none and hands etcd stores to slotctl-etcd instead (etcd_dispatch.go).
// The etcd.* settings are resolved here, in both; their TLS files are read
// by etcdcli (crypto/x509's certificate loading is ~0.5 MB slotctl does
// without).

import (
	"strings"
	"time"

	"github.com/slotctl/slotctl/store"
)

// EtcdClient is what a binary with the etcd client registers: the store's
// URL parser and its constructor.
type EtcdClient interface {
	// ParseURL splits etcd://HOST:PORT[,HOST:PORT...][/PREFIX].
	ParseURL(url string) (endpoints []string, prefix string, err error)
	// Open reads the TLS files and opens the store; nothing is sent yet.
	// A bad TLS file is a UsageError naming it.
	Open(EtcdConfig) (store.Store, error)
}

// EtcdConfig is an etcd store's URL and settings, resolved (docs/leases.md §5).
type EtcdConfig struct {
	Endpoints                   []string
	Prefix                      string
	DialTimeout, RequestTimeout time.Duration
	Username, Password          string
	// TLS files (PEM): the CA bundle that signed the cluster's certificates,
	// the client certificate and its key; all empty: no TLS. CACertFrom and
	// CertFrom say where the settings came from (for errors, e.g. "flag
	// --etcd-cacert").
	CACert, Cert, Key    string
	CACertFrom, CertFrom string
}

// TLS reports whether the store is reached over TLS.
func (c EtcdConfig) TLS() bool { return c.CACert != "" || c.Cert != "" || c.Key != "" }

// UsageError is a bad-input error (exit 64, docs/leases.md §3): the message is one
// line that names the input.
func UsageError(format string, args ...any) error { return usageError(format, args...) }

// etcdClient is the registered etcd client; nil in slotctl.
var etcdClient EtcdClient

// RegisterEtcd links the etcd client in: etcd stores are then served by
// this binary (slotctl-etcd) instead of handed to slotctl-etcd. Call it
// before Main.
func RegisterEtcd(c EtcdClient) { etcdClient = c }

// openEtcd opens etcd://HOST:PORT[,HOST:PORT...][/PREFIX] with the etcd.*
// settings (docs/leases.md §5). Nothing is sent yet: the first request connects,
// within the dial timeout.
func (f *Factory) openEtcd(g *globalOptions, url string) (store.Store, error) {
	if etcdClient == nil {
		return nil, execEtcdHelper(url)
	}
	endpoints, prefix, err := etcdClient.ParseURL(url)
	if err != nil {
		ee := &ExitError{Code: exitUsage, Err: err}
		if strings.ContainsAny(url, "?#@") {
			ee.Hint = "set etcd.username, etcd.cacert, ... in the config file (or --etcd-* flags) and the password in SLOTCTL_ETCD_PASSWORD or etcd.password-file"
		}
		return nil, ee
	}
	es, err := f.etcdSettings(g)
	if err != nil {
		return nil, err
	}
	c := EtcdConfig{Endpoints: endpoints, Prefix: prefix, DialTimeout: es.DialTimeout, RequestTimeout: es.RequestTimeout,
		Username: es.Username, Password: es.Password,
		CACert: es.CACert, Cert: es.Cert, Key: es.Key, CACertFrom: es.source("cacert"), CertFrom: es.source("cert")}
	if c.Username != "" && !c.TLS() && !es.InsecureCredentials {
		// docs/leases.md §4.5: credentials never go without TLS unless the operator says so.
		return nil, usageError("store %s: refusing to send the password of etcd user %q to %s without TLS: set etcd.cacert (--etcd-cacert) to use TLS, or etcd.insecure-credentials: true (--etcd-insecure-credentials) to send it in clear text",
			url, c.Username, strings.Join(endpoints, ", "))
	}
	return etcdClient.Open(c)
}

// renewWindow is the least time a renewal has before the holder's local
// deadline (renew.Options' defaults: a margin of ttl/10, a period of every,
// ttl/3 when 0, jittered up to +20%): the renewal attempted last is sent
// that long before the deadline at the latest.
func renewWindow(ttl, every time.Duration) time.Duration {
	if every == 0 {
		every = ttl / 3
	}
	return ttl - ttl/10 - every*12/10
}

// checkEtcdLease refuses (exit 64) a lease on etcd that the request
// timeout the operator set (etcd.request-timeout, --etcd-request-timeout)
// cannot keep: a renewal must be able to wait that long for one answer
// within its window (renewWindow), or a slow cluster the operator allows
// for would cost the lease. Without the setting, a renewal's requests take
// at most its window, each attempt a third of it (store/etcdstore's
// failover.go), so every --ttl is kept. Other stores: nothing to check.
func (f *Factory) checkEtcdLease(g *globalOptions, ttl, every time.Duration) error {
	if !strings.HasPrefix(g.Store, "etcd://") || f.viper == nil {
		return nil
	}
	s := f.viper.GetString("etcd.request-timeout")
	rt, err := time.ParseDuration(s)
	if s == "" || err != nil {
		return nil // unset; or bad, which opening the store reports
	}
	w := renewWindow(ttl, every)
	if rt <= w {
		return nil
	}
	// The least ttl whose window holds rt: w = 0.9*ttl - 1.2*every.
	need := rt * 2 // the default period, ttl/3: the window is ttl/2
	if every != 0 {
		need = (rt + every*12/10) * 10 / 9
	}
	const tenth = time.Second / 10
	need = (need + tenth - 1) / tenth * tenth
	src := "etcd.request-timeout"
	if f.cfg != nil && f.cfg.EtcdFlags["request-timeout"] {
		src = "--etcd-request-timeout"
	}
	return usageError("--ttl %s: a renewal has %s before the lease's local deadline, less than %s %s: want --ttl %s or more, or %s %s or less",
		ttl, w.Round(time.Millisecond), src, rt, need, src, w.Round(time.Millisecond))
}
