package cli

import (
	"slices"
	"testing"
)

func TestChildEnv(t *testing.T) {
	environ := []string{"PATH=/bin", "SLOTCTL_ETCD_PASSWORD=pw", "SLOTCTL_ETCD_USERNAME=u", "SLOTCTL_TICKET=old",
		"SLOTCTL_SUPERVISOR=1:2:3", "SLOTCTL_STORE=/a", "SLOTCTL_STORE_EXPORTED=/a", "SLOTCTL_STORE_BEFORE=/b", "SLOTCTL_TTL=1m"}
	// A nested run: the ancestor's job variables pass, credentials never.
	got := childEnv(environ, nil)
	want := []string{"PATH=/bin", "SLOTCTL_TICKET=old", "SLOTCTL_SUPERVISOR=1:2:3", "SLOTCTL_STORE=/a",
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
