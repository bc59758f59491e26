package node

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/alarm"
)

// Defaults of AlarmOptions: what suits a fleet of devices
// (docs/operations.md, "Alarms", says why each).
const (
	DefaultDiskUsage         = 0.85
	DefaultFsyncP99          = 500 * time.Millisecond
	DefaultFsyncWindow       = 5 * time.Minute
	DefaultFsyncMinCount     = 100
	DefaultGroupLag          = 100_000
	DefaultGrowingPeriod     = 10 * time.Minute
	DefaultArrivalsQuiet     = 5 * time.Minute
	DefaultDelayOverdue      = time.Minute
	DefaultDisconnectRate    = 100
	DefaultDisconnectWindow  = time.Minute
	DefaultExpiryWarning     = 14 * 24 * time.Hour
	DefaultGroupForget       = 24 * time.Hour
	maxRememberedGroupTopics = 10_000
)

// AlarmOptions configure the node's alarms (gateway/alarm): the
// Monitor's options plus each rule's threshold. A zero field is its
// default; a negative duration or count turns that rule off (as
// Disabled does).
type AlarmOptions struct {
	// Interval, ClearAfter, Disabled, Webhooks and Recent are the
	// Monitor's (alarm.Options).
	Interval, ClearAfter time.Duration
	Disabled             []alarm.Kind
	Webhooks             []alarm.Webhook
	Recent               int
	// DiskUsage is the share of the data folder's filesystem in use above
	// which disk_usage is raised; default DefaultDiskUsage.
	DiskUsage float64
	// FsyncP99 bounds the commit log's fsync p99 over FsyncWindow, once it
	// counted FsyncMinCount fsyncs; defaults DefaultFsyncP99,
	// DefaultFsyncWindow, DefaultFsyncMinCount.
	FsyncP99, FsyncWindow time.Duration
	FsyncMinCount         int64
	// GroupLag is the lag (messages not committed, per group and topic)
	// above which group_lag is raised; default DefaultGroupLag.
	GroupLag int64
	// GroupLagGrowing and RetryBacklogGrowing are how long a group's lag,
	// or the retry backlog, must grow to raise its alarm; default
	// DefaultGrowingPeriod.
	GroupLagGrowing, RetryBacklogGrowing time.Duration
	// DeadLetterQuiet is how long dead_letters stays raised after the last
	// arrival; DropQuiet the same for trace_dropping and
	// presence_dropping. Default DefaultArrivalsQuiet.
	DeadLetterQuiet, DropQuiet time.Duration
	// DelayOverdue is how late the oldest due delayed message may be;
	// default DefaultDelayOverdue.
	DelayOverdue time.Duration
	// DisconnectRate bounds MQTT disconnects per second over
	// DisconnectWindow; defaults DefaultDisconnectRate,
	// DefaultDisconnectWindow.
	DisconnectRate   float64
	DisconnectWindow time.Duration
	// CertificateExpiry and KeyExpiry are how long before a TLS
	// certificate, or a key, expires its alarm is raised; default
	// DefaultExpiryWarning.
	CertificateExpiry, KeyExpiry time.Duration
}

func (a *AlarmOptions) withDefaults() AlarmOptions {
	o := *a
	o.DiskUsage = cmp.Or(o.DiskUsage, DefaultDiskUsage)
	o.FsyncP99 = cmp.Or(o.FsyncP99, DefaultFsyncP99)
	o.FsyncWindow = cmp.Or(o.FsyncWindow, DefaultFsyncWindow)
	o.FsyncMinCount = cmp.Or(o.FsyncMinCount, DefaultFsyncMinCount)
	o.GroupLag = cmp.Or(o.GroupLag, DefaultGroupLag)
	o.GroupLagGrowing = cmp.Or(o.GroupLagGrowing, DefaultGrowingPeriod)
	o.RetryBacklogGrowing = cmp.Or(o.RetryBacklogGrowing, DefaultGrowingPeriod)
	o.DeadLetterQuiet = cmp.Or(o.DeadLetterQuiet, DefaultArrivalsQuiet)
	o.DropQuiet = cmp.Or(o.DropQuiet, DefaultArrivalsQuiet)
	o.DelayOverdue = cmp.Or(o.DelayOverdue, DefaultDelayOverdue)
	o.DisconnectRate = cmp.Or(o.DisconnectRate, DefaultDisconnectRate)
	o.DisconnectWindow = cmp.Or(o.DisconnectWindow, DefaultDisconnectWindow)
	o.CertificateExpiry = cmp.Or(o.CertificateExpiry, DefaultExpiryWarning)
	o.KeyExpiry = cmp.Or(o.KeyExpiry, DefaultExpiryWarning)
	return o
}

