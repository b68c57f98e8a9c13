package cli

import (
	"strings"

	"github.com/slotctl/slotctl/internal/proc"
)

// The child's environment (docs/leases.md §2.1, §4.5, §6).
//
// slotctl run exports SLOTCTL_STORE, the store it runs under, to its child.
// That variable also configures slotctl, and the exported value must not
// choose a nested slotctl's store when the operator did not choose it: so
// beside it the supervisor exports SLOTCTL_STORE_EXPORTED, the same value
// (a mark that the value is slotctl's own), and SLOTCTL_STORE_BEFORE, what
// SLOTCTL_STORE held for slotctl itself (absent if it was unset). A slotctl
// that finds SLOTCTL_STORE equal to SLOTCTL_STORE_EXPORTED reads
// SLOTCTL_STORE_BEFORE in its place when it reads its configuration: the
// operator's own setting, or none. A job that sets SLOTCTL_STORE itself
// (another value) is obeyed.
const (
	storeVar         = "SLOTCTL_STORE"
	storeExportedVar = "SLOTCTL_STORE_EXPORTED"
	storeBeforeVar   = "SLOTCTL_STORE_BEFORE"
)

// configEnv is the value of a configuration variable as the operator set it:
// SLOTCTL_STORE exported by an ancestor slotctl reads as what it held before.
func (f *Factory) configEnv(name string) string {
	if name == storeVar {
		if exp := f.Getenv(storeExportedVar); exp != "" && f.Getenv(storeVar) == exp {
			return f.Getenv(storeBeforeVar)
		}
	}
	return f.Getenv(name)
}

// storeVars are the store variables slotctl run adds to its child's
// environment when it runs under the store named store.
func (f *Factory) storeVars(store string) []string {
	env := []string{storeVar + "=" + store, storeExportedVar + "=" + store}
	if before := f.configEnv(storeVar); before != "" {
		env = append(env, storeBeforeVar+"="+before)
	}
	return env
}

// supervisorVar is SLOTCTL_SUPERVISOR=PID:START:PIDNS of this process, the
// supervisor: with SLOTCTL_TICKET, what a reaper identifies the job by.
func supervisorVar() []string {
	if m, ok := proc.SelfMarker(); ok {
		return []string{proc.SupervisorVar + "=" + m.String()}
	}
	return nil
}

// jobVarNames are the variables an ancestor's run put in the environment,
// which a new ticket's replace (or whose absence it means).
// slotctl acquire's keeper socket is among them: a job under a ticket of its
// own is not the keeper's.
var jobVarNames = []string{"SLOTCTL_LIMIT", proc.TicketVar, "SLOTCTL_FENCE", "SLOTCTL_SLOT", "SLOTCTL_SLOTS",
	proc.SupervisorVar, storeVar, storeExportedVar, storeBeforeVar, keeperVar}

// credentialVars never reach a child (docs/leases.md §4.5): a job is not trusted with
// the store's credentials. The username goes with the password: alone it
// only makes a nested slotctl on etcd fail for want of one.
var credentialVars = []string{"SLOTCTL_ETCD_PASSWORD", "SLOTCTL_ETCD_USERNAME"}

// childEnv is the child's environment: slotctl's own without credentials,
// and, for a new ticket (env not nil), without an ancestor's job variables
// and with env added.
func childEnv(environ, env []string) []string {
	drop := credentialVars
	if env != nil {
		drop = append(append([]string(nil), credentialVars...), jobVarNames...)
	}
	out := environ[:0:0]
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !contains(drop, name) {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
