// Package cli is the slotctl command: its flags, configuration, terminal
// output and the real child process, around the library that does the work
// (gate/holder runs the holder protocol, store and its backends keep the
// tickets). Its two mains are cmd/slotctl, without the etcd client, and
// cmd/slotctl-etcd, which registers it (cmd/internal/etcdcli). cobra and
// viper are used here and nowhere else.
package cli
