package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/gateway/mqttbench"
)

// benchMQTTOptions are the flags of `ferrymq bench mqtt`.
type benchMQTTOptions struct {
	mode         string
	addr         string
	version      int
	clientPrefix string
	clean        bool
	label        string

	publishers  int
	subscribers int
	qos         int
	size        int
	rate        float64
	count       int64
	duration    time.Duration
	topic       string
	filter      string
	slow        int
	inflight    int
	drain       time.Duration

	coreAddr  string
	coreTopic string
	coreGroup string
	coreToken string

	conns          int
	workers        int
	keepAlive      time.Duration
	hold           time.Duration
	source         string
	perSource      int
	connectTimeout time.Duration
	username       string
	password       string
	subscribe      string
	subQoS         int
	tlsInsecure    bool
	caFile         string

	json bool
}

func (o *benchMQTTOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.mode, "mode", string(mqttbench.ModePubSub), "pubsub, connect (a connect storm) or idle (hold connections)")
	f.StringVar(&o.addr, "addr", "tcp://127.0.0.1:1883", "broker: tcp://host:port, ws://host:port/path, or tls://host:port (connect, idle)")
	f.IntVar(&o.version, "mqtt-version", 3, "MQTT version of pubsub clients: 3 (3.1.1, paho.mqtt.golang) or 5 (paho.golang)")
	f.StringVar(&o.clientPrefix, "client-prefix", "", `prefix of client identifiers (default "mqttbench-<pid>-")`)
	f.BoolVar(&o.clean, "clean", true, "clean session (3.1.1) / clean start (5); --clean=false keeps sessions")
	f.StringVar(&o.label, "label", "", `broker setup named in the result, e.g. "fsync always"`)

	f.IntVar(&o.publishers, "publishers", 10, "publishing connections")
	f.IntVar(&o.subscribers, "subscribers", 1, "subscribing connections, each subscribed to --filter (0: none)")
	f.IntVar(&o.qos, "qos", 0, "QoS of publications and subscriptions: 0, 1 or 2")
	f.IntVar(&o.size, "size", 256, "payload `BYTES` (at least 16: the header with send time, publisher and sequence)")
	f.Float64Var(&o.rate, "rate", 0, "messages/s across all publishers, paced evenly (connect, idle: connections/s); 0: as fast as possible")
	f.Int64Var(&o.count, "count", 0, "messages per publisher (with --duration: whichever comes first)")
	f.DurationVar(&o.duration, "duration", 0, "publish for this long (default 10s unless --count is given)")
	f.StringVar(&o.topic, "topic", "bench/%i", "topic of each publisher; %i is its index")
	f.StringVar(&o.filter, "filter", "", `subscription filter (default: the first level of --topic + "/#"); with %i, subscriber i's own (point to point: pairs with publisher i)`)
	f.IntVar(&o.slow, "slow-subscribers", 0, "extra subscribers to --filter that never read (a slow consumer; does it hurt the others?)")
	f.IntVar(&o.inflight, "inflight", 64, "messages each publisher keeps in flight, unacknowledged (QoS 1, 2) or unwritten (QoS 0)")
	f.DurationVar(&o.drain, "drain", 5*time.Second, "after the last acknowledgement, wait at most this long for receivers to get everything (less if all arrived or none for 3s)")

	f.StringVar(&o.coreAddr, "core", "", "also consume from this ferrymq core server, host:port (device → backend latency)")
	f.StringVar(&o.coreTopic, "core-topic", "", "core topic the gateway bridges the MQTT topics to")
	f.StringVar(&o.coreGroup, "core-group", "mqttbench", "core consumer group; its offsets move to the end of the topic first")
	f.StringVar(&o.coreToken, "core-token", "", "core token (default: none); also read from FERRYMQ_TOKEN")

	f.IntVar(&o.conns, "conns", 1000, "connections to open (connect, idle)")
	f.IntVar(&o.workers, "workers", 16, "connections opened in parallel (all modes)")
	f.DurationVar(&o.keepAlive, "keepalive", 300*time.Second, "keepalive in CONNECT (connect, idle); idle connections ping every keepalive/2")
	f.DurationVar(&o.hold, "hold", 0, "keep the connections this long once up (connect: 0 closes at once; idle: 0 holds until interrupted)")
	f.StringVar(&o.source, "source", "", "first local address of connections, spread --per-source a piece (default 127.0.0.1 for a loopback broker)")
	f.IntVar(&o.perSource, "per-source", 10_000, "connections per local address")
	f.DurationVar(&o.connectTimeout, "connect-timeout", 10*time.Second, "bound on dial + CONNECT/CONNACK, and SUBACK")
	f.StringVar(&o.username, "username", "", "user name in every CONNECT (connect, idle)")
	f.StringVar(&o.password, "password", "", "password in every CONNECT (connect, idle); also read from FERRYMQ_MQTT_PASSWORD")
	f.StringVar(&o.subscribe, "subscribe", "", "idle, connect: each connection subscribes once to this filter (%i: its index) and waits for SUBACK")
	f.IntVar(&o.subQoS, "sub-qos", 0, "QoS of --subscribe: 0, 1 or 2")
	f.BoolVar(&o.tlsInsecure, "tls-insecure", false, "tls://: do not verify the server's certificate")
	f.StringVar(&o.caFile, "ca", "", "tls://: verify the server's certificate with the CAs in this PEM `FILE` (default: the system's)")

	f.BoolVar(&o.json, "json", false, "print the result as one JSON line instead of tables")
}

