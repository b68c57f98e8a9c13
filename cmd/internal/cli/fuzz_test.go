package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slotctl/slotctl/store/etcdstore"
)

// fuzzMain runs slotctl in-process with args and a private environment, and
// checks what docs/leases.md §7 asks of bad input: an exit code of docs/leases.md §3 (never 70,
// which is a bug), no panic, and exactly one error line (§7: a hint belongs in it).
func fuzzMain(t *testing.T, dir string, args ...string) {
	t.Helper()
	code, stderr := mainIn(t, dir, args...)
	switch code {
	case 0, exitUsage, exitUnavailable:
	default:
		t.Fatalf("slotctl %q: exit %d\nstderr: %s", args, code, stderr)
	}
	if lines := strings.Count(strings.TrimSuffix(stderr, "\n"), "\n") + 1; stderr != "" && lines > 1 {
		t.Fatalf("slotctl %q: %d lines on stderr, want one error line:\n%s", args, lines, stderr)
	}
	if code != 0 && !strings.HasPrefix(stderr, "slotctl: ") {
		t.Fatalf("slotctl %q: exit %d without a slotctl: message: %q", args, code, stderr)
	}
}

// FuzzConfigFile feeds arbitrary bytes to slotctl as its config file (a file
// shared by every job of a host): an error naming the file, or a working
// command, never a panic or an internal error.
func FuzzConfigFile(f *testing.F) {
	for _, seed := range []string{
		"store: bolt:///tmp/x.db\nttl: 30s\nlimits:\n  build: 2\n",
		"limits: [1, 2]\n",
		"limits:\n  -x: 1\n",
		"limits:\n  a: -1\n",
		"ttl: banana\n",
		"stroe: x\n",
		"store-timeout: 1ms\n",
		"\t: : :\n",
		"etcd:\n  username: u\n",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(cfg, b, 0o600); err != nil {
			t.Fatal(err)
		}
		// The store always stays inside dir, whatever the file says.
		fuzzMain(t, dir, "--config", cfg, "--store", filepath.Join(dir, "slots.db"), "limit", "ls")
	})
}

// FuzzStoreFlag feeds arbitrary --store values: a bad scheme or path is a
// usage error or an unavailable store, never a panic. Paths are kept inside
// a temporary directory (the fuzzer must not create directories elsewhere),
// and etcd URLs are fuzzed by the etcd store's own parser, not dialled here.
func FuzzStoreFlag(f *testing.F) {
	for _, seed := range []string{"", "slots.db", "bolt://slots.db", "bolt://", "foo://x", "://", "bolt:///", "a/b/c.db", "..", "x\x00y"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, url string) {
		if strings.HasPrefix(url, "etcd://") {
			t.Skip("dialling is not parsing")
		}
		dir := t.TempDir()
		scheme, rest, hasScheme := strings.Cut(url, "://")
		switch {
		case hasScheme && scheme == "bolt":
			url = "bolt://" + filepath.Join(dir, "s", filepath.Clean("/"+rest))
		case !hasScheme:
			url = filepath.Join(dir, "s", filepath.Clean("/"+url))
		}
		fuzzMain(t, dir, "--store", url, "limit", "ls")
	})
}

// FuzzParseWait: --wait takes "" (no bound) or a duration >= 0; anything
// else is one usage error that names it.
func FuzzParseWait(f *testing.F) {
	for _, seed := range []string{"", "0", "1s", "-1s", "10m", "soon", "1e9h", "9999999999999h", "0.5ms", "1h1h"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseWait(s)
		switch {
		case err != nil:
			if !strings.Contains(err.Error(), "--wait") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("parseWait(%q): %v", s, err)
			}
		case s == "" && d != -1, s != "" && d < 0:
			t.Fatalf("parseWait(%q) = %v", s, d)
		}
	})
}

// FuzzEtcdURL: an etcd://HOST:PORT[,...][/PREFIX] store URL parses into
// endpoints and a prefix, or is refused with one line that names it.
func FuzzEtcdURL(f *testing.F) {
	for _, seed := range []string{"etcd://127.0.0.1:2379", "etcd://a:1,b:2/team", "etcd://", "etcd://:0", "etcd://h:99999", "etcd://h:1//x", "etcd://[::1]:2379/p"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, url string) {
		endpoints, prefix, err := etcdstore.ParseURL(url)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseURL(%q): a multi-line error: %v", url, err)
			}
			return
		}
		if len(endpoints) == 0 || !strings.HasPrefix(prefix, "/") {
			t.Fatalf("ParseURL(%q) = %q, %q: accepted without endpoints or an absolute prefix", url, endpoints, prefix)
		}
	})
}
