package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/slotctl/slotctl/gate"
	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/boltstore"
)

// Exit codes of docs/leases.md §3 that slotctl itself chooses.
const (
	exitUsage       = 64
	exitUnavailable = 69
	exitInternal    = 70
	exitBusy        = 75
	exitLost        = 76
	exitMaxHold     = 124
	exitReplaced    = 143 // 128+SIGTERM: stopped for a newer run of the key (docs/leases.md §2.1 item 10)
	exitCannotExec  = 126
	exitNotFound    = 127
)

// ExitError ends a command with a given exit code. Err, if not nil, is
// printed as "slotctl: ..."; Hint, if not empty, at the end of that same
// line, after "; " (docs/leases.md §7: exactly one line, and a hint belongs in it).
type ExitError struct {
	Code int
	Err  error
	Hint string
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// usageError is a bad flag, argument or configuration: exit 64.
func usageError(format string, args ...any) error {
	return &ExitError{Code: exitUsage, Err: fmt.Errorf(format, args...)}
}

// exitCode maps an error to docs/leases.md §3's exit codes, translating store errors once, here.
func exitCode(err error) int {
	var ee *ExitError
	var conflict *store.SlotsConflictError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.Code
	case errors.As(err, &conflict), errors.Is(err, store.ErrInvalid),
		errors.Is(err, store.ErrLimitNotFound), errors.Is(err, store.ErrLimitInUse):
		return exitUsage
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, store.ErrCorrupt):
		return exitUnavailable
	case errors.Is(err, gate.ErrBusy):
		return exitBusy
	default:
		return exitInternal
	}
}

// hint is the advice printed at the end of an error's line, if any.
func hint(err error) string {
	var ee *ExitError
	if errors.As(err, &ee) && ee.Hint != "" {
		return ee.Hint
	}
	var conflict *store.SlotsConflictError
	var locked *store.LockTimeoutError
	var remote *boltstore.NetworkFSError
	switch {
	case errors.As(err, &conflict):
		return fmt.Sprintf("to resize it: slotctl limit set %s %d", conflict.Limit, conflict.Want)
	case errors.As(err, &locked):
		return "try again, or wait longer with --store-timeout (SLOTCTL_STORE_TIMEOUT)"
	case errors.As(err, &remote):
		return "e.g. --store etcd://HOST:2379"
	case errors.Is(err, store.ErrLimitInUse):
		return "wait for its tickets to go, or pass --force to remove them"
	case errors.Is(err, store.ErrCorrupt):
		return "move the file aside (slotctl will start a new one) or point --store elsewhere"
	}
	return ""
}

// printError writes err on w as exactly one line, "slotctl: MESSAGE; HINT".
func printError(w io.Writer, err error) {
	fmt.Fprint(w, errorLine(err))
}

// errorLine is what printError writes: "" for an ExitError without a message.
func errorLine(err error) string {
	var ee *ExitError
	if errors.As(err, &ee) && ee.Err == nil {
		return ""
	}
	msg := strings.TrimSpace(err.Error())
	if h := strings.TrimSpace(hint(err)); h != "" {
		msg += "; " + h
	}
	return "slotctl: " + escapeControls(strings.ReplaceAll(msg, "\n", " ")) + "\n"
}
