// Package loopback picks loopback TCP ports for servers that tests start
// (etcd members take port numbers, not listeners).
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// lowest is the lowest port FreePort picks from: above the registered
// ports that a test machine's own services tend to use.
const lowest = 10000

// FreePort returns a loopback port that is free now. It picks, when it
// can, below the kernel's ephemeral range: a port from that range (what
// listening on ":0" gives) can be taken between the pick and the server's
// bind by the local end of any outgoing connection, such as a client of
// another member (seen: "bind: address already in use" for 5 s, on a
// loaded machine). The pick is random, so that test processes running
// beside each other rarely pick the same one.
func FreePort() (int, error) {
	if hi := ephemeralLow(); hi > lowest {
		for range 100 {
			p := lowest + rand.IntN(hi-lowest)
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
				l.Close()
				return p, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("no free loopback port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux;
// 32768, its default, elsewhere or when it cannot be read).
func ephemeralLow() int {
	lo, hi := 32768, 0
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if n, _ := fmt.Sscan(string(b), &lo, &hi); n != 2 {
			lo = 32768
		}
	}
	return lo
}