func (a *AlarmOptions) validate() error {
	var errs []error
	if a.DiskUsage < 0 || a.DiskUsage > 1 {
		errs = append(errs, fmt.Errorf("disk usage %g: want a share from 0 to 1", a.DiskUsage))
	}
	if a.DisconnectRate < 0 {
		errs = append(errs, fmt.Errorf("disconnect rate %g: negative", a.DisconnectRate))
	}
	if _, err := alarm.New(alarm.Options{Interval: a.Interval, Disabled: a.Disabled, Webhooks: a.Webhooks, Recent: a.Recent}); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// coreServices are the core services of the current term (the embedded
// engine: the node's life; engine nats: while this node holds the core
// lease), for the alarms and metrics that read them.
type coreServices struct {
	groups *group.Coordinator
	retry  *retry.Service
	delay  *delay.Service
}

// health reads the conditions the alarms watch and the metrics that
// Prometheus rules use (docs/prometheus-alerts.yaml): one reading for
// both. Its methods are safe for concurrent use.
type health struct {
	n       *Node
	store   *store.Store // nil unless embedded
	broker  core.Broker  // where topics are read: the engine, or nil (core-remote)
	dataDir string
	certs   map[string]time.Time // TLS certificates' NotAfter, by subject
	keys    map[string]time.Time // keys' expiry, by subject

	mu   sync.Mutex
	seen map[groupTopic]time.Time // clustering groups' topics, when last seen with members
}

type groupTopic struct{ group, topic string }

// newHealth reads what the node's certificates and keys are (once: what
// was loaded at start is what is served).
func (n *Node) newHealth() *health {
	h := &health{n: n, store: n.store, dataDir: n.opts.DataDir, seen: map[groupTopic]time.Time{}}
	if n.remote == nil {
		h.broker = n.base
	}
	h.certs, h.keys = n.deadlines()
	return h
}

// deadlines lists when the node's certificates and keys expire: each TLS
// listener's certificate (the earliest NotAfter of its chain) and client
// CA, the NATS client certificate, the JWT public keys given as
// certificates, and the rotation dates configured for the HMAC and JWT
// secrets.
func (n *Node) deadlines() (certs, keys map[string]time.Time) {
	certs, keys = map[string]time.Time{}, map[string]time.Time{}
	for i, t := range n.opts.TLS {
		name := cmp.Or(t.Name, t.Addr, fmt.Sprintf("tls %d", i+1))
		if at, ok := earliestNotAfter(t.Cert); ok {
			certs["listener "+name] = at
		}
		if t.ClientCA != "" {
			if at, ok := earliestNotAfter(t.ClientCA); ok {
				certs["listener "+name+" client_ca"] = at
			}
		}
	}
	if c := n.opts.NATS.TLS; c != nil {
		for _, kp := range c.Certificates {
			if len(kp.Certificate) > 0 {
				if x, err := x509.ParseCertificate(kp.Certificate[0]); err == nil {
					certs["nats client"] = x.NotAfter
				}
			}
		}
	}
	if a := n.opts.Auth; a != nil {
		if a.JWT != nil && a.JWT.PublicKeys != "" {
			for i, x := range pemCertificates(a.JWT.PublicKeys) {
				keys[fmt.Sprintf("jwt public key %d (%s)", i+1, x.Subject.CommonName)] = x.NotAfter
			}
		}
		if a.JWT != nil && !a.JWT.SecretExpires.IsZero() {
			keys["jwt secret"] = a.JWT.SecretExpires
		}
		if !a.HMACExpires.IsZero() {
			keys["hmac secrets"] = a.HMACExpires
		}
	}
	return certs, keys
}

// earliestNotAfter is the earliest NotAfter of the certificates in a PEM
// file.
func earliestNotAfter(path string) (time.Time, bool) {
	var at time.Time
	for _, c := range pemCertificates(path) {
		if at.IsZero() || c.NotAfter.Before(at) {
			at = c.NotAfter
		}
	}
	return at, !at.IsZero()
}

// pemCertificates parses the certificates in a PEM file; what cannot be
// read was refused when the node loaded it.
func pemCertificates(path string) []*x509.Certificate {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []*x509.Certificate
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return out
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// storeFailure is why the embedded store refuses writes; nil while it
// takes them (and without a store).
func (h *health) storeFailure() error {
	if h.store == nil {
		return nil
	}
	return h.store.Failure()
}

// filesystem is the data folder's filesystem: its size and what an
// unprivileged writer may still use, in bytes.
func (h *health) filesystem() (size, avail uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(h.dataDir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", h.dataDir, err)
	}
	bs := uint64(st.Bsize)
	// As df counts it: used over what users may have (used + available);
	// the blocks reserved for root are not the store's to use.
	used := (st.Blocks - st.Bfree) * bs
	return used + st.Bavail*bs, st.Bavail * bs, nil
}

// diskUsage is the share of the data folder's filesystem in use.
func (h *health) diskUsage(context.Context) (alarm.Values, error) {
	size, avail, err := h.filesystem()
	if err != nil {
		return nil, err
	}
	if size == 0 {
		return alarm.Values{}, nil
	}
	return alarm.Values{h.dataDir: 1 - float64(avail)/float64(size)}, nil
}

// fsyncs is the commit log's fsync histogram.
func (h *health) fsyncs(context.Context) (alarm.Histogram, error) {
	st := h.store.Stats()
	return alarm.Histogram{Bounds: store.FsyncBuckets[:], Counts: st.FsyncCounts}, nil
}

func (h *health) services() *coreServices { return h.n.services.Load() }

// groupLags is every group's lag per topic, by subject "group/topic"
// (broadcast: "group/topic/member"). A clustering group whose members
// are all gone keeps being read from its committed offsets for
// DefaultGroupForget: a group whose consumers died is the one falling
// behind.
func (h *health) groupLags(ctx context.Context) (map[string]GroupStats, error) {
	s := h.services()
	if s == nil || s.groups == nil {
		return map[string]GroupStats{}, nil
	}
	rows, err := allGroupRows(ctx, s.groups)
	if err != nil {
		return nil, err
	}
	out := make(map[string]GroupStats, len(rows))
	now := time.Now()
	h.mu.Lock()
	for _, r := range rows {
		subject := r.Group + "/" + r.Topic
		if r.Member != "" {
			subject += "/" + r.Member
		} else if _, ok := h.seen[groupTopic{r.Group, r.Topic}]; ok || len(h.seen) < maxRememberedGroupTopics {
			h.seen[groupTopic{r.Group, r.Topic}] = now
		}
		out[subject] = r
	}
	var gone []groupTopic
	for gt, at := range h.seen {
		if _, ok := out[gt.group+"/"+gt.topic]; ok {
			continue
		}
		if now.Sub(at) > DefaultGroupForget {
			delete(h.seen, gt)
			continue
		}
		gone = append(gone, gt)
	}
	h.mu.Unlock()
	if h.broker == nil {
		return out, nil
	}
	for _, gt := range gone {
		lag, queues, err := committedLag(ctx, h.broker, gt.group, gt.topic)
		if err != nil {
			if errors.Is(err, core.ErrTopicNotFound) {
				h.mu.Lock()
				delete(h.seen, gt)
				h.mu.Unlock()
				continue
			}
			return nil, err
		}
		out[gt.group+"/"+gt.topic] = GroupStats{Group: gt.group, Mode: string(group.Clustering), Topic: gt.topic, Queues: queues, Lag: lag}
	}
	return out, nil
}

// committedLag is a group's lag on a topic from its committed offsets:
// what a group without members has not consumed.
func committedLag(ctx context.Context, b core.Broker, grp, topic string) (lag int64, queues int, err error) {
	info, err := b.Topic(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	for q, r := range info.Ranges {
		off, err := b.CommittedOffset(ctx, grp, topic, q)
		switch {
		case errors.Is(err, core.ErrNoCommittedOffset):
			off = r.Min
		case err != nil:
			return 0, 0, fmt.Errorf("committed offset of %s on %s/%d: %w", grp, topic, q, err)
		}
		lag += max(0, r.Max-max(off, r.Min))
	}
	return lag, len(info.Ranges), nil
}

func (h *health) groupLagValues(ctx context.Context) (alarm.Values, error) {
	rows, err := h.groupLags(ctx)
	if err != nil {
		return nil, err
	}
	vs := make(alarm.Values, len(rows))
	for s, r := range rows {
		vs[s] = float64(r.Lag)
	}
	return vs, nil
}

// deadLetters counts the messages ever stored in each dead-letter topic,
// by group.
func (h *health) deadLetters(ctx context.Context) (alarm.Values, error) {
	if h.broker == nil || h.services() == nil {
		return alarm.Values{}, nil
	}
	topics, err := h.broker.Topics(ctx)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	vs := alarm.Values{}
	for _, t := range topics {
		grp, ok := strings.CutPrefix(t.Name, retry.DLQTopic(""))
		if !ok {
			continue
		}
		var n int64
		for _, r := range t.Ranges {
			n += r.Max
		}
		vs[grp] = float64(n)
	}
	return vs, nil
}

// retryBacklog is how many messages wait for redelivery.
func (h *health) retryBacklog(ctx context.Context) (alarm.Values, error) {
	s := h.services()
	if s == nil || s.retry == nil {
		return alarm.Values{}, nil
	}
	n, err := s.retry.Backlog(ctx)
	if err != nil {
		return nil, err
	}
	return alarm.Values{"retry": float64(n)}, nil
}

// delayOverdue is how late the most overdue delayed message is, in
// seconds.
func (h *health) delayOverdue(ctx context.Context) (alarm.Values, error) {
	s := h.services()
	if s == nil || s.delay == nil {
		return alarm.Values{}, nil
	}
	d, err := s.delay.Overdue(ctx)
	if err != nil {
		return nil, err
	}
	return alarm.Values{"delay": d.Seconds()}, nil
}

// disconnects counts MQTT connections that ended after CONNACK.
func (h *health) disconnects(context.Context) (alarm.Values, error) {
	g := h.n.gateway
	if g == nil {
		return alarm.Values{}, nil
	}
	return alarm.Values{"mqtt": float64(g.Engine().Stats().Counters["disconnects"])}, nil
}

// natsReachable is nil while NATS and JetStream answer.
func (h *health) natsReachable(ctx context.Context) error {
	if h.n.engine == nil {
		return nil
	}
	return h.n.engine.Ready(ctx)
}

// traceDropped counts trace hops dropped.
func (h *health) traceDropped(context.Context) (alarm.Values, error) {
	if h.n.trace == nil {
		return alarm.Values{}, nil
	}
	_, dropped := h.n.trace.Stats()
	return alarm.Values{"trace": float64(dropped)}, nil
}

// presenceFailures counts presence events the core refused.
func (h *health) presenceFailures(context.Context) (alarm.Values, error) {
	if h.n.bridge == nil {
		return alarm.Values{}, nil
	}
	return alarm.Values{"presence": float64(h.n.bridge.PresenceFailures())}, nil
}

func deadlineReader(ts map[string]time.Time) func(context.Context) (map[string]time.Time, error) {
	return func(context.Context) (map[string]time.Time, error) { return ts, nil }
}

// probes are the node's alarm rules (off: a negative threshold).
func (h *health) probes(o AlarmOptions) []alarm.Probe {
	var ps []alarm.Probe
	if h.store != nil {
		ps = append(ps, alarm.Condition(alarm.KindStoreFailed, func(context.Context) (map[string]string, error) {
			if err := h.storeFailure(); err != nil {
				return map[string]string{"store": "the store refuses writes until the node restarts: " + err.Error()}, nil
			}
			return map[string]string{}, nil
		}))
	}
	if o.DiskUsage > 0 {
		ps = append(ps, alarm.Above(alarm.KindDiskUsage, o.DiskUsage, h.diskUsage, func(s string, v, t float64) string {
			return fmt.Sprintf("the filesystem of %s is %.1f %% full (alarm above %.0f %%)", s, 100*v, 100*t)
		}))
	}
	if h.store != nil && o.FsyncP99 > 0 {
		ps = append(ps, alarm.QuantileAbove(alarm.KindFsyncSlow, "commitlog", 0.99, o.FsyncP99.Seconds(), o.FsyncWindow, o.FsyncMinCount,
			h.fsyncs, func(s string, v, t float64) string {
				return fmt.Sprintf("commit-log fsync p99 over the last %s is %s (bound %s)", o.FsyncWindow, secs(v), secs(t))
			}))
	}
	if o.GroupLag > 0 {
		ps = append(ps, alarm.Above(alarm.KindGroupLag, float64(o.GroupLag), h.groupLagValues, func(s string, v, t float64) string {
			return fmt.Sprintf("group/topic %s has %.0f messages not consumed (alarm above %.0f)", s, v, t)
		}))
	}
	if o.GroupLagGrowing > 0 {
		ps = append(ps, alarm.Growing(alarm.KindGroupLagGrowing, o.GroupLagGrowing, h.groupLagValues, func(s string, v, t float64) string {
			return fmt.Sprintf("the lag of group/topic %s grew for %s without a pause: %.0f, from %.0f", s, o.GroupLagGrowing, v, t)
		}))
	}
	if o.DeadLetterQuiet > 0 {
		ps = append(ps, alarm.Arrivals(alarm.KindDeadLetters, o.DeadLetterQuiet, h.deadLetters, func(s string, v, _ float64) string {
			return fmt.Sprintf("%.0f messages of group %s went to %s after their last retry", v, s, retry.DLQTopic(s))
		}))
	}
	if o.RetryBacklogGrowing > 0 {
		ps = append(ps, alarm.Growing(alarm.KindRetryBacklog, o.RetryBacklogGrowing, h.retryBacklog, func(_ string, v, t float64) string {
			return fmt.Sprintf("messages waiting for redelivery grew for %s: %.0f, from %.0f", o.RetryBacklogGrowing, v, t)
		}))
	}
	if o.DelayOverdue > 0 {
		ps = append(ps, alarm.Above(alarm.KindDelayOverdue, o.DelayOverdue.Seconds(), h.delayOverdue, func(_ string, v, t float64) string {
			return fmt.Sprintf("a delayed message is %s past its time and not delivered (bound %s)", secs(v), secs(t))
		}))
	}
	if o.DisconnectRate > 0 {
		ps = append(ps, alarm.Rate(alarm.KindDisconnectRate, o.DisconnectRate, o.DisconnectWindow, h.disconnects, func(_ string, v, t float64) string {
			return fmt.Sprintf("MQTT clients disconnect at %.1f/s over %s (bound %g/s): a network event or flapping devices", v, o.DisconnectWindow, t)
		}))
	}
	if o.CertificateExpiry > 0 && len(h.certs) > 0 {
		ps = append(ps, alarm.Deadline(alarm.KindCertExpiry, o.CertificateExpiry, deadlineReader(h.certs), expiryText("certificate", h.certs)))
	}
	if o.KeyExpiry > 0 && len(h.keys) > 0 {
		ps = append(ps, alarm.Deadline(alarm.KindKeyExpiry, o.KeyExpiry, deadlineReader(h.keys), expiryText("key", h.keys)))
	}
	if h.n.engine != nil {
		ps = append(ps, alarm.Condition(alarm.KindNATSUnreachable, func(ctx context.Context) (map[string]string, error) {
			if err := h.natsReachable(ctx); err != nil {
				return map[string]string{"nats": "NATS/JetStream does not answer: " + err.Error()}, nil
			}
			return map[string]string{}, nil
		}))
	}
	if len(h.n.anonymous) > 0 {
		ps = append(ps, alarm.Condition(alarm.KindAnonymous, func(context.Context) (map[string]string, error) {
			open := make(map[string]string, len(h.n.anonymous))
			for _, a := range h.n.anonymous {
				open[a.Name] = "MQTT clients with no credentials may connect on " + a.Addr + ", beyond loopback (auth.anonymous: true)"
			}
			return open, nil
		}))
	}
	if o.DropQuiet > 0 {
		if h.n.trace != nil {
			ps = append(ps, alarm.Arrivals(alarm.KindTraceDropping, o.DropQuiet, h.traceDropped, func(_ string, v, _ float64) string {
				return fmt.Sprintf("%.0f trace hops dropped (the recorder's queue is full or %%TRACE%% refuses writes)", v)
			}))
		}
		if h.n.bridge != nil {
			ps = append(ps, alarm.Arrivals(alarm.KindPresenceDropping, o.DropQuiet, h.presenceFailures, func(_ string, v, _ float64) string {
				return fmt.Sprintf("%.0f presence events the core refused (lost)", v)
			}))
		}
	}
	return ps
}

func expiryText(what string, at map[string]time.Time) alarm.Describe {
	return func(s string, left, limit float64) string {
		if left < 0 {
			return fmt.Sprintf("%s %s expired on %s", what, s, at[s].UTC().Format(time.DateOnly))
		}
		return fmt.Sprintf("%s %s expires on %s, in %.1f days (alarm within %.0f days)", what, s, at[s].UTC().Format(time.DateOnly), left, limit)
	}
}

func secs(v float64) string {
	return time.Duration(v * float64(time.Second)).Round(time.Millisecond).String()
}

// AlarmSpillFile, in DataDir, holds at shutdown the alarm events the
// store refused (a full disk refuses the raise of store_failed); they are
// restored and stored at the next start, so the alarm is cleared then.
const AlarmSpillFile = "alarms-pending.jsonl"

// startAlarms builds the node's Monitor (Options.Alarms set): probes over
// what runs here, events stored in alarm.Topic (where there is a core to
// store them in), the metrics on the gateway's registry. Start comes once
// the gateway serves.
func (n *Node) newAlarms() error {
	h := n.newHealth()
	n.health = h
	n.gateway.Registry().MustRegister(newHealthCollector(h))
	if n.opts.Alarms == nil {
		return nil
	}
	o := n.opts.Alarms.withDefaults()
	ao := alarm.Options{Interval: o.Interval, ClearAfter: o.ClearAfter, Disabled: o.Disabled, Webhooks: o.Webhooks,
		Recent: o.Recent, Node: n.nodeName, Logger: n.log, Probes: h.probes(o)}
	// A gateway in front of a remote core keeps its events in memory (and
	// sends them to the webhooks): the core port has no topic reads.
	if b := h.broker; b != nil {
		l := &alarm.Log{B: b, Logger: n.log, Spill: filepath.Join(n.opts.DataDir, AlarmSpillFile)}
		ao.Store, ao.Restore = l.Store, l.Restore
		n.alarmLog = l
	}
	m, err := alarm.New(ao)
	if err != nil {
		return fmt.Errorf("alarms: %w", err)
	}
	n.alarms = m
	n.gateway.Registry().MustRegister(m.Collector())
	return nil
}

// Alarms is the node's alarm Monitor; nil without Options.Alarms.
func (n *Node) Alarms() *alarm.Monitor { return n.alarms }

// storeReady is the readiness check of the embedded store: 503 with the
// reason while it refuses writes.
func (h *health) storeReady() error {
	if err := h.storeFailure(); err != nil {
		return fmt.Errorf("store refuses writes (restart the node once the cause is fixed): %w", err)
	}
	return nil
}

// maxStatsAlarms bounds the active alarms /stats shows (the dashboard's
// banner and list); GET /api/v1/alarms has them all.
const maxStatsAlarms = 50

// withAlarms adds the "alarms" section to /stats: the active alarms (at
// most maxStatsAlarms, the oldest first) and how many there are.
func withAlarms(extra func(context.Context) map[string]any, m *alarm.Monitor) func(context.Context) map[string]any {
	return func(ctx context.Context) map[string]any {
		out := map[string]any{}
		if extra != nil {
			out = extra(ctx)
		}
		active := m.Active()
		out["alarms"] = map[string]any{"active": active[:min(len(active), maxStatsAlarms)], "active_total": len(active)}
		return out
	}
}
