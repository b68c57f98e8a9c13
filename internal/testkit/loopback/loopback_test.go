package loopback

import (
	"fmt"
	"net"
	"testing"
)

func TestFreePortIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	seen := map[int]bool{}
	for range 20 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if lo := ephemeralLow(); lo > lowest && (p < lowest || p >= lo) {
			t.Fatalf("port %d: want one in [%d, %d), below the ephemeral range", p, lowest, lo)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("listen on the free port %d: %v", p, err)
		}
		l.Close()
		seen[p] = true
	}
	if len(seen) < 10 {
		t.Errorf("20 picks gave %d ports: want them spread, so that test processes side by side rarely collide", len(seen))
	}
}