// options turns the flags into mqttbench.Options; mqttbench checks them.
func (o *benchMQTTOptions) options(progress io.Writer) (mqttbench.Options, error) {
	var errs []error
	if o.qos < 0 || o.qos > 2 {
		errs = append(errs, fmt.Errorf("--qos %d: must be 0, 1 or 2", o.qos))
	}
	var source netip.Addr
	if o.source != "" {
		var err error
		if source, err = netip.ParseAddr(o.source); err != nil {
			errs = append(errs, fmt.Errorf("--source: %w", err))
		}
	}
	if o.coreAddr != "" && o.coreTopic == "" {
		errs = append(errs, errors.New("--core needs --core-topic"))
	}
	if o.subQoS < 0 || o.subQoS > 2 {
		errs = append(errs, fmt.Errorf("--sub-qos %d: must be 0, 1 or 2", o.subQoS))
	}
	var tlsConfig *tls.Config
	if o.tlsInsecure || o.caFile != "" {
		tlsConfig = &tls.Config{InsecureSkipVerify: o.tlsInsecure} //nolint:gosec // asked for with --tls-insecure
	}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		roots := x509.NewCertPool()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--ca: %w", err))
		case !roots.AppendCertsFromPEM(pem):
			errs = append(errs, fmt.Errorf("--ca %s: no PEM certificate in it", o.caFile))
		}
		tlsConfig.RootCAs = roots
	}
	if len(errs) > 0 {
		return mqttbench.Options{}, fmt.Errorf("bench mqtt: %w", errors.Join(errs...))
	}
	token := o.coreToken
	if token == "" {
		token = getenv("FERRYMQ_TOKEN")
	}
	password := o.password
	if password == "" {
		password = getenv("FERRYMQ_MQTT_PASSWORD")
	}
	return mqttbench.Options{
		Mode: mqttbench.Mode(o.mode), Addr: o.addr, TLS: tlsConfig, Username: o.username, Password: password,
		Version: o.version, ClientPrefix: o.clientPrefix,
		PersistentSession: !o.clean, Label: o.label,
		Publishers: o.publishers, Subscribers: o.subscribers, QoS: byte(o.qos), SizeBytes: o.size, Rate: o.rate,
		Count: o.count, Duration: o.duration, Topic: o.topic, Filter: o.filter, SlowSubscribers: o.slow, Inflight: o.inflight, Drain: o.drain,
		Core:  mqttbench.CoreOptions{Addr: o.coreAddr, Token: token, Topic: o.coreTopic, Group: o.coreGroup},
		Conns: o.conns, Workers: o.workers, KeepAlive: o.keepAlive, Hold: o.hold, Source: source,
		ConnsPerSource: o.perSource, ConnectTimeout: o.connectTimeout, Subscribe: o.subscribe, SubQoS: byte(o.subQoS),
		Progress: progress,
	}, nil
}

