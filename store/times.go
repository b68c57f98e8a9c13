package store

import "time"

// WaitedFor is Event.Waited of a ticket created at created and admitted at
// now, by the wall clock: never negative (a wall clock stepped back waited 0).
func WaitedFor(created, now time.Time) time.Duration {
	if created.IsZero() {
		return 0
	}
	return max(now.Sub(created), 0)
}

// HeldFor is Event.Held of a ticket admitted at admitted and removed at now,
// by the wall clock. It is at least a nanosecond, so that Counts.Add, which
// counts a hold only when Held is set, counts every held ticket removed even
// when the wall clock stood still or stepped back meanwhile.
func HeldFor(admitted, now time.Time) time.Duration {
	if admitted.IsZero() {
		return time.Nanosecond
	}
	return max(now.Sub(admitted), time.Nanosecond)
}
