package auth

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Errors returned by quota checks.
var (
	// ErrBanned is returned by AdmitConnection when the IP is banned for
	// having exceeded its connect rate BanAfter times within StrikeWindow.
	ErrBanned = errors.New("auth: ip banned")

	// ErrConnectRate is returned by AdmitConnection when the IP connects
	// faster than ConnectRatePerIP allows.
	ErrConnectRate = errors.New("auth: connect rate exceeded")

	// ErrTooManyConnections is returned by AdmitConnection when the global
	// or the per-IP connection cap is reached, or when MaxTrackedIPs IPs are
	// already tracked.
	ErrTooManyConnections = errors.New("auth: too many connections")

	// ErrTopicTooLong is returned by CheckTopic when a topic has more bytes
	// than allowed.
	ErrTopicTooLong = errors.New("auth: topic too long")

	// ErrTopicTooDeep is returned by CheckTopic when a topic has more levels
	// than allowed.
	ErrTopicTooDeep = errors.New("auth: topic has too many levels")
)

// Quota defaults, applied to zero fields of QuotaConfig.
const (
	DefaultMaxTopicLevels = 32
	DefaultMaxTopicLength = 1024 // bytes
	DefaultMaxTrackedIPs  = 100_000
	DefaultIPv6PrefixBits = 64
	DefaultBanFor         = 5 * time.Minute // when BanAfter is set
	// DefaultByteBurst is the smallest default ByteBurst: a burst of one
	// second's worth of ByteRate, but never less than this, so that an
	// ordinary message can always pass.
	DefaultByteBurst = 64 << 10
)

// StrikeWindow is how long connect-rate strikes against an IP are counted:
// BanAfter strikes with no gap of StrikeWindow since the first one ban it.
const StrikeWindow = time.Minute

// minIdle is the least time a per-IP entry is kept after its last activity.
const minIdle = time.Minute

// QuotaConfig sets connection and per-client limits. A zero field means
// unlimited, except MaxTopicLevels and MaxTopicLength (default 32 levels and
// 1024 bytes; set -1 for unlimited), MaxTrackedIPs (default 100,000),
// IPv6PrefixBits (default 64), the bursts (default one second's worth of
// the rate, at least 1 connection or message and at least 64 KiB) and
// BanFor (5 minutes when BanAfter is set).
type QuotaConfig struct {
	MaxConnections      int           `yaml:"max_connections"`
	MaxConnectionsPerIP int           `yaml:"max_connections_per_ip"`
	ConnectRatePerIP    float64       `yaml:"connect_rate_per_ip"`  // connections per second
	ConnectBurstPerIP   int           `yaml:"connect_burst_per_ip"` // connections at once
	BanAfter            int           `yaml:"ban_after"`            // connect-rate strikes within StrikeWindow; 0 = never ban
	BanFor              time.Duration `yaml:"ban_for"`
	PublishRate         float64       `yaml:"publish_rate"`  // messages per second per client
	PublishBurst        int           `yaml:"publish_burst"` // messages
	ByteRate            float64       `yaml:"byte_rate"`     // payload bytes per second per client
	ByteBurst           int           `yaml:"byte_burst"`    // bytes; a larger message never passes
	MaxSubscriptions    int           `yaml:"max_subscriptions"`
	MaxTopicLevels      int           `yaml:"max_topic_levels"`
	MaxTopicLength      int           `yaml:"max_topic_length"` // bytes
	// MaxTrackedIPs bounds the per-IP table (rate, strikes, bans, counts).
	// When it is full and nothing can be swept, new IPs are refused.
	MaxTrackedIPs int `yaml:"max_tracked_ips"`
	// IPv6PrefixBits is how much of an IPv6 address the per-IP limits key
	// on: a single host is usually given a whole /64, so counting its
	// addresses apart would let it multiply every per-IP limit. Zero means
	// DefaultIPv6PrefixBits; 128 counts each address apart; values outside
	// 1–128 are clamped. IPv4 (also IPv4-mapped IPv6) is always keyed by
	// address.
	IPv6PrefixBits int `yaml:"ipv6_prefix_bits"`
}

func (c QuotaConfig) withDefaults() QuotaConfig {
	if c.MaxTopicLevels == 0 {
		c.MaxTopicLevels = DefaultMaxTopicLevels
	}
	if c.MaxTopicLength == 0 {
		c.MaxTopicLength = DefaultMaxTopicLength
	}
	if c.MaxTrackedIPs <= 0 {
		c.MaxTrackedIPs = DefaultMaxTrackedIPs
	}
	switch {
	case c.IPv6PrefixBits == 0:
		c.IPv6PrefixBits = DefaultIPv6PrefixBits
	case c.IPv6PrefixBits < 0:
		c.IPv6PrefixBits = 1
	case c.IPv6PrefixBits > 128:
		c.IPv6PrefixBits = 128
	}
	if c.ConnectRatePerIP > 0 && c.ConnectBurstPerIP <= 0 {
		c.ConnectBurstPerIP = max(1, int(math.Ceil(c.ConnectRatePerIP)))
	}
	if c.PublishRate > 0 && c.PublishBurst <= 0 {
		c.PublishBurst = max(1, int(math.Ceil(c.PublishRate)))
	}
	if c.ByteRate > 0 && c.ByteBurst <= 0 {
		c.ByteBurst = max(DefaultByteBurst, int(math.Min(math.Ceil(c.ByteRate), math.MaxInt32)))
	}
	if c.BanAfter > 0 && c.BanFor <= 0 {
		c.BanFor = DefaultBanFor
	}
	return c
}

