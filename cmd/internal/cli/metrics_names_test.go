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

	metricPolicyInfo = promtext.PolicyInfo
	metricAging      = promtext.Aging
	metricRateN      = promtext.RateN
	metricRatePer    = promtext.RatePer
	metricRateLeft   = promtext.RateLeft
	metricRateOpens  = promtext.RateOpens
)
