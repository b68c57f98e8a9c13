package boltstore

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/slotctl/slotctl/store"
	"github.com/slotctl/slotctl/store/policy"
)

// FuzzFastState: reading the state without decoding must agree with the
// decoder on every record the store writes, and never disagree with it on
// anything else that decodes.
func FuzzFastState(f *testing.F) {
	f.Add("a", "build", "", uint16(1), "held", "make", "", "b1", int64(3600e9))
	f.Add("b-1_x", "x.y:z", "db", uint16(2), "waiting", `say "state":"held"`, `"state":"held"`, `"deadline_boot":"x"`, int64(-5))
	f.Add("c", "x", "y", uint16(65535), "held", `"limits":["a","b"]`, `"weight":7`, "b1", int64(1))
	f.Fuzz(func(t *testing.T, id, limit, limit2 string, weight uint16, state, arg, label, boot string, mono int64) {
		limits := []string{limit}
		if limit2 != "" {
			limits = append(limits, limit2)
		}
		if store.CheckID(id) != nil || store.CheckLimits(limits) != nil || weight == 0 {
			return // the store refuses these before writing anything
		}
		r := ticketRec{V: formatVersion, Rec: policy.Rec{ID: id, Limit: limit, State: store.State(state), Slot: -1,
			DeadlineBoot: boot, DeadlineMono: time.Duration(mono),
			Holder: store.Holder{Argv: []string{arg}, Label: label, Host: arg, User: label, BootID: boot}}}
		if len(limits) > 1 || weight > 1 { // else stored without them, as version 1 did
			r.Limits, r.Weight = limits, int(weight)
		}
		if r.State == store.Held && r.Limits != nil {
			r.Slot, r.Indexes = 0, map[string][]int{}
			for _, l := range limits {
				for i := range int(weight) {
					r.Indexes[l] = append(r.Indexes[l], i)
				}
			}
		}
		v := encode(&r)
		got, ok := fastState(v)
		if r.State == store.Held || r.State == store.Waiting {
			if !ok || got != r.State {
				t.Fatalf("fastState(%s) = %q, %v; want %q", v, got, ok, r.State)
			}
		} else if ok {
			t.Fatalf("fastState(%s) = %q for state %q", v, got, r.State)
		}
		var back ticketRec
		if decode(v, &back) == nil && ok && back.State != got {
			t.Fatalf("fastState %q, decoder %q", got, back.State)
		}
		// fastFields may decline (then the caller decodes), never misread.
		fx, ok := fastFields(v)
		if ok && (fx.state != r.State || fx.boot != r.DeadlineBoot || fx.deadline != r.DeadlineMono || fx.weight != r.Weighs()) {
			t.Fatalf("fastFields(%s) = %+v, want %q %q %d weight %d", v, fx, r.State, r.DeadlineBoot, r.DeadlineMono, r.Weighs())
		}
		if ok && len(limits) > 1 && !slices.Equal(fx.limits, limits) || ok && len(limits) == 1 && fx.limits != nil {
			t.Fatalf("fastFields(%s) read limits %q, want %q", v, fx.limits, limits)
		}
	})
}

