// Package etcdcli links the etcd client into the command: cmd/slotctl-etcd
// (and the command's tests) register Client with cli.RegisterEtcd. It is the
// only way from the command to the etcd client (go.etcd.io/etcd, gRPC);
// cmd/slotctl does not import it and hands etcd stores to slotctl-etcd.
package etcdcli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"os"
	"strings"

	"github.com/slotctl/slotctl/cmd/internal/cli"
	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/etcdstore"
)

// Client is the etcd store, as the command opens it.
var Client cli.EtcdClient = client{}

type client struct{}

func (client) ParseURL(url string) ([]string, string, error) { return etcdstore.ParseURL(url) }

// Open opens the store; its holders are proved dead on this host by
// proc.Dead (docs/leases.md §4.3).
func (client) Open(c cli.EtcdConfig) (store.Store, error) {
	o := etcdstore.Options{Endpoints: c.Endpoints, Prefix: c.Prefix,
		DialTimeout: c.DialTimeout, RequestTimeout: c.RequestTimeout,
		Username: c.Username, Password: c.Password, Dead: proc.Dead}
	var err error
	if o.TLS, err = tlsConfig(c); err != nil {
		return nil, err
	}
	return etcdstore.New(o)
}

// tlsConfig is the TLS configuration the settings ask for: nil without any.
func tlsConfig(s cli.EtcdConfig) (*tls.Config, error) {
	if !s.TLS() {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.CACert != "" {
		pem, err := os.ReadFile(s.CACert)
		if err != nil {
			return nil, cli.UsageError("%s: etcd.cacert %s: %v", s.CACertFrom, s.CACert, unwrapPathError(err))
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, cli.UsageError("%s: etcd.cacert %s: no PEM certificate in it", s.CACertFrom, s.CACert)
		}
	}
	if (s.Cert == "") != (s.Key == "") {
		return nil, cli.UsageError("%s: etcd.cert and etcd.key: give both (a client certificate and its key) or neither", s.CertFrom)
	}
	if s.Cert != "" {
		cert, err := tls.LoadX509KeyPair(s.Cert, s.Key)
		if err != nil {
			return nil, cli.UsageError("%s: etcd.cert %s, etcd.key %s: %s", s.CertFrom, s.Cert, s.Key, strings.Join(strings.Fields(unwrapPathError(err).Error()), " "))
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// unwrapPathError drops the path an *fs.PathError repeats (the message
// names the file already).
func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
