package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/slotctl/slotctl/store"
)

func TestChildEnv(t *testing.T) {
	environ := []string{"PATH=/bin", "SLOTCTL_ETCD_PASSWORD=pw", "SLOTCTL_ETCD_USERNAME=u", "SLOTCTL_TICKET=old", "SLOTCTL_SLOTS=a=0 b=1",
		"SLOTCTL_SUPERVISOR=1:2:3", "SLOTCTL_STORE=/a", "SLOTCTL_STORE_EXPORTED=/a", "SLOTCTL_STORE_BEFORE=/b", "SLOTCTL_TTL=1m"}
	// A nested run: the ancestor's job variables pass, credentials never.
	got := childEnv(environ, nil)
	want := []string{"PATH=/bin", "SLOTCTL_TICKET=old", "SLOTCTL_SLOTS=a=0 b=1", "SLOTCTL_SUPERVISOR=1:2:3", "SLOTCTL_STORE=/a",
		"SLOTCTL_STORE_EXPORTED=/a", "SLOTCTL_STORE_BEFORE=/b", "SLOTCTL_TTL=1m"}
	if !slices.Equal(got, want) {
		t.Errorf("childEnv(nested) = %q, want %q", got, want)
	}
	// A new ticket: its own job variables replace the ancestor's.
	got = childEnv(environ, []string{"SLOTCTL_TICKET=new", "SLOTCTL_STORE=/c", "SLOTCTL_STORE_EXPORTED=/c"})
	want = []string{"PATH=/bin", "SLOTCTL_TTL=1m", "SLOTCTL_TICKET=new", "SLOTCTL_STORE=/c", "SLOTCTL_STORE_EXPORTED=/c"}
	if !slices.Equal(got, want) {
		t.Errorf("childEnv(new ticket) = %q, want %q", got, want)
	}
}

func TestConfigEnvStore(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SLOTCTL_STORE": "/a"}, "/a"},                                                               // the operator's own
		{map[string]string{"SLOTCTL_STORE": "/a", "SLOTCTL_STORE_EXPORTED": "/a"}, ""},                                 // slotctl's: unset before
		{map[string]string{"SLOTCTL_STORE": "/a", "SLOTCTL_STORE_EXPORTED": "/a", "SLOTCTL_STORE_BEFORE": "/b"}, "/b"}, // slotctl's: the operator's before
		{map[string]string{"SLOTCTL_STORE": "/c", "SLOTCTL_STORE_EXPORTED": "/a", "SLOTCTL_STORE_BEFORE": "/b"}, "/c"}, // the job set its own
		{map[string]string{"SLOTCTL_STORE_EXPORTED": "/a", "SLOTCTL_STORE_BEFORE": "/b"}, ""},                          // the job unset it
	} {
		f := &Factory{Getenv: func(k string) string { return c.env[k] }}
		if got := f.configEnv("SLOTCTL_STORE"); got != c.want {
			t.Errorf("configEnv(SLOTCTL_STORE) with %v = %q, want %q", c.env, got, c.want)
		}
		if got := f.configEnv("SLOTCTL_STORE_BEFORE"); got != c.env["SLOTCTL_STORE_BEFORE"] {
			t.Errorf("configEnv of another variable changed: %q", got)
		}
	}
}

// TestJobVarsNested: a nested run that waited only for some of its limits
// shows its own ticket, and in SLOTCTL_SLOTS (and SLOTCTL_SLOT, for its first
// limit) the ancestor's indexes in the limits they share.
func TestJobVarsNested(t *testing.T) {
	anc := store.Ticket{ID: "anc", Limit: "a", Limits: []string{"a", "b"}, Weight: 2, State: store.Held, Slot: 2,
		Indexes: map[string][]int{"a": {2, 3}, "b": {0, 1}}}
	own := store.Ticket{ID: "own", Limit: "c", State: store.Held, Slot: 4, Fence: 9}
	f := &Factory{Getenv: func(string) string { return "" }}
	got := map[string]string{}
	for _, kv := range jobVars([]string{"b", "c"}, own, anc, []string{"b"}, "bolt:///s.db", f) {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	for k, want := range map[string]string{"SLOTCTL_LIMIT": "b,c", "SLOTCTL_TICKET": "own", "SLOTCTL_FENCE": "9",
		"SLOTCTL_SLOT": "0", "SLOTCTL_SLOTS": "b=0,1 c=4"} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	// Not nested: its own ticket alone, as Ticket.SlotsVar says.
	own = store.Ticket{ID: "own", Limit: "a", Limits: []string{"a", "b"}, Weight: 2, State: store.Held, Slot: 2,
		Indexes: map[string][]int{"a": {2, 3}, "b": {0, 1}}}
	env := jobVars(own.Names(), own, store.Ticket{}, nil, "bolt:///s.db", f)
	if want := "SLOTCTL_SLOTS=a=2,3 b=0,1"; !slices.Contains(env, want) {
		t.Errorf("job variables %q, want %q among them", env, want)
	}
}