func newBenchMQTTCmd() *cobra.Command {
	o := &benchMQTTOptions{}
	cmd := &cobra.Command{
		Use:   "mqtt",
		Short: "Load an MQTT broker: publish/subscribe, connect storms, idle connections",
		Long: `Load any MQTT broker (ferrymq's gateway, Mosquitto, nats-server, …) over the
network and measure it.

pubsub: --publishers connections publish payloads of --size bytes at --qos, as fast
as --inflight allows or paced at --rate, for --duration or --count messages
each; --subscribers connections subscribe to --filter. Every payload carries
its send time, publisher and sequence number, so receivers count loss and
duplicates exactly and measure publish → receipt latency. With --core, a
ferrymq core consumer group also consumes the topic the gateway bridges to
(device → backend). Loss is what was acknowledged (QoS 0: sent) but not
received within --drain.

connect: --conns raw MQTT 3.1.1 connections (a hand-written CONNECT, no client
library) opened by --workers as fast as possible or at --rate; measures
CONNECT → CONNACK latency and connections/s, then closes them (or holds them
for --hold). Over tcp://, tls:// (--ca, --tls-insecure) or ws://; with
--username/--password in every CONNECT (a refusal counts as failed, its
return code among the errors); with --subscribe each connection subscribes
once (%i: its index) at --sub-qos and waits for the SUBACK.

idle: the same, then holds them open (a PINGREQ every --keepalive/2) until
--hold passes or the command is interrupted; prints "holding N connections"
to stderr once all are up, so a script can measure the broker's memory.

A progress line goes to stderr every second; the result to stdout.`,
		Example: `  ferrymq bench mqtt --addr tcp://127.0.0.1:1883 --publishers 100 --qos 1 --count 1000
  ferrymq bench mqtt --qos 1 --rate 5000 --duration 30s --core 127.0.0.1:10911 --core-topic telemetry
  ferrymq bench mqtt --mqtt-version 5 --addr ws://127.0.0.1:8083/mqtt --qos 2 --json
  ferrymq bench mqtt --mode connect --conns 5000 --workers 16
  ferrymq bench mqtt --mode idle --conns 15000 --source 127.0.0.2 --keepalive 300s
  ferrymq bench mqtt --mode idle --conns 15000 --subscribe 'idle/%i' --sub-qos 1
  ferrymq bench mqtt --mode idle --addr tls://127.0.0.1:8883 --ca ca.pem --conns 15000
  ferrymq bench mqtt --mode connect --addr ws://127.0.0.1:8083/mqtt --username bench --password secret`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := o.options(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			res, err := mqttbench.Run(cmd.Context(), opts)
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			// Interrupted: print what was measured, and fail.
			var werr error
			if o.json {
				werr = writeMQTTJSON(cmd.OutOrStdout(), res)
			} else {
				werr = writeMQTTTables(cmd.OutOrStdout(), res)
			}
			return errors.Join(err, werr)
		},
	}
	o.AddFlags(cmd)
	return cmd
}

