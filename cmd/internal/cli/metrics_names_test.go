package cli

import "github.com/slotctl/slotctl/cmd/internal/promtext"

// The metric names, as the tests call them.
const (
	metricSlots     = promtext.Slots
	metricHeld      = promtext.Held
	metricWaiting   = promtext.Waiting
	metricPaused    = promtext.Paused
	metricWaiterAge = promtext.WaiterAge
	metricHolderAge = promtext.HolderAge
	metricWaitTime  = promtext.WaitTime
	metricHoldTime  = promtext.HoldTime
)
