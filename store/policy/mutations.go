package policy

import (
	"slices"
	"sync"

	"github.com/slotctl/slotctl/store"
)

// Test-only mutations (internal/mutation). Each re-introduces a bug of
// docs/leases.md so that the simulation can prove it catches it; with nil
// Options.Mutations none of this runs, and without the build tag
// slotctl_mutations none of it is linked in.

// mutScan is what a store handle's last dry-run reap read: the tickets it
// listed as removable (a reap "job queue") and every deadline it saw.
type mutScan struct {
	mu        sync.Mutex
	listed    map[string]string // ticket id -> limit
	deadlines map[string]Rec
}

func (m *mutScan) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listed, m.deadlines = map[string]string{}, map[string]Rec{}
}

func (m *mutScan) note(r Rec, gone bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.deadlines == nil {
		m.listed, m.deadlines = map[string]string{}, map[string]Rec{}
	}
	m.deadlines[r.ID] = r
	if gone {
		m.listed[r.ID] = r.Limit
	}
}

// mutStaleVerdict (StaleVerdict) judges expiry on the deadline the last scan
// read, when it read one, instead of on the record of this step; a ticket
// the scan read is judged by that deadline alone.
func (x *step) mutStaleVerdict(in *SettleInput) {
	m := &x.s.scan
	m.mu.Lock()
	defer m.mu.Unlock()
	scanned := map[string]bool{}
	for i := range in.Tickets {
		q := &in.Tickets[i]
		old, ok := m.deadlines[q.Ticket.ID]
		if !ok {
			continue
		}
		scanned[q.Ticket.ID] = true
		q.Expired = ""
		if old.DeadlineBoot != x.now.Boot || x.now.Mono >= old.DeadlineMono {
			q.Expired = "expired (as scanned)"
		}
	}
	if judge := in.Judge; judge != nil {
		in.Judge = func(t store.Ticket, act bool) (string, bool) {
			if scanned[t.ID] {
				return "", false
			}
			return judge(t, act)
		}
	}
}

// mutFreeOne (ReleaseCounter) admits one waiter beyond the held count of the
// limit: what decrementing a counter for a ticket that is not there does.
func (x *step) mutFreeOne(limit string) error {
	lim, ok, err := x.tx.Limit(limit)
	if err != nil || !ok {
		return err
	}
	recs, names, err := x.gather([]string{limit})
	if err != nil {
		return err
	}
	in, err := x.planInput(recs, names)
	if err != nil {
		return err
	}
	held := 0
	for _, r := range recs {
		if r.State == store.Held && r.Has(limit) {
			held += r.Weighs()
		}
	}
	in.Slots[limit], in.Judge = max(held+1, lim.Slots), nil
	for i := range in.Tickets {
		in.Tickets[i].Expired = "" // no sweep: only the promotion
	}
	_, _, err = x.apply(recs, PlanSettle(in), "")
	return err
}

// mutReleaseSlot (ReleaseNoCompare) removes whichever ticket holds the slot
// t held: a release keyed by the slot, not by the caller's own ticket.
func (x *step) mutReleaseSlot(t store.Ticket, why store.Reason) error {
	if t.State != store.Held || store.CheckLimitName(t.Limit) != nil {
		return nil
	}
	recs, err := x.tx.Queue(t.Limit)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.State == store.Held && slices.Contains(r.In(t.Limit), t.Slot) {
			if err := x.remove(r, why, "", nil); err != nil {
				return err
			}
			_, _, err := x.settle(r.Names(), false)
			return err
		}
	}
	return nil
}

// mutBlindReap (BlindReap) frees one more slot for each ticket of limit that
// the last scan listed and that this reap did not delete: another reaper or
// its holder removed it already, and its slot is freed a second time.
func (x *step) mutBlindReap(limit string, removed []store.Removal) error {
	m := &x.s.scan
	m.mu.Lock()
	var listed []string
	for id, l := range m.listed {
		if l == limit {
			listed = append(listed, id)
			delete(m.listed, id) // a reap job runs once
		}
	}
	m.mu.Unlock()
	slices.Sort(listed)
	for _, id := range listed {
		if slices.ContainsFunc(removed, func(r store.Removal) bool { return r.Ticket.ID == id }) {
			continue
		}
		if _, live, err := x.tx.Lookup(id); err != nil || live {
			if err != nil {
				return err
			}
			continue
		}
		if err := x.mutFreeOne(limit); err != nil {
			return err
		}
	}
	return nil
}

// mutSupersedeFirst removes the older waiting tickets of req's key that
// share a limit with it in a step of their own, before the step that
// writes req's ticket: a newer run waits for older ones while a crash
// between the two steps leaves neither (mutation.SupersedeFirst).
func (x *step) mutSupersedeFirst(req store.EnqueueRequest) error {
	recs, _, err := x.gather(req.Names())
	if err != nil {
		return err
	}
	by := store.SuccessorOf(store.Ticket{ID: req.ID, Holder: req.Holder})
	for _, o := range recs {
		if o.Key == req.Key && o.State == store.Waiting && slices.ContainsFunc(req.Names(), o.Has) {
			if !x.fits(o) {
				return nil
			}
			if err := x.remove(o, store.Superseded, "superseded by ticket "+req.ID, &by); err != nil {
				return err
			}
		}
	}
	return nil
}
