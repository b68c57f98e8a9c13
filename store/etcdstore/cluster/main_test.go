package cluster

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/slotctl/slotctl/internal/testkit/testguard"
)

// memberEnv carries a member's configuration (JSON) to the test binary
// re-executed as that member.
const memberEnv = "SLOTCTLTEST_CLUSTER_MEMBER"

// idleEnv makes the re-executed test binary block forever, doing nothing.
const idleEnv = "SLOTCTLTEST_CLUSTER_IDLE"

// slotctlEtcd is the slotctl-etcd binary TestMain built.
var slotctlEtcd string

// etcdBinary, from SLOTCTL_CLUSTER_ETCD, is an etcd server binary the
// members run instead of this package's embedded etcd (the release a
// distribution ships, say: Debian's etcd-server is 3.4).
var etcdBinary = os.Getenv("SLOTCTL_CLUSTER_ETCD")

// enabled: the suite runs only with SLOTCTL_CLUSTER=1; soak adds the full
// sizes of the scale goals.
var (
	enabled = os.Getenv("SLOTCTL_CLUSTER") == "1" || os.Getenv("SLOTCTL_CLUSTER_SOAK") == "1"
	soak    = os.Getenv("SLOTCTL_CLUSTER_SOAK") == "1"
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(memberEnv); cfg != "" {
		os.Exit(runMember(cfg))
	}
	if os.Getenv(idleEnv) == "1" {
		for { // an idle Go process (one timer an hour): TestIdleGoFloor measures what it costs
			time.Sleep(time.Hour)
		}
	}
	if !enabled {
		fmt.Println("cluster: the robustness suite runs with SLOTCTL_CLUSTER=1 (minutes; .ci/run sets it); skipped")
		os.Exit(m.Run()) // every test skips itself
	}
	dir, err := os.MkdirTemp("", "slotctl-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// SLOTCTL_CLUSTER_BIN runs the suite against another slotctl-etcd (an
	// older build, a release) instead of this tree's.
	if slotctlEtcd = os.Getenv("SLOTCTL_CLUSTER_BIN"); slotctlEtcd == "" {
		slotctlEtcd = filepath.Join(dir, "slotctl-etcd")
		build := exec.Command("go", "build", "-o", slotctlEtcd, "github.com/slotctl/slotctl/cmd/slotctl-etcd")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build slotctl-etcd: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	fmt.Printf("cluster: jobs run %s\n", slotctlEtcd)
	if etcdBinary != "" {
		out, err := exec.Command(etcdBinary, "--version").Output()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s --version: %v\n", etcdBinary, err)
			os.Exit(1)
		}
		fmt.Printf("cluster: members run %s: %s\n", etcdBinary, strings.SplitN(string(out), "\n", 2)[0])
	}
	code := testguard.Main(m)
	printFigures()
	os.RemoveAll(dir)
	os.Exit(code)
}

// skipUnlessEnabled skips a test of the suite unless SLOTCTL_CLUSTER=1.
func skipUnlessEnabled(t *testing.T) {
	t.Helper()
	if !enabled {
		t.Skip("set SLOTCTL_CLUSTER=1 to run the robustness suite on a three-member etcd cluster")
	}
}

// memberConfig is what a member process is told.
type memberConfig struct {
	Name    string `json:"name"`
	Dir     string `json:"dir"`
	Client  string `json:"client"` // 127.0.0.1:PORT
	Peer    string `json:"peer"`
	Initial string `json:"initial"` // name=http://peer,...
}

// runMember is the test binary as one etcd member: it serves until SIGTERM
// or SIGINT (then closes cleanly, as a rolling restart wants) or until its
// parent dies (Pdeathsig).
func runMember(js string) int {
	var mc memberConfig
	if err := json.Unmarshal([]byte(js), &mc); err != nil {
		fmt.Fprintf(os.Stderr, "member: bad config: %v\n", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = mc.Name
	cfg.Dir = mc.Dir
	cu := url.URL{Scheme: "http", Host: mc.Client}
	pu := url.URL{Scheme: "http", Host: mc.Peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = mc.Initial
	cfg.InitialClusterToken = "slotctl-cluster-test"
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{"stderr"}
	// Production members fsync; three on one small disk shared with other
	// tests would measure the disk. The faults here are processes and
	// connections, not disks.
	cfg.UnsafeNoFsync = true
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	var e *embed.Etcd
	var err error
	for try := 0; try < 50; try++ { // a killed member's ports may take a moment to free
		if e, err = embed.StartEtcd(cfg); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "member %s: %v\n", mc.Name, err)
		return 1
	}
	select {
	case <-sigs:
		e.Close()
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "member %s: %v\n", mc.Name, err)
		e.Close()
		return 1
	}
}

// figure is one measured value of the suite, for the closing table.
type figure struct {
	scenario, goal, measured string
	met                      bool
}

var (
	figMu   sync.Mutex
	figures []figure
)

// record notes a figure (and logs it in the test's own log).
func record(t *testing.T, scenario, goal, measured string, met bool) {
	t.Helper()
	figMu.Lock()
	figures = append(figures, figure{scenario, goal, measured, met})
	figMu.Unlock()
	verdict := "met"
	if !met {
		verdict = "MISSED"
	}
	t.Logf("FIGURE | %s | %s | %s | %s |", scenario, goal, measured, verdict)
}

func printFigures() {
	figMu.Lock()
	defer figMu.Unlock()
	if len(figures) == 0 {
		return
	}
	mode := "default sizes (scaled down; SLOTCTL_CLUSTER_SOAK=1 for the issue's)"
	if soak {
		mode = "soak: the issue's full sizes"
	}
	fmt.Printf("\n== cluster robustness figures (%s, %s)\n", time.Now().UTC().Format(time.RFC3339), mode)
	fmt.Println("| scenario | goal | measured | goal met |")
	fmt.Println("|---|---|---|---|")
	for _, f := range figures {
		v := "yes"
		if !f.met {
			v = "**no**"
		}
		fmt.Printf("| %s | %s | %s | %s |\n", f.scenario, f.goal, strings.ReplaceAll(f.measured, "|", "/"), v)
	}
}
