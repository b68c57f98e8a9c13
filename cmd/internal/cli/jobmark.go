package cli

import (
	"strings"

	"github.com/slotctl/slotctl/internal/proc"
	"github.com/slotctl/slotctl/store"
)

// jobMarker is a store that keeps the owner's evidence of a job on this
// machine (a bbolt store's job markers).
type jobMarker interface {
	MarkJob(id string, m proc.Marker) (unmark func(), err error)
}

// markJob leaves the evidence that the job of ticket id, started with env,
// is this user's and not yet released: what lets slotctl reap kill what is
// left of it should this run die without releasing (docs/leases.md §4.3).
// It returns the function that removes it, to be called after the
// release. Where no marker can be made (an etcd store, a bells directory
// that cannot be written) the job runs all the same, and reap never kills
// what it leaves behind.
func markJob(st store.Store, log *logger, id string, env []string) func() {
	var sup string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, proc.SupervisorVar+"="); ok {
			sup = v
		}
	}
	jm, ok := st.(jobMarker)
	m, err := proc.ParseMarker(sup)
	if !ok || err != nil {
		return func() {}
	}
	unmark, err := jm.MarkJob(id, m)
	if err != nil {
		log.verbose("no job marker for ticket %s: %v (slotctl reap will not stop what this job leaves running)", short(id), err)
		return func() {}
	}
	return unmark
}
