//go:build !noetcd

package cli

// The etcd store, in a slotctl built with the etcd client (the default; the
// released slotctl-etcd). A build with -tags noetcd (the released slotctl)
// hands etcd stores to slotctl-etcd instead: etcd_dispatch.go.

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
)

// execEtcdEarly: this build serves etcd stores itself.
func execEtcdEarly([]string) {}

// openEtcd opens etcd://HOST:PORT[,HOST:PORT...][/PREFIX] with the etcd.*
// settings (SPEC §5). Nothing is sent yet: the first request connects,
// within the dial timeout.
func (f *Factory) openEtcd(g *globalOptions, url string) (store.Store, error) {
	endpoints, prefix, err := etcdstore.ParseURL(url)
	if err != nil {
		return nil, usageError("%v", err)
	}
	es, err := f.etcdSettings(g)
	if err != nil {
		return nil, err
	}
	o := etcdstore.Options{Endpoints: endpoints, Prefix: prefix, DialTimeout: es.DialTimeout, RequestTimeout: es.RequestTimeout,
		Username: es.Username, Password: es.Password, Dead: proc.Dead}
	if o.TLS, err = es.tlsConfig(); err != nil {
		return nil, err
	}
	if o.Username != "" && o.TLS == nil && !es.InsecureCredentials {
		// SPEC §4.5: credentials never go without TLS unless the operator says so.
		return nil, usageError("store %s: refusing to send the password of etcd user %q to %s without TLS: set etcd.cacert (--etcd-cacert) to use TLS, or etcd.insecure-credentials: true (--etcd-insecure-credentials) to send it in clear text",
			url, o.Username, strings.Join(endpoints, ", "))
	}
	return etcdstore.New(o)
}

// tlsConfig is the TLS configuration the settings ask for: nil without any.
func (es etcdSettings) tlsConfig() (*tls.Config, error) {
	if es.CACert == "" && es.Cert == "" && es.Key == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if es.CACert != "" {
		pem, err := os.ReadFile(es.CACert)
		if err != nil {
			return nil, usageError("%s: etcd.cacert %s: %v", es.source("cacert"), es.CACert, unwrapPathError(err))
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usageError("%s: etcd.cacert %s: no PEM certificate in it", es.source("cacert"), es.CACert)
		}
	}
	if (es.Cert == "") != (es.Key == "") {
		return nil, usageError("%s: etcd.cert and etcd.key: give both (a client certificate and its key) or neither", es.source("cert"))
	}
	if es.Cert != "" {
		cert, err := tls.LoadX509KeyPair(es.Cert, es.Key)
		if err != nil {
			return nil, usageError("%s: etcd.cert %s, etcd.key %s: %s", es.source("cert"), es.Cert, es.Key, oneLine(unwrapPathError(err).Error()))
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
