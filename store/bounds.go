package store

import (
	"fmt"
	"unicode/utf8"
)

// Size bounds of what a ticket and an event carry (docs/leases.md §4.5). A
// member of a shared store's group can write any record, and every reader
// (root's ls, the packaged reaper under its MemoryMax=) decodes them: each
// bound is checked when a request is made (EnqueueRequest.Check) and again
// when a record is decoded, so that no record costs a reader more than a
// few MB. A backend refuses a stored value longer than MaxRecord before it
// decodes it, and a record that a request could not have written is
// ErrCorrupt.
const (
	// MaxHost is the longest host name: a DNS name is at most 253 bytes.
	MaxHost = 255
	// MaxUser is the longest user name (useradd allows 32).
	MaxUser = 256
	// MaxBootID is the longest boot id (the kernel's is a 36-byte UUID).
	MaxBootID = 64
	// MaxLabel is the longest --label: a line in ls, not a document.
	MaxLabel = 1024
	// MaxCommand bounds the command line a request stores for display: its
	// arguments' bytes plus one for each argument. A longer one is kept
	// cut (CutArgv); the child still gets the whole of it. Records written
	// before the bound kept it whole, so a stored one is bounded by
	// MaxRecord alone (CheckStoredHolder).
	MaxCommand = 4096
	// MaxEvidence is the longest evidence of a reap in the event log.
	MaxEvidence = 4096
	// MaxTicketSlots bounds the slots one ticket holds over all its limits
	// (its weight times its limits), and so the slot indexes it records.
	MaxTicketSlots = MaxSlots
	// MaxRecord is the longest stored value a backend decodes: a ticket
	// with every text field at its bound, each byte escaped, and
	// MaxTicketSlots slot indexes fit in it with room to spare.
	MaxRecord = 1 << 20
)

// CheckRecordSize returns an error wrapping ErrCorrupt for a stored value
// longer than MaxRecord. Backends call it before decoding anything.
func CheckRecordSize(n int) error {
	if n > MaxRecord {
		return fmt.Errorf("%w: a record of %d bytes: a request writes at most %d", ErrCorrupt, n, MaxRecord)
	}
	return nil
}

// CommandBytes is the size of a command line as MaxCommand counts it.
func CommandBytes(argv []string) int {
	n := 0
	for _, a := range argv {
		n += len(a) + 1
	}
	return n
}

// CutArgv returns argv within MaxCommand: argv itself when it fits, else
// as many of its arguments as fit, the last one cut at a character
// boundary, followed by "…".
func CutArgv(argv []string) []string {
	if CommandBytes(argv) <= MaxCommand {
		return argv
	}
	const more = "…"
	room := MaxCommand - (len(more) + 1)
	var out []string
	for _, a := range argv {
		if len(a)+1 > room {
			cut := max(room-1, 0)
			for cut > 0 && !utf8.RuneStart(a[cut]) {
				cut--
			}
			if cut > 0 {
				out = append(out, a[:cut])
			}
			break
		}
		out = append(out, a)
		room -= len(a) + 1
	}
	return append(out, more)
}

// CheckHolder returns an error wrapping ErrInvalid for a holder whose text
// is longer than its bound (host, user, boot id, label, command line, URL):
// what a request may store.
func CheckHolder(h Holder) error {
	if CommandBytes(h.Argv) > MaxCommand {
		return fmt.Errorf("%w: command line of %d bytes: want at most %d", ErrInvalid, CommandBytes(h.Argv), MaxCommand)
	}
	return CheckStoredHolder(h)
}

// CheckStoredHolder is CheckHolder for a holder read from a store: its
// command line is bounded by the record's size alone.
func CheckStoredHolder(h Holder) error {
	switch {
	case len(h.Host) > MaxHost:
		return fmt.Errorf("%w: host name of %d bytes: want at most %d", ErrInvalid, len(h.Host), MaxHost)
	case len(h.User) > MaxUser:
		return fmt.Errorf("%w: user name of %d bytes: want at most %d", ErrInvalid, len(h.User), MaxUser)
	case len(h.BootID) > MaxBootID:
		return fmt.Errorf("%w: boot id of %d bytes: want at most %d", ErrInvalid, len(h.BootID), MaxBootID)
	case len(h.Label) > MaxLabel:
		return fmt.Errorf("%w: label of %d bytes: want at most %d", ErrInvalid, len(h.Label), MaxLabel)
	}
	return CheckURL(h.URL)
}

// CheckEventText returns an error wrapping ErrInvalid for an event whose
// text is longer than a store writes (host, user, evidence; its command,
// like a stored holder's, is bounded by the record's size).
func CheckEventText(e Event) error {
	switch {
	case len(e.Host) > MaxHost:
		return fmt.Errorf("%w: event host name of %d bytes: want at most %d", ErrInvalid, len(e.Host), MaxHost)
	case len(e.User) > MaxUser:
		return fmt.Errorf("%w: event user name of %d bytes: want at most %d", ErrInvalid, len(e.User), MaxUser)
	case len(e.Evidence) > MaxEvidence:
		return fmt.Errorf("%w: event evidence of %d bytes: want at most %d", ErrInvalid, len(e.Evidence), MaxEvidence)
	}
	return nil
}

// CheckTicketSlots returns an error wrapping ErrInvalid for a ticket of
// limits limits and weight weight that holds more than MaxTicketSlots slots.
func CheckTicketSlots(limits, weight int) error {
	if limits*max(weight, 1) > MaxTicketSlots {
		return fmt.Errorf("%w: weight %d in %d limits holds %d slots: want at most %d in all", ErrInvalid, weight, limits, limits*weight, MaxTicketSlots)
	}
	return nil
}
