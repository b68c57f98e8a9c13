package etcdstore

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/slotctl/slotctl/store"
)

// TestDecodeBounds: a ticket or event record on etcd is bounded as a
// request is, and a value over store.MaxRecord is refused before it is
// decoded (a member can write one as large as the server accepts).
func TestDecodeBounds(t *testing.T) {
	ticket := func(change func(r *rec)) []byte {
		r := rec{V: formatVersion, ID: "t0", Limit: "x", State: store.Waiting, Slot: -1, TTL: 1e9,
			Holder: store.Holder{Host: "h", Pid: 1, Argv: []string{"make"}}}
		change(&r)
		b, _ := json.Marshal(r)
		return b
	}
	if _, err := decodeRec([]byte("k"), "x", "t0", ticket(func(*rec) {})); err != nil {
		t.Fatalf("the base record: %v", err)
	}
	for name, b := range map[string][]byte{
		"host":         ticket(func(r *rec) { r.Holder.Host = strings.Repeat("h", store.MaxHost+1) }),
		"user":         ticket(func(r *rec) { r.Holder.User = strings.Repeat("u", store.MaxUser+1) }),
		"boot id":      ticket(func(r *rec) { r.Holder.BootID = strings.Repeat("b", store.MaxBootID+1) }),
		"label":        ticket(func(r *rec) { r.Holder.Label = strings.Repeat("l", store.MaxLabel+1) }),
		"command line": ticket(func(r *rec) { r.Holder.Argv = []string{strings.Repeat("c", store.MaxRecord)} }),
		"record":       ticket(func(r *rec) { r.Holder.Label = strings.Repeat("l", store.MaxRecord) }),
	} {
		if _, err := decodeRec([]byte("k"), "x", "t0", b); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("ticket %s over its bound: %v, want ErrCorrupt", name, err)
		}
	}
	var e eventRec
	big, _ := json.Marshal(eventRec{V: formatVersion, Event: store.Event{Kind: "admitted", Limit: "x", Ticket: "t0", Command: strings.Repeat("c", store.MaxRecord)}})
	if err := decode("event k", big, &e); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("an event over store.MaxRecord: %v, want ErrCorrupt", err)
	}
}