// Quotas admits connections against global and per-IP limits and hands
// out per-client limiters. It is safe for concurrent use. It starts no
// goroutine: per-IP entries idle for longer than max(BanFor, 1 minute, a
// full refill of the connect bucket) are swept lazily by AdmitConnection,
// or by Sweep.
type Quotas struct {
	cfg     QuotaConfig
	now     func() time.Time
	idleTTL time.Duration

	mu        sync.Mutex
	total     int
	ips       map[string]*ipState
	lastSweep time.Time
}

type ipState struct {
	conns       int
	limiter     *rate.Limiter // nil when ConnectRatePerIP is 0
	strikes     int
	firstStrike time.Time
	bannedUntil time.Time
	lastSeen    time.Time
}

// NewQuotas returns quotas for cfg; now is the clock (nil means time.Now).
func NewQuotas(cfg QuotaConfig, now func() time.Time) *Quotas {
	if now == nil {
		now = time.Now
	}
	cfg = cfg.withDefaults()
	idle := max(cfg.BanFor, minIdle)
	if cfg.ConnectRatePerIP > 0 {
		refill := time.Duration(float64(cfg.ConnectBurstPerIP) / cfg.ConnectRatePerIP * float64(time.Second))
		idle = max(idle, refill)
	}
	return &Quotas{cfg: cfg, now: now, idleTTL: idle, ips: make(map[string]*ipState)}
}

// Config returns the configuration in use, defaults filled in.
func (q *Quotas) Config() QuotaConfig { return q.cfg }

// AdmitConnection decides whether a new connection from ip (the remote
// address without port) may proceed. IPv4 addresses count one by one,
// IPv6 addresses by their IPv6PrefixBits prefix (see IPKey). It checks,
// in order, a ban
// (ErrBanned), the per-IP connect rate (ErrConnectRate; BanAfter such
// refusals within StrikeWindow ban the IP for BanFor), and the global and
// per-IP connection caps (ErrTooManyConnections). On success the caller
// must call release when the connection ends; release may be called more
// than once.
func (q *Quotas) AdmitConnection(ip string) (release func(), err error) {
	ip = q.IPKey(ip)
	now := q.now()
	q.mu.Lock()
	defer q.mu.Unlock()

	if now.Sub(q.lastSweep) >= q.idleTTL/2 {
		q.sweepLocked(now)
	}
	st := q.ips[ip]
	if st == nil {
		if len(q.ips) >= q.cfg.MaxTrackedIPs {
			if now.Sub(q.lastSweep) >= time.Second { // bound the cost of sweeping under a flood
				q.sweepLocked(now)
			}
			if len(q.ips) >= q.cfg.MaxTrackedIPs {
				return nil, fmt.Errorf("%w: %d ips tracked", ErrTooManyConnections, len(q.ips))
			}
		}
		st = &ipState{}
		if q.cfg.ConnectRatePerIP > 0 {
			st.limiter = rate.NewLimiter(rate.Limit(q.cfg.ConnectRatePerIP), q.cfg.ConnectBurstPerIP)
		}
		q.ips[ip] = st
	}
	st.lastSeen = now

	if now.Before(st.bannedUntil) {
		return nil, ErrBanned
	}
	if st.limiter != nil && !st.limiter.AllowN(now, 1) {
		if q.cfg.BanAfter > 0 {
			if st.strikes == 0 || now.Sub(st.firstStrike) >= StrikeWindow {
				st.strikes, st.firstStrike = 0, now
			}
			st.strikes++
			if st.strikes >= q.cfg.BanAfter {
				st.strikes = 0
				st.bannedUntil = now.Add(q.cfg.BanFor)
			}
		}
		return nil, ErrConnectRate
	}
	if q.cfg.MaxConnections > 0 && q.total >= q.cfg.MaxConnections {
		return nil, fmt.Errorf("%w: %d in all", ErrTooManyConnections, q.total)
	}
	if q.cfg.MaxConnectionsPerIP > 0 && st.conns >= q.cfg.MaxConnectionsPerIP {
		return nil, fmt.Errorf("%w: %d from this ip", ErrTooManyConnections, st.conns)
	}
	q.total++
	st.conns++

	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			q.total--
			st.conns-- // st stays in the map while conns > 0
			st.lastSeen = q.now()
		})
	}, nil
}

