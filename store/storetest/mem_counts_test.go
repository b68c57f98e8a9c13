package storetest_test

import (
	"fmt"
	"slices"
	"time"

	"github.com/slotctl/slotctl/store"
)

// count adds one event to its limit's counts, in the step that logs it (the
// caller holds the lock); an event of a limit that is gone counts nowhere.
func (s *memStore) count(e store.Event) {
	l := s.d.limits[e.Limit]
	if l == nil {
		return
	}
	if s.is("counts-first-limit-only") && len(e.Limits) > 1 && e.Limit != e.Limits[0] {
		return
	}
	if s.is("counts-racy") && e.Kind == string(store.Lost) { // added to a reading made before the lock was dropped
		c := l.counts
		c.Hold.Buckets = slices.Clone(c.Hold.Buckets)
		s.d.mu.Unlock()
		time.Sleep(staleWindow)
		s.d.mu.Lock()
		c.Add(e)
		l.counts = c
		return
	}
	l.counts.Limit = e.Limit
	l.counts.Add(e)
	if e.Kind == "admitted" && s.is("counts-admitted-twice") {
		l.counts.Add(e)
	}
}

// counts is Counts: copies of the named limits' counts, in name order.
func (s *memStore) counts(limits []string) ([]store.Counts, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	for _, n := range limits {
		if err := store.CheckLimitName(n); err != nil {
			return nil, err
		}
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	names := slices.Clone(limits)
	if len(names) == 0 {
		for n := range s.d.limits {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	out := []store.Counts{}
	for _, n := range names {
		l := s.d.limits[n]
		if l == nil {
			return nil, fmt.Errorf("%w: %s", store.ErrLimitNotFound, n)
		}
		c := l.counts
		if s.is("counts-from-log") { // a tally of the log, which forgets
			c = store.Counts{}
			for _, e := range s.d.events {
				if e.Limit == n {
					c.Add(e)
				}
			}
		}
		c.Limit = n
		c.Wait.Buckets = slices.Clone(c.Wait.Buckets)
		c.Hold.Buckets = slices.Clone(c.Hold.Buckets)
		out = append(out, c)
	}
	return out, nil
}
