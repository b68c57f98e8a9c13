package cli

// slotctl (cmd/slotctl) has no etcd client: linking it costs every run, on
// every store, about 1.5 ms of start-up and 5 MB of peak memory (README,
// Performance). An etcd store is served by slotctl-etcd (cmd/slotctl-etcd),
// the same command with the client, installed beside it: slotctl replaces
// itself with it, same arguments, same environment, before it has done
// anything (openStore is every command's first step that touches the world).

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// etcdHelper is the name of the slotctl built with the etcd client.
const etcdHelper = "slotctl-etcd"

// execEtcdHelper replaces this process with slotctl-etcd, same arguments,
// same environment; it returns only the error that it could not.
func execEtcdHelper(url string) error {
	helper, err := findEtcdHelper()
	if err != nil {
		return &ExitError{Code: exitUnavailable, Err: fmt.Errorf("store %q: %v", url, err)}
	}
	err = syscall.Exec(helper, append([]string{helper}, os.Args[1:]...), os.Environ())
	return &ExitError{Code: exitUnavailable, Err: fmt.Errorf("store %q: exec %s: %v", url, helper, err)}
}

// execHelper replaces this process with slotctl-etcd for a command that
// needs what only it links (what: "the Prometheus encoder"), same
// arguments, same environment; it returns only the error that it could not.
func execHelper(command, what string) error {
	helper, err := findEtcdHelper()
	if err != nil {
		return &ExitError{Code: exitUnavailable, Err: fmt.Errorf("%s: this slotctl leaves %s to %s: %v", command, what, etcdHelper, err)}
	}
	err = syscall.Exec(helper, append([]string{helper}, os.Args[1:]...), os.Environ())
	return &ExitError{Code: exitUnavailable, Err: fmt.Errorf("%s: exec %s: %v", command, helper, err)}
}

// findEtcdHelper finds slotctl-etcd beside this executable, else on PATH,
// and refuses this very file (a slotctl installed as slotctl-etcd would
// exec itself for ever).
func findEtcdHelper() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("this slotctl has no etcd client and cannot find its own path to look for %s beside it: %v", etcdHelper, err)
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		self = resolved
	}
	helper := filepath.Join(filepath.Dir(self), etcdHelper)
	if _, err := os.Stat(helper); errors.Is(err, fs.ErrNotExist) {
		if onPath, perr := exec.LookPath(etcdHelper); perr == nil {
			helper = onPath
		} else {
			return "", fmt.Errorf("this slotctl has no etcd client, and %s (which has) is neither beside it (%s) nor on PATH: install the package's %s, or go install github.com/slotctl/slotctl/cmd/%s@latest", etcdHelper, helper, etcdHelper, etcdHelper)
		}
	}
	a, aerr := os.Stat(self)
	b, berr := os.Stat(helper)
	if aerr == nil && berr == nil && os.SameFile(a, b) {
		return "", fmt.Errorf("%s is this slotctl, which has no etcd client: install the %s built from cmd/%s", helper, etcdHelper, etcdHelper)
	}
	return helper, nil
}

// ExecEtcdEarly execs slotctl-etcd before the command line is parsed when
// the store is plainly etcd: --store etcd://... before any "--", else
// SLOTCTL_STORE=etcd://... without --store (the config file is left to
// openEtcd, once resolved). It saves the etcd path the parsing, about 1.5 ms;
// when it cannot tell, or finds no helper, it returns and openEtcd decides.
// It does nothing once an etcd client is registered (slotctl-etcd).
func ExecEtcdEarly(args []string) {
	if etcdClient != nil || !etcdStoreGiven(args, os.Getenv) {
		return
	}
	if helper, err := findEtcdHelper(); err == nil {
		_ = syscall.Exec(helper, append([]string{helper}, args...), os.Environ())
	}
}