// FuzzDecodeTicketFast: whatever the fast reader accepts, encoding/json
// decodes without error to the very same record; the decode and checks
// after it are then the same.
func FuzzDecodeTicketFast(f *testing.F) {
	for _, r := range seedRecords()[:7] {
		f.Add(encode(r))
	}
	for _, s := range extraSeeds {
		f.Add([]byte(s))
	}
	for _, s := range []string{
		`{"v":2,"id":"b","limit":"x","state":"held","fence":18446744073709551615,"slot":-9223372036854775808,"ttl_ns":9223372036854775807}`,
		`{"v":2,"id":"b","fence":18446744073709551616}`, `{"v":2,"slot":-9223372036854775809}`, `{"v":2,"slot":-0}`, `{"v":02}`,
		`{"v":2,"slot":1.0}`, `{"v":2,"slot":1e3}`, `{"v":2,"bell_uid":4294967296}`, `{"v":2,"bell_uid":4294967295}`, `{"v":2,"bell_uid":-1}`,
		`{"v":2,"id":"a\u0062","limit":"\ud800","holder":{"host":"\u003c\u2028","argv":["a\"b\\c","\u00e9\ud83d\ude00"]}}`,
		"{\"v\":2,\"id\":\"\xff\xfe\",\"holder\":{\"user\":\"\xc3\"}}", "{\"v\":2,\"id\":\"a\x01\"}", `{"v":2,"id":"a\x"}`, `{"v":2,"id":"a\`,
		`{"v":2,"ID":"b"}`, `{"v":2,"i\u0064":"b"}`, `{"v":2,"id":"b","id":"c"}`, `{"id":"b","v":2}`, `{"v":2,"other":1}`, `{"v":2 }`, ` {"v":2}`,
		`{"v":2,"limits":[]}`, `{"v":2,"limits":null}`, `{"v":2,"indexes":{}}`, `{"v":2,"indexes":{"x":[]}}`, `{"v":2,"indexes":{"x":[1],"x":[2]}}`,
		`{"v":2,"indexes":{"x":[1,2],"y":[3]}}`, `{"v":2,"quiet":true}`, `{"v":2,"quiet":false}`, `{"v":2,"quiet":tru}`, `{"v":2,"quiet":1}`,
		`{"v":2,"created":"2025-03-01T12:00:00.5+01:00","admitted":"2025-03-01T12:00:00Z","renewed":"0001-01-01T00:00:00Z"}`,
		`{"v":2,"created":"2025-03-01T12:00:00\u005a"}`, `{"v":2,"created":"2025-3-01T12:00:00Z"}`, `{"v":2,"created":null}`,
		`{"v":2,"holder":{}}`, `{"v":2,"holder":{"pid":1,"host":"h"}}`, `{"v":2,"stop":{"ticket":"n","pid":-3}}`, `{"v":2,"stop":{}}`,
		`{"v":2,"replaces":["a","b"],"priority":-1000,"share":"s"}`, `{"v":2}x`, `{"v":2}` + "\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast, slow ticketRec
		if !decodeTicketFast(b, &fast) {
			return
		}
		if err := json.Unmarshal(b, &slow); err != nil {
			t.Fatalf("fast reader accepted %q, which encoding/json refuses: %v", b, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("fast reader read %q as\n%+v\nencoding/json as\n%+v", b, fast, slow)
		}
	})
}

// FuzzDecodeTicketFastReadsStored: every ticket the store could write is
// read by the fast reader (not only by its fallback), as encoding/json reads it.
func FuzzDecodeTicketFastReadsStored(f *testing.F) {
	f.Add("a", "build", "", uint16(1), true, "make", "", "https://ci/x?a=<b>&c", "k", int64(3600e9), int64(1e9), int64(-3), 7, uint8(0))
	f.Add("b-1_x", "x.y:z", "db", uint16(2), false, "say \"é\u2028\x7f\"", "lbl\n", "", "", int64(-5), int64(0), int64(1), -1000, uint8(3))
	f.Add("c", "x", "y", uint16(3), true, "\xff\x00", "\u202e", "u", "main \"q\"", int64(math.MaxInt64), int64(math.MinInt64), int64(1e18), 1000, uint8(7))
	f.Fuzz(func(t *testing.T, id, limit, limit2 string, weight uint16, held bool, arg, label, url, key string, mono, ttl, wall int64, prio int, opt uint8) {
		limits := []string{limit}
		if limit2 != "" {
			limits = append(limits, limit2)
		}
		if store.CheckID(id) != nil || store.CheckLimits(limits) != nil || weight == 0 {
			return
		}
		at := time.Unix(0, wall).In(time.FixedZone("", int(mono%50400)/60*60))
		uid := uint32(ttl)
		r := ticketRec{V: formatVersion, Rec: policy.Rec{ID: id, Limit: limit, State: store.Waiting, Fence: uint64(mono), Slot: -1,
			TTL: time.Duration(ttl), DeadlineBoot: url, DeadlineMono: time.Duration(mono), Quiet: opt&1 != 0, Created: at, Key: key,
			Holder: store.Holder{Host: arg, User: label, BootID: key, PidNS: uint64(wall), Pid: prio, PidStart: uint64(ttl),
				Pgid: -prio, PgidStart: uint64(mono), Argv: []string{arg, label, url}, Label: label, URL: url},
			BellUID: &uid, Priority: prio, Share: label}}
		if held {
			r.State, r.Slot, r.Admitted, r.Renewed = store.Held, 0, at.Add(time.Second), at.Add(time.Minute)
		}
		if len(limits) > 1 || weight > 1 {
			r.Limits, r.Weight = limits, int(weight)
			if held {
				r.Indexes = map[string][]int{}
				for _, l := range limits {
					for i := range int(weight) {
						r.Indexes[l] = append(r.Indexes[l], i)
					}
				}
			}
		}
		if opt&2 != 0 {
			r.Stop = &store.Successor{Ticket: id, Host: arg, Pid: prio, URL: url}
		}
		if opt&4 != 0 {
			r.Replaces = []string{id, key, label}
		}
		v := encode(&r)
		var fast, slow ticketRec
		if !decodeTicketFast(v, &fast) {
			t.Fatalf("fast reader declined a ticket the store writes: %s", v)
		}
		if err := json.Unmarshal(v, &slow); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("fast reader read %s as\n%+v\nencoding/json as\n%+v", v, fast, slow)
		}
	})
}
