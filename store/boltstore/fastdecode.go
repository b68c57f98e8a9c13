package boltstore

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/slotctl/slotctl/store"
)

// decodeTicketFast reads a stored ticket in the form encode writes it,
// without encoding/json's reflection: reading the tickets of a large store
// (ls, a settle of a long queue) is mostly their decoding. It accepts a
// strict subset of JSON: known fields only, in the order encoding/json
// writes them (so each at most once), no whitespace, no null, no empty list
// or object, integers only (no fraction, exponent, leading zero or "-0"),
// and nothing after the closing brace. On anything else it returns false,
// leaving r partly written, and the caller decodes with encoding/json: so a
// record it accepts decodes to what encoding/json makes of it, and is then
// checked alike (FuzzDecodeTicketFast holds it to that).
func decodeTicketFast(v []byte, r *ticketRec) bool {
	p := recReader{b: v}
	if !p.byte('{') {
		return false
	}
	last := 0
	for {
		name, ok := p.key()
		if !ok {
			return false
		}
		var f int
		if len(name) <= 5 {
			f, ok = p.shortTicketField(name, r)
		} else {
			f, ok = p.longTicketField(name, r)
		}
		if f <= last || !ok {
			return false // unknown, repeated, out of order or unreadable
		}
		last = f
		if p.byte(',') {
			continue
		}
		return p.byte('}') && p.i == len(p.b)
	}
}

// shortTicketField reads the value of the ticketRec field called name (of
// five bytes or fewer) into r, and returns the field's place in the JSON: 0
// for a name encoding/json does not write. A field's value is read where
// its name is matched, so that it costs one call; splitting the names by
// length keeps each switch small for one compare more.
func (p *recReader) shortTicketField(name []byte, r *ticketRec) (f int, ok bool) {
	switch string(name) {
	case "v":
		r.V, ok = p.int()
		return 1, ok
	case "id":
		r.ID, ok = p.str()
		return 2, ok
	case "limit":
		r.Limit, ok = p.str()
		return 3, ok
	case "state":
		r.State, ok = p.state()
		return 4, ok
	case "fence":
		r.Fence, ok = p.uint(math.MaxUint64)
		return 7, ok
	case "slot":
		r.Slot, ok = p.int()
		return 8, ok
	case "quiet":
		r.Quiet, ok = p.bool()
		return 13, ok
	case "key":
		r.Key, ok = p.str()
		return 19, ok
	case "stop":
		r.Stop = new(store.Successor)
		return 20, p.successor(r.Stop)
	case "share":
		r.Share, ok = p.str()
		return 23, ok
	}
	return 0, false
}

// longTicketField is shortTicketField for the names of six bytes or more.
func (p *recReader) longTicketField(name []byte, r *ticketRec) (f int, ok bool) {
	switch string(name) {
	case "limits":
		r.Limits, ok = p.strs()
		return 5, ok
	case "weight":
		r.Weight, ok = p.int()
		return 6, ok
	case "indexes":
		r.Indexes, ok = p.indexes()
		return 9, ok
	case "ttl_ns":
		r.TTL, ok = p.duration()
		return 10, ok
	case "deadline_boot":
		r.DeadlineBoot, ok = p.str()
		return 11, ok
	case "deadline_mono_ns":
		r.DeadlineMono, ok = p.duration()
		return 12, ok
	case "created":
		return 14, p.time(&r.Created)
	case "admitted":
		return 15, p.time(&r.Admitted)
	case "renewed":
		return 16, p.time(&r.Renewed)
	case "holder":
		return 17, p.holder(&r.Holder)
	case "bell_uid":
		var n uint64
		if n, ok = p.uint(math.MaxUint32); ok {
			u := uint32(n)
			r.BellUID = &u
		}
		return 18, ok
	case "replaces":
		r.Replaces, ok = p.strs()
		return 21, ok
	case "priority":
		r.Priority, ok = p.int()
		return 22, ok
	}
	return 0, false
}

// holder reads a ticket's holder, each field as its name is matched.
func (p *recReader) holder(h *store.Holder) bool {
	if !p.byte('{') {
		return false
	}
	last := 0
	for {
		name, ok := p.key()
		if !ok {
			return false
		}
		var f int
		switch string(name) {
		case "host":
			f = 1
			h.Host, ok = p.str()
		case "user":
			f = 2
			h.User, ok = p.str()
		case "boot_id":
			f = 3
			h.BootID, ok = p.str()
		case "pidns":
			f = 4
			h.PidNS, ok = p.uint(math.MaxUint64)
		case "pid":
			f = 5
			h.Pid, ok = p.int()
		case "pid_start":
			f = 6
			h.PidStart, ok = p.uint(math.MaxUint64)
		case "pgid":
			f = 7
			h.Pgid, ok = p.int()
		case "pgid_start":
			f = 8
			h.PgidStart, ok = p.uint(math.MaxUint64)
		case "argv":
			f = 9
			h.Argv, ok = p.strs()
		case "label":
			f = 10
			h.Label, ok = p.str()
		case "url":
			f = 11
			h.URL, ok = p.str()
		}
		if f <= last || !ok {
			return false // unknown (f is 0), repeated, out of order or unreadable
		}
		last = f
		if !p.byte(',') {
			return p.byte('}')
		}
	}
}