func writeMQTTJSON(w io.Writer, r mqttbench.Result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// writeMQTTTables prints a result for people: the setup, then what was
// published and received (pubsub) or connected (connect, idle), then the
// errors seen.
func writeMQTTTables(w io.Writer, r mqttbench.Result) error {
	var tables [][][]string
	if r.Conns == nil {
		tables = append(tables, [][]string{
			{"MODE", "ADDR", "MQTT", "QOS", "PUBLISHERS", "SUBSCRIBERS", "SIZE", "INFLIGHT", "RATE", "LABEL"},
			{string(r.Mode), r.Addr, strconv.Itoa(r.Version), strconv.Itoa(int(r.QoS)), strconv.Itoa(r.Publishers),
				strconv.Itoa(r.Subscribers), strconv.Itoa(r.SizeBytes), strconv.Itoa(r.Inflight), benchRate(r.Rate), benchDash(r.Label)},
		})
		ack := mqttbench.Latency{}
		if r.AckLatency != nil {
			ack = *r.AckLatency
		}
		tables = append(tables, [][]string{
			{"SENT", "ACKED", "FAILED", "SECONDS", "ACKED/S", "ACK P50", "ACK P99", "ACK P99.9", "ACK MAX"},
			{strconv.FormatInt(r.Sent, 10), strconv.FormatInt(r.Acked, 10), strconv.FormatInt(r.Failed, 10),
				strconv.FormatFloat(r.Seconds, 'f', 2, 64), strconv.FormatFloat(r.AckedPerSec, 'f', 0, 64),
				fmtLatency(ack.P50), fmtLatency(ack.P99), fmtLatency(ack.P999), fmtLatency(ack.Max)},
		})
		recv := [][]string{{"RECEIVER", "EXPECTED", "RECEIVED", "DUPLICATES", "FOREIGN", "LOST", "LOSS", "MSGS/S", "P50", "P99", "P99.9", "MAX"}}
		for _, d := range []struct {
			name string
			d    *mqttbench.Delivery
		}{{fmt.Sprintf("mqtt ×%d", r.Subscribers), r.MQTT}, {"core", r.Core}} {
			if d.d == nil {
				continue
			}
			recv = append(recv, []string{d.name, strconv.FormatInt(d.d.Expected, 10), strconv.FormatInt(d.d.Received, 10),
				strconv.FormatInt(d.d.Duplicates, 10), strconv.FormatInt(d.d.Foreign, 10), strconv.FormatInt(d.d.Lost, 10),
				strconv.FormatFloat(d.d.LossPct, 'f', 2, 64) + "%", strconv.FormatFloat(d.d.PerSec, 'f', 0, 64),
				fmtLatency(d.d.Latency.P50), fmtLatency(d.d.Latency.P99), fmtLatency(d.d.Latency.P999), fmtLatency(d.d.Latency.Max)})
		}
		if len(recv) > 1 {
			tables = append(tables, recv)
		}
		if r.SlowSubscribers > 0 {
			tables = append(tables, [][]string{{"SLOW SUBSCRIBERS", "DISCONNECTED BY THE BROKER"},
				{strconv.Itoa(r.SlowSubscribers), strconv.Itoa(r.SlowDisconnected)}})
		}
	} else {
		c := r.Conns
		tables = append(tables, [][]string{
			{"MODE", "ADDR", "CONNS", "CONNECTED", "FAILED", "SECONDS", "CONNS/S", "P50", "P99", "P99.9", "MAX", "HELD", "ALIVE", "HELD S", "SOURCES", "LABEL"},
			{string(r.Mode), r.Addr, strconv.Itoa(c.Asked), strconv.FormatInt(c.Connected, 10), strconv.FormatInt(c.Failed, 10),
				strconv.FormatFloat(r.Seconds, 'f', 2, 64), strconv.FormatFloat(c.PerSec, 'f', 0, 64),
				fmtLatency(c.Latency.P50), fmtLatency(c.Latency.P99), fmtLatency(c.Latency.P999), fmtLatency(c.Latency.Max),
				strconv.Itoa(c.Held), strconv.Itoa(c.Alive), strconv.FormatFloat(c.HeldSeconds, 'f', 1, 64), strconv.Itoa(c.Sources), benchDash(r.Label)},
		})
	}
	for i, t := range tables {
		if i > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, l := range t {
			if _, err := fmt.Fprintf(tw, "%s\t\n", strings.Join(l, "\t")); err != nil {
				return err
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Errors) > 0 {
		if _, err := fmt.Fprintln(w, "\nerrors:"); err != nil {
			return err
		}
		for _, e := range r.Errors {
			if _, err := fmt.Fprintf(w, "  %d× %s\n", e.Count, e.Err); err != nil {
				return err
			}
		}
	}
	return nil
}

func fmtLatency(d time.Duration) string { return fmtBenchMicros(float64(d) / 1e3) }

func benchRate(r float64) string {
	if r == 0 {
		return "max"
	}
	return strconv.FormatFloat(r, 'f', -1, 64) + "/s"
}
