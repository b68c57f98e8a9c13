package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/slotctl/slotctl/store"
)

// config is what the configuration file and SLOTCTL_* environment decided,
// after flags took precedence.
type config struct {
	File      string          // the file read, "" if none
	Limits    map[string]int  // sizes for limits created by run
	EtcdFlags map[string]bool // the --etcd-* flags given (by setting name)
	Filled    map[string]bool // the flags the file or the environment set (by name)
}

// knownSettings are the config file's top-level keys; anything else is a
// typo that would otherwise be silently ignored.
var knownSettings = []string{"store", "ttl", "store-timeout", "limits", "etcd", "ping", "progress-every"}

// fileSettings are the flags the config file sets but the environment does
// not (a SLOTCTL_PING would reach every nested slotctl run).
var fileSettings = []string{"ping", "progress-every"}

// envSettings maps settings to the only environment variables slotctl reads
// (docs/leases.md §6). The variables slotctl exports to its child (SLOTCTL_LIMIT, ...)
// are deliberately not among them: they must not configure a nested slotctl.
var envSettings = map[string]string{
	"store":         "SLOTCTL_STORE",
	"ttl":           "SLOTCTL_TTL",
	"store-timeout": "SLOTCTL_STORE_TIMEOUT",
	"etcd.username": "SLOTCTL_ETCD_USERNAME",
	"etcd.password": "SLOTCTL_ETCD_PASSWORD",
}

// configFile picks the file to read: --config, SLOTCTL_CONFIG, then the
// search path. An explicitly named file must exist; a searched one may not.
func (f *Factory) configFile(cmd *cobra.Command) (string, error) {
	explicit, _ := cmd.Flags().GetString("config")
	if explicit == "" {
		explicit = f.Getenv("SLOTCTL_CONFIG")
	}
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", usageError("config file %s: %v", explicit, unwrapPathError(err))
		}
		return explicit, nil
	}
	xdg := f.Getenv("XDG_CONFIG_HOME")
	if xdg == "" {
		if home := f.Getenv("HOME"); home != "" {
			xdg = filepath.Join(home, ".config")
		}
	}
	var candidates []string
	if xdg != "" {
		candidates = append(candidates, filepath.Join(xdg, "slotctl", "config.yaml"))
	}
	candidates = append(candidates, "/etc/slotctl/config.yaml")
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return c, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", usageError("config file %s: %v", c, unwrapPathError(err))
		}
	}
	return "", nil
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// loadConfig reads the config file and environment into a fresh viper and
// fills every flag the user did not set from them: flag > SLOTCTL_* > file >
// default (docs/leases.md §6).
func (f *Factory) loadConfig(cmd *cobra.Command) error {
	v := viper.New()
	f.viper = v
	f.cfg = &config{Limits: map[string]int{}, EtcdFlags: map[string]bool{}, Filled: map[string]bool{}}
	file, err := f.configFile(cmd)
	if err != nil {
		return err
	}
	if file != "" {
		f.cfg.File = file
		v.SetConfigFile(file)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return usageError("config file %s: %s", file, oneLine(err.Error()))
		}
		for _, k := range v.AllKeys() {
			top, sub, _ := strings.Cut(k, ".")
			if !slices.Contains(knownSettings, top) {
				return usageError("config file %s: unknown setting %q (known: %s)", file, top, strings.Join(knownSettings, ", "))
			}
			if top == "etcd" {
				if err := checkEtcdSetting(file, sub); err != nil {
					return err
				}
			}
		}
		if err := f.readLimits(file); err != nil {
			return err
		}
	}
	for key, env := range envSettings {
		if val := f.configEnv(env); val != "" {
			v.Set(key, val) // the factory's environment, not the process's
		}
	}
	for _, fl := range etcdFlags {
		// --etcd-* flags, where the command has them, win over both.
		if pf := cmd.Flags().Lookup("etcd-" + fl.name); pf != nil && pf.Changed {
			v.Set("etcd."+fl.name, pf.Value.String())
			f.cfg.EtcdFlags[fl.name] = true
		}
	}
	var fillErr error
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		if fillErr != nil || fl.Changed || !v.IsSet(fl.Name) || envSettings[fl.Name] == "" && !slices.Contains(fileSettings, fl.Name) {
			return
		}
		val := v.GetString(fl.Name)
		if err := cmd.Flags().Set(fl.Name, val); err != nil {
			fillErr = usageError("%s: %s %q: %s", f.settingSource(fl.Name), fl.Name, val, acceptedFor(fl))
		}
		f.cfg.Filled[fl.Name] = true
	})
	return fillErr
}

