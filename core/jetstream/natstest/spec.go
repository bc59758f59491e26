package natstest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

const (
	// ClusterName is the cluster name of every cluster this package starts.
	ClusterName = "ferrymq-test"
	// GlobalAccount is the account clients use when the server has no
	// accounts configured, as here.
	GlobalAccount = server.DEFAULT_GLOBAL_ACCOUNT
	// loopback is the only interface the servers listen on.
	loopback = "127.0.0.1"
)

// nodeSpec is everything needed to start one node again and again with the
// same identity. It is also what a child process receives, as JSON.
type nodeSpec struct {
	Name         string        `json:"name"`
	Port         int           `json:"port"`
	HTTPPort     int           `json:"http_port,omitempty"`
	ClusterPort  int           `json:"cluster_port,omitempty"`
	Routes       []int         `json:"routes,omitempty"`
	StoreDir     string        `json:"store_dir"`
	LogFile      string        `json:"log_file,omitempty"`
	SyncAlways   bool          `json:"sync_always,omitempty"`
	SyncInterval time.Duration `json:"sync_interval,omitempty"`
	MaxMemory    int64         `json:"max_memory,omitempty"`
	MaxStore     int64         `json:"max_store,omitempty"`
}

// options turns the spec into nats-server options. Logging is off unless
// LogFile is set.
func (sp nodeSpec) options() *server.Options {
	o := &server.Options{
		ServerName:         sp.Name,
		Host:               loopback,
		Port:               sp.Port,
		JetStream:          true,
		StoreDir:           sp.StoreDir,
		JetStreamMaxMemory: sp.MaxMemory,
		JetStreamMaxStore:  sp.MaxStore,
		SyncAlways:         sp.SyncAlways,
		SyncInterval:       sp.SyncInterval,
		MaxPayload:         MaxPayload,
		NoLog:              sp.LogFile == "",
		LogFile:            sp.LogFile,
		Logtime:            true,
		NoSigs:             true,
	}
	if sp.HTTPPort != 0 {
		o.HTTPHost = loopback
		o.HTTPPort = sp.HTTPPort
	}
	if sp.ClusterPort != 0 {
		o.Cluster = server.ClusterOpts{Name: ClusterName, Host: loopback, Port: sp.ClusterPort}
		for _, p := range sp.Routes {
			o.Routes = append(o.Routes, &url.URL{Scheme: "nats", Host: hostPort(p)})
		}
	}
	return o
}

// applyOptions runs the caller's options on the spec's server options and
// copies back the settings that a child process can receive. Options that
// touch other fields only take effect for in-process servers.
func (sp *nodeSpec) applyOptions(opts []Option) {
	o := sp.options()
	for _, opt := range opts {
		opt(o)
	}
	sp.SyncAlways = o.SyncAlways
	sp.SyncInterval = o.SyncInterval
	sp.MaxMemory = o.JetStreamMaxMemory
	sp.MaxStore = o.JetStreamMaxStore
}

// clientURL is the node's client URL.
func (sp nodeSpec) clientURL() string { return "nats://" + hostPort(sp.Port) }

// monitorURL is the node's HTTP monitoring URL, empty without a port.
func (sp nodeSpec) monitorURL() string {
	if sp.HTTPPort == 0 {
		return ""
	}
	return "http://" + hostPort(sp.HTTPPort)
}

// clusterSpecs describes n nodes named n1..nN that route to each other, with
// free loopback ports and one store folder each from dirs. With monitor set
// each node also gets an HTTP monitoring port.
func clusterSpecs(n int, dirs func() string, monitor bool) ([]nodeSpec, error) {
	perNode := 2
	if monitor {
		perNode = 3
	}
	ports, err := freePorts(n * perNode)
	if err != nil {
		return nil, err
	}
	specs := make([]nodeSpec, n)
	for i := range specs {
		p := ports[i*perNode:]
		specs[i] = nodeSpec{Name: "n" + strconv.Itoa(i+1), Port: p[0], ClusterPort: p[1], StoreDir: dirs()}
		if monitor {
			specs[i].HTTPPort = p[2]
		}
	}
	for i := range specs {
		for j := range specs {
			if i != j {
				specs[i].Routes = append(specs[i].Routes, specs[j].ClusterPort)
			}
		}
	}
	return specs, nil
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago. All listeners are open at once so no port is handed out twice.
//
// Ports come from outside the kernel's ephemeral range when it is known
// (Linux): a restarted node must bind its old port again, and a port from
// the ephemeral range may meanwhile have become the local end of some
// outgoing connection.
func freePorts(n int) ([]int, error) {
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	lo, hi, ok := quietPortRange()
	for attempts := 0; len(ports) < n; attempts++ {
		want := 0
		if ok && attempts < n*maxPortAttempts {
			want = lo + rand.IntN(hi-lo+1)
		}
		l, err := net.Listen("tcp", hostPort(want))
		if err != nil {
			if want != 0 {
				continue // taken; draw again
			}
			return nil, fmt.Errorf("reserve a free loopback port: %w", err)
		}
		listeners = append(listeners, l)
		addr, isTCP := l.Addr().(*net.TCPAddr)
		if !isTCP {
			return nil, fmt.Errorf("reserve a free loopback port: unexpected address %v", l.Addr())
		}
		ports = append(ports, addr.Port)
	}
	return ports, nil
}

// maxPortAttempts bounds the random draws per port before freePorts falls
// back to ports chosen by the kernel.
const maxPortAttempts = 20

// ephemeralRangeFile holds the kernel's ephemeral port range on Linux.
const ephemeralRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// quietPortRange returns a range of at least 1000 ports that the kernel
// does not hand out for outgoing connections, or ok false when the
// ephemeral range is unknown or leaves no such room.
func quietPortRange() (lo, hi int, ok bool) {
	const floor, ceiling, room = 10000, 65535, 1000
	raw, err := os.ReadFile(ephemeralRangeFile)
	if err != nil {
		return 0, 0, false
	}
	var elo, ehi int
	if _, err := fmt.Sscan(string(raw), &elo, &ehi); err != nil {
		return 0, 0, false
	}
	switch {
	case elo-1-floor >= room:
		return floor, elo - 1, true
	case ceiling-(ehi+1) >= room:
		return ehi + 1, ceiling, true
	default:
		return 0, 0, false
	}
}

func hostPort(port int) string { return net.JoinHostPort(loopback, strconv.Itoa(port)) }
