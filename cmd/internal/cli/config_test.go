package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The config file the package installs is valid as shipped (all commented
// out) and with every setting uncommented: no example in it names a
// setting slotctl would refuse. Its etcd paths are relative to the file.
func TestPackagedConfigExample(t *testing.T) {
	shipped, err := os.ReadFile("../../../packaging/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// "#key: value" and "#  key: value" lines become settings; prose stays comments.
	uncomment := regexp.MustCompile(`(?m)^#(\s*[a-z-]+:(\s|$))`)
	on := uncomment.ReplaceAll(shipped, []byte("$1"))
	if bytes.Equal(on, shipped) || !bytes.Contains(on, []byte("\netcd:\n  dial-timeout:")) {
		t.Fatalf("uncommenting changed nothing, or not the etcd section:\n%s", on)
	}
	dir := t.TempDir()
	for name, content := range map[string][]byte{"shipped.yaml": shipped, "all.yaml": on} {
		cfg := filepath.Join(dir, name)
		if err := os.WriteFile(cfg, content, 0o644); err != nil {
			t.Fatal(err)
		}
		if code, stderr := mainIn(t, dir, "--config", cfg, "--store", filepath.Join(dir, "slots.db"), "limit", "ls"); code != 0 {
			t.Errorf("%s: exit %d: %s", name, code, stderr)
		}
	}
	// On an etcd store the settings are read: the password file is looked
	// for next to the config file, not in the working directory.
	code, stderr := mainIn(t, dir, "--config", filepath.Join(dir, "all.yaml"), "--store", "etcd://127.0.0.1:1", "limit", "ls")
	want := "etcd.password-file " + filepath.Join(dir, "etcd", "password") + ": no such file"
	if code != exitUsage || !strings.Contains(stderr, want) {
		t.Errorf("etcd store with the example's settings: exit %d, %q; want %d naming %q", code, stderr, exitUsage, want)
	}
}

// mainIn runs slotctl in-process with a private environment under dir.
func mainIn(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := map[string]string{"HOME": dir, "XDG_CONFIG_HOME": filepath.Join(dir, "config"), "XDG_STATE_HOME": filepath.Join(dir, "state")}
	f := NewFactory("v0.0.0-test", "", "")
	f.IO = &IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}
	f.Getenv = func(k string) string { return env[k] }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return Main(ctx, args, f), errOut.String()
}