// successor reads a ticket's successor, each field as its name is matched.
func (p *recReader) successor(s *store.Successor) bool {
	if !p.byte('{') {
		return false
	}
	last := 0
	for {
		name, ok := p.key()
		if !ok {
			return false
		}
		var f int
		switch string(name) {
		case "ticket":
			f = 1
			s.Ticket, ok = p.str()
		case "host":
			f = 2
			s.Host, ok = p.str()
		case "pid":
			f = 3
			s.Pid, ok = p.int()
		case "url":
			f = 4
			s.URL, ok = p.str()
		}
		if f <= last || !ok {
			return false // unknown (f is 0), repeated, out of order or unreadable
		}
		last = f
		if !p.byte(',') {
			return p.byte('}')
		}
	}
}

// recReader reads the JSON of one record, strictly (see decodeTicketFast).
type recReader struct {
	b []byte
	i int
}

func (p *recReader) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// key reads `"name":`. A name with an escape in it matches no field.
func (p *recReader) key() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) && p.b[p.i] != '"' {
		p.i++
	}
	name := p.b[start:p.i]
	return name, p.byte('"') && p.byte(':')
}

// strToken reads a string and returns it with its quotes; plain is false
// when it holds an escape or a byte above ASCII, which encoding/json then
// unquotes (it also replaces invalid UTF-8).
func (p *recReader) strToken() (tok []byte, plain, ok bool) {
	if !p.byte('"') {
		return nil, false, false
	}
	start := p.i - 1
	plain = true
	for p.i < len(p.b) {
		if c := p.b[p.i]; c >= 0x20 && c < 0x80 && c != '"' && c != '\\' { // printable ASCII, as it is
			p.i++
			continue
		}
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start:p.i], plain, true
		case c == '\\':
			plain = false
			p.i += 2 // the escaped byte cannot end the string
		case c < 0x20:
			return nil, false, false // not JSON
		case c >= 0x80:
			plain = false
			p.i++
		default:
			p.i++
		}
	}
	return nil, false, false
}

func (p *recReader) str() (string, bool) {
	tok, plain, ok := p.strToken()
	if !ok {
		return "", false
	}
	if plain {
		return string(tok[1 : len(tok)-1]), true
	}
	var s string
	if json.Unmarshal(tok, &s) != nil {
		return "", false
	}
	return s, true
}

// state reads a ticket's state: a state the store writes without a new
// string each time.
func (p *recReader) state() (store.State, bool) {
	for _, st := range [...]store.State{store.Held, store.Waiting} {
		if rest := p.b[p.i:]; len(rest) >= len(st)+2 && rest[0] == '"' && string(rest[1:1+len(st)]) == string(st) && rest[1+len(st)] == '"' {
			p.i += len(st) + 2
			return st, true
		}
	}
	s, ok := p.str()
	return store.State(s), ok
}

// strs reads a list of one or more strings.
func (p *recReader) strs() ([]string, bool) {
	if !p.byte('[') {
		return nil, false
	}
	var buf [8]string // a command line's words, mostly: one allocation of the list
	out := buf[:0]
	for {
		s, ok := p.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		if !p.byte(',') {
			return slices.Clone(out), p.byte(']')
		}
	}
}

// indexes reads a map of one or more limits to one or more ints each; a
// name repeated (encoding/json would keep the last) is left to it.
func (p *recReader) indexes() (map[string][]int, bool) {
	if !p.byte('{') {
		return nil, false
	}
	m := map[string][]int{}
	for {
		k, ok := p.str()
		if !ok || !p.byte(':') || !p.byte('[') {
			return nil, false
		}
		if _, dup := m[k]; dup {
			return nil, false
		}
		var ix []int
		for {
			n, ok := p.int()
			if !ok {
				return nil, false
			}
			ix = append(ix, n)
			if !p.byte(',') {
				break
			}
		}
		if !p.byte(']') {
			return nil, false
		}
		m[k] = ix
		if !p.byte(',') {
			return m, p.byte('}')
		}
	}
}

// uint reads a decimal integer of at most max, without a leading zero.
func (p *recReader) uint(max uint64) (uint64, bool) {
	start := p.i
	var n uint64
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c < '0' || c > '9' {
			break
		}
		d := uint64(c - '0')
		if n > (max-d)/10 {
			return 0, false // out of range: encoding/json refuses it
		}
		n = n*10 + d
		p.i++
	}
	if p.i == start || p.b[start] == '0' && p.i-start > 1 {
		return 0, false
	}
	return n, true
}

// int64 reads a signed decimal integer of bits bits.
func (p *recReader) int64(bits int) (int64, bool) {
	neg := p.byte('-')
	max := uint64(1)<<(bits-1) - 1
	if neg {
		max++
	}
	n, ok := p.uint(max)
	if !ok || neg && n == 0 {
		return 0, false
	}
	if neg {
		return -int64(n), true // n = 1<<63 wraps to math.MinInt64, as it should
	}
	return int64(n), true
}

func (p *recReader) int() (int, bool) {
	n, ok := p.int64(strconv.IntSize)
	return int(n), ok
}

func (p *recReader) duration() (time.Duration, bool) {
	n, ok := p.int64(64)
	return time.Duration(n), ok
}

func (p *recReader) bool() (bool, bool) {
	rest := p.b[p.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		p.i += 4
		return true, true
	case len(rest) >= 5 && string(rest[:5]) == "false":
		p.i += 5
		return false, true
	}
	return false, false
}

// time reads a time as encoding/json does: the token, quotes and all, to
// time.Time's UnmarshalJSON.
func (p *recReader) time(t *time.Time) bool {
	tok, _, ok := p.strToken()
	return ok && t.UnmarshalJSON(tok) == nil
}