// IPKey returns the key of ip in the per-IP table: an IPv4 address (an
// IPv4-mapped IPv6 one unmapped) as it is, an IPv6 address as its
// IPv6PrefixBits prefix ("2001:db8:1:2::/64"), without zone. A string
// that is not an IP address is its own key.
func (q *Quotas) IPKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	a = a.WithZone("").Unmap()
	if a.Is4() || q.cfg.IPv6PrefixBits >= 128 {
		return a.String()
	}
	p, err := a.Prefix(q.cfg.IPv6PrefixBits)
	if err != nil {
		return ip // not reached: an IPv6 address and 1–127 bits
	}
	return p.String()
}

// Sweep drops per-IP entries with no connection, no running ban and no
// activity for the idle period. AdmitConnection also sweeps now and then;
// Sweep is for owners that want to do it on their own schedule.
func (q *Quotas) Sweep(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sweepLocked(now)
}

func (q *Quotas) sweepLocked(now time.Time) {
	q.lastSweep = now
	for ip, st := range q.ips {
		if st.conns == 0 && !now.Before(st.bannedUntil) && now.Sub(st.lastSeen) > q.idleTTL {
			delete(q.ips, ip)
		}
	}
}

// Connections returns the number of admitted connections not yet released.
func (q *Quotas) Connections() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total
}

// TrackedIPs returns the number of entries in the per-IP table.
func (q *Quotas) TrackedIPs() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ips)
}

// CheckTopic checks topic against the configured MaxTopicLevels and
// MaxTopicLength.
func (q *Quotas) CheckTopic(topic string) error {
	return CheckTopic(topic, q.cfg.MaxTopicLevels, q.cfg.MaxTopicLength)
}

// AllowSubscription reports whether a client holding current subscriptions
// may add one more.
func (q *Quotas) AllowSubscription(current int) bool {
	return q.cfg.MaxSubscriptions <= 0 || current < q.cfg.MaxSubscriptions
}

// CheckTopic returns ErrTopicTooLong if topic has more than maxLen bytes and
// ErrTopicTooDeep if it has more than maxLevels levels; a limit <= 0 is no
// limit.
func CheckTopic(topic string, maxLevels, maxLen int) error {
	if maxLen > 0 && len(topic) > maxLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrTopicTooLong, len(topic), maxLen)
	}
	if maxLevels > 0 {
		if n := strings.Count(topic, "/") + 1; n > maxLevels {
			return fmt.Errorf("%w: %d levels, at most %d", ErrTopicTooDeep, n, maxLevels)
		}
	}
	return nil
}

// ClientLimiter holds one connection's publish buckets. It is safe for
// concurrent use, though a connection normally uses it from one goroutine.
type ClientLimiter struct {
	q    *Quotas
	mu   sync.Mutex
	msgs *rate.Limiter // nil: unlimited
	size *rate.Limiter // nil: unlimited
}

// NewClientLimiter returns the publish limiter for one new connection.
func (q *Quotas) NewClientLimiter() *ClientLimiter {
	c := &ClientLimiter{q: q}
	if q.cfg.PublishRate > 0 {
		c.msgs = rate.NewLimiter(rate.Limit(q.cfg.PublishRate), q.cfg.PublishBurst)
	}
	if q.cfg.ByteRate > 0 {
		c.size = rate.NewLimiter(rate.Limit(q.cfg.ByteRate), q.cfg.ByteBurst)
	}
	return c
}

// AllowPublish takes one message and bytes from the client's buckets. If
// either bucket is short, it takes nothing and returns false with the time
// after which both would hold enough; a message larger than ByteBurst can
// never pass and gets rate.InfDuration.
func (c *ClientLimiter) AllowPublish(bytes int) (ok bool, retryAfter time.Duration) {
	now := c.q.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.size != nil && bytes > c.size.Burst() {
		return false, rate.InfDuration
	}
	wait := max(shortfall(c.msgs, now, 1), shortfall(c.size, now, bytes))
	if wait > 0 {
		return false, wait
	}
	if c.msgs != nil {
		c.msgs.AllowN(now, 1)
	}
	if c.size != nil && bytes > 0 {
		c.size.AllowN(now, bytes)
	}
	return true, 0
}

// AllowSubscription reports whether a client holding current subscriptions
// may add one more.
func (c *ClientLimiter) AllowSubscription(current int) bool {
	return c.q.AllowSubscription(current)
}

// shortfall returns how long until l holds n tokens; 0 if it does now or l
// is nil.
func shortfall(l *rate.Limiter, now time.Time, n int) time.Duration {
	if l == nil {
		return 0
	}
	missing := float64(n) - l.TokensAt(now)
	if missing <= 0 {
		return 0
	}
	d := time.Duration(math.Ceil(missing / float64(l.Limit()) * float64(time.Second)))
	return max(d, time.Nanosecond)
}