// settingSource names where a setting came from, for error messages.
func (f *Factory) settingSource(key string) string {
	if env := envSettings[key]; env != "" && f.configEnv(env) != "" {
		return "environment " + env
	}
	return "config file " + f.cfg.File
}

// acceptedFor says what a flag accepts.
func acceptedFor(fl *pflag.Flag) string {
	switch fl.Value.Type() {
	case "duration":
		return "want a duration such as 30s, 5m or 1h30m"
	case "int":
		return "want a whole number"
	}
	return "invalid value"
}

// readLimits reads the limits section with a YAML parser of its own: viper
// folds keys to lower case, and limit names are case-sensitive.
func (f *Factory) readLimits(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return usageError("config file %s: %v", file, unwrapPathError(err))
	}
	var doc struct {
		Limits yaml.Node `yaml:"limits"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return usageError("config file %s: %s", file, oneLine(err.Error()))
	}
	n := &doc.Limits
	if n.Kind == 0 {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return usageError("config file %s: line %d: limits: want a map of limit name to slot count", file, n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if err := checkLimitName("bad limit name", k.Value); err != nil {
			return usageError("config file %s: line %d: %v", file, k.Line, err)
		}
		var slots int
		if v.Decode(&slots) != nil || store.CheckSlots(slots) != nil {
			return usageError("config file %s: line %d: limits.%s: %q: want a slot count 0..%d", file, v.Line, k.Value, v.Value, store.MaxSlots)
		}
		f.cfg.Limits[k.Value] = slots
	}
	return nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// checkDuration bounds a duration flag with a message that names it.
func checkDuration(name string, d time.Duration, min, max time.Duration) error {
	if d < min || (max > 0 && d > max) {
		if max > 0 {
			return usageError("--%s %s: want a duration from %s to %s", name, d, min, max)
		}
		return usageError("--%s %s: want a duration of at least %s", name, d, min)
	}
	return nil
}

// checkEtcdSetting refuses an unknown etcd.* key of the config file (a typo
// would otherwise be ignored), and a password: it does not belong in a
// file that many can read.
func checkEtcdSetting(file, key string) error {
	if key == "password" {
		return usageError("config file %s: etcd.password: the password is not read from the config file; set SLOTCTL_ETCD_PASSWORD or etcd.password-file", file)
	}
	for _, fl := range etcdFlags {
		if key == fl.name {
			return nil
		}
	}
	var known []string
	for _, fl := range etcdFlags {
		known = append(known, "etcd."+fl.name)
	}
	return usageError("config file %s: unknown setting %q (known: %s)", file, "etcd."+key, strings.Join(known, ", "))
}

// etcdSettings are the etcd.* settings, resolved: flag > SLOTCTL_ETCD_* >
// config file > defaults (the timeouts default to --store-timeout).
type etcdSettings struct {
	DialTimeout, RequestTimeout time.Duration
	CACert, Cert, Key           string
	Username, Password          string
	// InsecureCredentials allows sending Username and Password without
	// TLS (etcd.insecure-credentials; never from the environment).
	InsecureCredentials bool

	f *Factory
}

// source names where an etcd setting came from, for error messages.
func (es etcdSettings) source(key string) string {
	if es.f.cfg != nil && es.f.cfg.EtcdFlags[key] {
		return "flag --etcd-" + key
	}
	return es.f.settingSource("etcd." + key)
}

// path is the file an etcd.* setting names. A relative path in the config
// file is relative to the file's directory (the file is read from anywhere:
// cron's working directory is not the operator's); on a flag, to the
// working directory.
func (es etcdSettings) path(key string) string {
	p := es.f.viper.GetString("etcd." + key)
	if p == "" || filepath.IsAbs(p) || es.f.cfg == nil || es.f.cfg.EtcdFlags[key] || es.f.cfg.File == "" {
		return p
	}
	return filepath.Join(filepath.Dir(es.f.cfg.File), p)
}

func (f *Factory) etcdSettings(g *globalOptions) (etcdSettings, error) {
	es := etcdSettings{DialTimeout: g.StoreTimeout, RequestTimeout: g.StoreTimeout, f: f}
	v := f.viper
	if v == nil {
		return es, nil
	}
	for _, d := range []struct {
		key string
		to  *time.Duration
	}{{"dial-timeout", &es.DialTimeout}, {"request-timeout", &es.RequestTimeout}} {
		s := v.GetString("etcd." + d.key)
		if s == "" {
			continue
		}
		t, err := time.ParseDuration(s)
		if err != nil || t < 10*time.Millisecond || t > 10*time.Minute {
			return es, usageError("%s: etcd.%s %q: want a duration from 10ms to 10m", es.source(d.key), d.key, s)
		}
		*d.to = t
	}
	es.CACert, es.Cert, es.Key = es.path("cacert"), es.path("cert"), es.path("key")
	if x := v.Get("etcd.insecure-credentials"); x != nil {
		b, ok := x.(bool)
		if s, isString := x.(string); isString {
			var err error
			b, err = strconv.ParseBool(s)
			ok = err == nil
		}
		if !ok {
			return es, usageError("%s: etcd.insecure-credentials %q: want true or false", es.source("insecure-credentials"), fmt.Sprint(x))
		}
		es.InsecureCredentials = b
	}
	es.Username, es.Password = v.GetString("etcd.username"), v.GetString("etcd.password")
	if pf := es.path("password-file"); pf != "" && es.Password == "" {
		pw, err := readPasswordFile(pf)
		if err != nil {
			return es, usageError("%s: etcd.password-file %s: %v", es.source("password-file"), pf, unwrapPathError(err))
		}
		es.Password = pw
	}
	if es.Password != "" && es.Username == "" {
		return es, usageError("an etcd password is set but no user: set etcd.username (or SLOTCTL_ETCD_USERNAME)")
	}
	if es.Username != "" && es.Password == "" {
		return es, usageError("etcd user %q has no password: set SLOTCTL_ETCD_PASSWORD or etcd.password-file", es.Username)
	}
	return es, nil
}

// maxPasswordFile bounds what is read from a password file.
const maxPasswordFile = 4096

// readPasswordFile reads the etcd password from path the way ssh reads a
// private key: only from a regular file (opened without blocking, so a
// FIFO cannot hang slotctl) that no one outside its owner and group can
// read or write, and that its group cannot write. Unlike ssh, a
// group-readable file (0640, 0440) is accepted: the packaged setup shares
// one password among the members of group slotctl, who are trusted with
// the store (docs/leases.md §4.5). A symlink is followed; the mode checked is its
// target's. Trailing newlines are not part of the password.
func readPasswordFile(path string) (string, error) {
	fd, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer fd.Close()
	fi, err := fd.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("not a regular file (%s): want a file holding the password", fileType(fi.Mode()))
	}
	if perm := fi.Mode().Perm(); perm&0o027 != 0 {
		var who []string
		if perm&0o004 != 0 {
			who = append(who, "others can read it")
		}
		if perm&0o002 != 0 {
			who = append(who, "others can write it")
		}
		if perm&0o020 != 0 {
			who = append(who, "its group can write it")
		}
		if len(who) == 0 {
			who = append(who, "others have access to it")
		}
		return "", fmt.Errorf("mode %04o: %s; want 0600 or 0400 (0640 or 0440 to share it with its group): chmod 600 %s", perm, strings.Join(who, " and "), path)
	}
	b, err := io.ReadAll(io.LimitReader(fd, maxPasswordFile+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxPasswordFile {
		return "", fmt.Errorf("more than %d bytes: want a file holding only the password", maxPasswordFile)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// fileType names a file's type for an error message.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return m.Type().String()
}
