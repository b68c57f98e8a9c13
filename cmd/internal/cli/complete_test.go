package cli

// Shell completion through cobra's hidden __complete command, in-process:
// what a shell would get on Tab.

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// compStore makes a store with limits build, backup and deploy (a ticket
// in each of build and deploy) and a config file that declares batch.
func compStore(t *testing.T) *lsEnv {
	t.Helper()
	e := newLsEnv(t)
	st, err := boltstore.New(e.store, boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for _, name := range []string{"build", "backup", "deploy"} {
		if _, err := st.SetLimit(ctx, name, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []store.EnqueueRequest{
		{ID: "aaaa1111bbbb2222cccc3333dddd4444", Limit: "build", Slots: 1, TTL: time.Hour,
			Holder: store.Holder{Host: "h", Pid: 1, Argv: []string{"make", "all"}}},
		{ID: "aaaa9999eeee8888ffff7777aaaa6666", Limit: "build", Slots: 1, TTL: time.Hour,
			Holder: store.Holder{Host: "h", Pid: 2, Label: "nightly"}},
		{ID: "0123456789abcdef0123456789abcdef", Limit: "deploy", Slots: 1, TTL: time.Hour, Key: "production",
			Holder: store.Holder{Host: "h", Pid: 3, Argv: []string{"deploy.sh", "prod"}}},
	} {
		if _, err := st.Enqueue(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(e.env["XDG_CONFIG_HOME"], "slotctl", "config.yaml")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("limits:\n  batch: 3\n  build: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

// compRun runs slotctl __complete ARGS... and returns the suggestions (the
// lines before the directive), the directive line and stderr.
func compRun(t *testing.T, env map[string]string, args ...string) (suggestions []string, directive, stderr string) {
	t.Helper()
	f, out, errOut := lsFactory(env, nil, false, 0)
	if code := lsRun(t, f, append([]string{"__complete"}, args...)...); code != 0 {
		t.Fatalf("__complete %q: exit %d\n%s", args, code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], ":") {
		t.Fatalf("__complete %q: no directive line in %q", args, out.String())
	}
	return lines[:len(lines)-1], lines[len(lines)-1], errOut.String()
}

// compNoExtraStderr fails if stderr holds more than cobra's own completion
// debug line.
func compNoExtraStderr(t *testing.T, stderr string) {
	t.Helper()
	for line := range strings.SplitSeq(strings.TrimSuffix(stderr, "\n"), "\n") {
		if line != "" && !strings.HasPrefix(line, "Completion ended with directive:") {
			t.Errorf("unexpected stderr line %q", line)
		}
	}
}

func TestCompleteRunLimitFlag(t *testing.T) {
	e := compStore(t)
	got, dir, stderr := compRun(t, e.env, "run", "--limit", "b")
	if dir != ":4" {
		t.Errorf("directive %q, want :4 (ShellCompDirectiveNoFileComp)", dir)
	}
	slices.Sort(got)
	if want := []string{"backup", "batch", "build"}; !slices.Equal(got, want) {
		t.Errorf("run --limit b: %q, want %q (store and config, once each, not deploy)", got, want)
	}
	compNoExtraStderr(t, stderr)

	// The flag's value may be given with =, too.
	got, _, _ = compRun(t, e.env, "run", "--limit=d")
	if !slices.Equal(got, []string{"--limit=deploy"}) && !slices.Equal(got, []string{"deploy"}) {
		t.Errorf("run --limit=d: %q, want deploy", got)
	}

	// Each --limit completes, and a limit named by an earlier one is not
	// offered again (the same limit twice is refused).
	got, _, _ = compRun(t, e.env, "run", "--limit", "build", "-l", "deploy", "--limit", "")
	slices.Sort(got)
	if want := []string{"backup", "batch"}; !slices.Equal(got, want) {
		t.Errorf("run --limit build -l deploy --limit \"\": %q, want %q", got, want)
	}
}

func TestCompleteLsLimits(t *testing.T) {
	e := compStore(t)
	for _, cmd := range [][]string{{"ls"}, {"limit", "ls"}, {"reap"}, {"log"}} {
		got, dir, stderr := compRun(t, e.env, append(cmd, "")...)
		if dir != ":4" {
			t.Errorf("%s: directive %q, want :4", cmd, dir)
		}
		slices.Sort(got)
		if want := []string{"backup", "batch", "build", "deploy"}; !slices.Equal(got, want) {
			t.Errorf("%s \"\": %q, want %q", cmd, got, want)
		}
		compNoExtraStderr(t, stderr)
	}
	// A limit already given is not offered again.
	got, _, _ := compRun(t, e.env, "ls", "build", "b")
	slices.Sort(got)
	if want := []string{"backup", "batch"}; !slices.Equal(got, want) {
		t.Errorf("ls build b: %q, want %q", got, want)
	}
}

func TestCompleteReleaseTickets(t *testing.T) {
	e := compStore(t)
	got, dir, stderr := compRun(t, e.env, "release", "")
	if dir != ":4" {
		t.Errorf("directive %q, want :4", dir)
	}
	want := []string{
		"aaaa1111bbbb2222cccc3333dddd4444\tbuild held: make all",
		"aaaa9999eeee8888ffff7777aaaa6666\tbuild waiting: nightly",
		"0123456789abcdef0123456789abcdef\tdeploy held: deploy.sh prod",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("release \"\":\n got %q\nwant %q", got, want)
	}
	compNoExtraStderr(t, stderr)

	got, _, _ = compRun(t, e.env, "release", "aaaa9")
	if len(got) != 1 || !strings.HasPrefix(got[0], "aaaa9999eeee8888ffff7777aaaa6666\t") {
		t.Errorf("release aaaa9: %q, want the one ticket with that prefix", got)
	}
	// Without descriptions (shells that cannot show them).
	f, out, errOut := lsFactory(e.env, nil, false, 0)
	if code := lsRun(t, f, "__completeNoDesc", "release", "0123"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if out.String() != "0123456789abcdef0123456789abcdef\n:4\n" {
		t.Errorf("__completeNoDesc release 0123: %q", out.String())
	}
}

// A store that cannot be read means no suggestions, quietly, exit 0.
func TestCompleteUnreadableStore(t *testing.T) {
	e := compStore(t)
	junk := filepath.Join(t.TempDir(), "junk.db")
	if err := os.WriteFile(junk, []byte(strings.Repeat("this is not a bbolt file\n", 400)), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for k, v := range e.env {
		env[k] = v
	}
	env["SLOTCTL_STORE"] = junk
	t.Setenv("SLOTCTL_STORE", junk) // viper reads the process environment (see TestLsStoreFromFactoryGetenv)
	for _, args := range [][]string{{"release", ""}, {"ls", ""}, {"run", "--limit", ""}} {
		start := time.Now()
		got, dir, stderr := compRun(t, env, args...)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%q took %s", args, d)
		}
		if dir != ":4" {
			t.Errorf("%q: directive %q, want :4", args, dir)
		}
		// Limits still come from the config file; nothing from the store.
		for _, s := range got {
			if s != "batch" && s != "build" {
				t.Errorf("%q: suggestion %q from an unreadable store", args, s)
			}
		}
		if args[0] == "release" && len(got) != 0 {
			t.Errorf("release: %q, want no suggestions", got)
		}
		compNoExtraStderr(t, stderr)
	}
	// A store path that cannot even be created (its directory is a file).
	env["SLOTCTL_STORE"] = filepath.Join(junk, "slots.db")
	t.Setenv("SLOTCTL_STORE", env["SLOTCTL_STORE"])
	got, dir, stderr := compRun(t, env, "release", "")
	if len(got) != 0 || dir != ":4" {
		t.Errorf("release with a store under a file: %q %q", got, dir)
	}
	compNoExtraStderr(t, stderr)
}

func TestCompletionScript(t *testing.T) {
	e := newLsEnv(t)
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		f, out, errOut := lsFactory(e.env, nil, false, 0)
		if code := lsRun(t, f, "completion", shell); code != 0 {
			t.Fatalf("completion %s: exit %d: %s", shell, code, errOut)
		}
		if !strings.Contains(out.String(), "slotctl") || out.Len() < 1000 {
			t.Errorf("completion %s: %d bytes, not a script for slotctl", shell, out.Len())
		}
		if errOut.Len() != 0 {
			t.Errorf("completion %s: stderr %q", shell, errOut)
		}
	}
	f, out, _ := lsFactory(e.env, nil, false, 0)
	lsRun(t, f, "completion", "bash")
	if !strings.Contains(out.String(), "__start_slotctl") {
		t.Errorf("completion bash: no __start_slotctl function")
	}
}

// TestCompleteRunKey: --key suggests the keys of the tickets in the run's
// limits (docs/leases.md §2.1 item 10), and no files.
func TestCompleteRunKey(t *testing.T) {
	e := compStore(t)
	got, dir, _ := compRun(t, e.env, "run", "--limit", "deploy", "--key", "pro")
	if !slices.Equal(got, []string{"production"}) || dir != ":4" {
		t.Errorf("run --limit deploy --key pro<Tab>: %q %s, want [production] :4", got, dir)
	}
	got, _, _ = compRun(t, e.env, "run", "--limit", "build", "--key", "")
	if len(got) != 0 {
		t.Errorf("run --limit build --key <Tab>: %q, want none (no ticket of build has a key)", got)
	}
}
