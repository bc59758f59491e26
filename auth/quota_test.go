package auth

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func admit(t testing.TB, q *Quotas, ip string) func() {
	t.Helper()
	release, err := q.AdmitConnection(ip)
	require.NoError(t, err, ip)
	require.NotNil(t, release)
	return release
}

func TestQuotaConnectRateAndBan(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{ConnectRatePerIP: 1, ConnectBurstPerIP: 2, BanAfter: 3, BanFor: 10 * time.Minute}, clk.Now)
	const a, b = "192.0.2.1", "192.0.2.2"

	admit(t, q, a)()
	admit(t, q, a)()
	for range 3 { // three strikes
		_, err := q.AdmitConnection(a)
		require.ErrorIs(t, err, ErrConnectRate)
	}
	_, err := q.AdmitConnection(a)
	require.ErrorIs(t, err, ErrBanned)
	admit(t, q, b)() // others still pass

	clk.Advance(time.Minute)
	_, err = q.AdmitConnection(a)
	require.ErrorIs(t, err, ErrBanned, "tokens are back but the ban holds")

	clk.Advance(9 * time.Minute)
	admit(t, q, a)() // ban over
	require.Zero(t, q.Connections())
}

func TestQuotaStrikesExpire(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{ConnectRatePerIP: 1, ConnectBurstPerIP: 1, BanAfter: 2}, clk.Now)
	require.Equal(t, DefaultBanFor, q.Config().BanFor)
	const a = "2001:db8::1"

	admit(t, q, a)()
	_, err := q.AdmitConnection(a)
	require.ErrorIs(t, err, ErrConnectRate) // strike 1
	clk.Advance(StrikeWindow)
	admit(t, q, a)()
	_, err = q.AdmitConnection(a)
	require.ErrorIs(t, err, ErrConnectRate, "strike 1 again: the old one is out of the window")
	_, err = q.AdmitConnection(a)
	require.ErrorIs(t, err, ErrConnectRate, "strike 2 bans")
	_, err = q.AdmitConnection(a)
	require.ErrorIs(t, err, ErrBanned)
	clk.Advance(DefaultBanFor)
	admit(t, q, a)()
}

func TestQuotaRateWithoutBan(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{ConnectRatePerIP: 2}, clk.Now) // burst defaults to 2
	admit(t, q, "a")()
	admit(t, q, "a")()
	for range 10 {
		_, err := q.AdmitConnection("a")
		require.ErrorIs(t, err, ErrConnectRate)
	}
	clk.Advance(500 * time.Millisecond)
	admit(t, q, "a")()
}

func TestQuotaConnectionCaps(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{MaxConnections: 3, MaxConnectionsPerIP: 2}, clk.Now)

	relA1 := admit(t, q, "a")
	admit(t, q, "a")
	_, err := q.AdmitConnection("a")
	require.ErrorIs(t, err, ErrTooManyConnections, "per ip")
	admit(t, q, "b")
	_, err = q.AdmitConnection("c")
	require.ErrorIs(t, err, ErrTooManyConnections, "global")
	require.Equal(t, 3, q.Connections())

	relA1()
	relA1() // idempotent
	require.Equal(t, 2, q.Connections())
	admit(t, q, "c")
	_, err = q.AdmitConnection("d")
	require.ErrorIs(t, err, ErrTooManyConnections)
}

// A host owns a whole IPv6 /64: its addresses share one per-IP entry, so
// rotating through them multiplies no limit; IPv4 counts per address.
func TestQuotaIPv6Prefix(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{MaxConnectionsPerIP: 2, ConnectRatePerIP: 1, ConnectBurstPerIP: 3, BanAfter: 1, BanFor: time.Hour}, clk.Now)
	require.Equal(t, DefaultIPv6PrefixBits, q.Config().IPv6PrefixBits)

	admit(t, q, "2001:db8:1:2::1")
	admit(t, q, "2001:db8:1:2:ffff:ffff:ffff:ffff")
	_, err := q.AdmitConnection("2001:db8:1:2::3")
	require.ErrorIs(t, err, ErrTooManyConnections, "same /64: per-IP cap")
	admit(t, q, "2001:db8:1:3::1") // the next /64 is another host
	admit(t, q, "192.0.2.1")
	admit(t, q, "192.0.2.2") // IPv4: per address
	admit(t, q, "::ffff:192.0.2.3")
	_, err = q.AdmitConnection("192.0.2.3")
	require.NoError(t, err, "an IPv4-mapped address is its IPv4 address: second of two")
	_, err = q.AdmitConnection("::ffff:192.0.2.3")
	require.ErrorIs(t, err, ErrTooManyConnections)

	// Bans, too, cover the whole /64: the burst of 3 is spent above.
	_, err = q.AdmitConnection("2001:db8:1:2::99")
	require.ErrorIs(t, err, ErrConnectRate)
	_, err = q.AdmitConnection("2001:db8:1:2::abcd")
	require.ErrorIs(t, err, ErrBanned)
	_, err = q.AdmitConnection("fe80::1%eth0")
	require.NoError(t, err)

	for _, tc := range []struct {
		bits     int
		ip, want string
	}{
		{0, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{48, "2001:db8:1:2:3:4:5:6", "2001:db8:1::/48"},
		{128, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2:3:4:5:6"},
		{500, "2001:db8::1", "2001:db8::1"},
		{-3, "2001:db8::1", "::/1"},
		{64, "fe80::1%eth0", "fe80::/64"},
		{64, "192.0.2.7", "192.0.2.7"},
		{64, "::ffff:192.0.2.7", "192.0.2.7"},
		{64, "not-an-ip", "not-an-ip"},
	} {
		q := NewQuotas(QuotaConfig{IPv6PrefixBits: tc.bits}, nil)
		require.Equal(t, tc.want, q.IPKey(tc.ip), "%d bits: %s", tc.bits, tc.ip)
	}
}

func TestQuotaUnlimited(t *testing.T) {
	q := NewQuotas(QuotaConfig{}, nil)
	var releases []func()
	for range 1000 {
		releases = append(releases, admit(t, q, "a"))
	}
	require.Equal(t, 1000, q.Connections())
	for _, r := range releases {
		r()
	}
	require.Zero(t, q.Connections())
}

func TestQuotaSweep(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{ConnectRatePerIP: 1, ConnectBurstPerIP: 1, BanAfter: 1, BanFor: 5 * time.Minute}, clk.Now)

	held := admit(t, q, "held")
	admit(t, q, "idle")()
	admit(t, q, "banned")()
	_, err := q.AdmitConnection("banned")
	require.ErrorIs(t, err, ErrConnectRate)
	require.Equal(t, 3, q.TrackedIPs())

	clk.Advance(time.Minute + time.Second)
	q.Sweep(clk.Now())
	require.Equal(t, 3, q.TrackedIPs(), "idle period is max(BanFor, 1m) = 5m")

	clk.Advance(5 * time.Minute)
	q.Sweep(clk.Now())
	require.Equal(t, 1, q.TrackedIPs(), "only the open connection keeps its entry")

	held()
	clk.Advance(5*time.Minute + time.Second)
	q.Sweep(clk.Now())
	require.Zero(t, q.TrackedIPs())
}

func TestQuotaTrackedIPsBounded(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{MaxTrackedIPs: 2}, clk.Now)
	relA := admit(t, q, "a")
	admit(t, q, "b")
	_, err := q.AdmitConnection("c")
	require.ErrorIs(t, err, ErrTooManyConnections)
	admit(t, q, "a")() // a known IP still gets in

	relA()
	clk.Advance(time.Minute + time.Second)
	admit(t, q, "c")() // swept lazily at capacity
	require.Equal(t, 2, q.TrackedIPs())
}

func TestQuotaConcurrent(t *testing.T) {
	q := NewQuotas(QuotaConfig{MaxConnections: 50, MaxConnectionsPerIP: 10}, nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			ip := string(rune('a' + g))
			for range 200 {
				release, err := q.AdmitConnection(ip)
				if err != nil {
					continue
				}
				release()
				release()
			}
		})
	}
	wg.Wait()
	require.Zero(t, q.Connections())
}

func TestAllowPublishMessages(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{PublishRate: 10, PublishBurst: 2}, clk.Now)
	c := q.NewClientLimiter()

	for range 2 {
		ok, wait := c.AllowPublish(1 << 20)
		require.True(t, ok)
		require.Zero(t, wait)
	}
	ok, wait := c.AllowPublish(1)
	require.False(t, ok)
	require.InDelta(t, 100*time.Millisecond, wait, float64(time.Microsecond))

	clk.Advance(wait)
	ok, _ = c.AllowPublish(1)
	require.True(t, ok)
	ok, _ = c.AllowPublish(1)
	require.False(t, ok)
}

func TestAllowPublishBytes(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{ByteRate: 100, ByteBurst: 200}, clk.Now)
	c := q.NewClientLimiter()

	ok, _ := c.AllowPublish(150)
	require.True(t, ok)
	ok, wait := c.AllowPublish(100)
	require.False(t, ok)
	require.InDelta(t, 500*time.Millisecond, wait, float64(time.Microsecond))
	clk.Advance(wait)
	ok, _ = c.AllowPublish(100)
	require.True(t, ok)

	ok, wait = c.AllowPublish(201)
	require.False(t, ok, "larger than the burst")
	require.Equal(t, rate.InfDuration, wait)

	ok, _ = c.AllowPublish(0)
	require.True(t, ok, "an empty message costs no bytes")
}

func TestAllowPublishAllOrNothing(t *testing.T) {
	clk := newFakeClock()
	q := NewQuotas(QuotaConfig{PublishRate: 1, PublishBurst: 2, ByteRate: 10, ByteBurst: 10}, clk.Now)
	c := q.NewClientLimiter()

	ok, _ := c.AllowPublish(8)
	require.True(t, ok)
	ok, wait := c.AllowPublish(8)
	require.False(t, ok, "short of bytes")
	require.InDelta(t, 600*time.Millisecond, wait, float64(time.Microsecond))
	ok, _ = c.AllowPublish(2)
	require.True(t, ok, "the refused message took no message token")
	ok, wait = c.AllowPublish(1)
	require.False(t, ok, "short of messages and bytes")
	require.InDelta(t, time.Second, wait, float64(time.Microsecond), "the longer of the two waits")
	clk.Advance(wait)
	ok, _ = c.AllowPublish(1)
	require.True(t, ok)
}

func TestAllowPublishDefaults(t *testing.T) {
	q := NewQuotas(QuotaConfig{PublishRate: 0.5, ByteRate: 1000}, newFakeClock().Now)
	cfg := q.Config()
	require.Equal(t, 1, cfg.PublishBurst)
	require.Equal(t, DefaultByteBurst, cfg.ByteBurst)
	require.Equal(t, DefaultMaxTopicLevels, cfg.MaxTopicLevels)
	require.Equal(t, DefaultMaxTopicLength, cfg.MaxTopicLength)

	unlimited := NewQuotas(QuotaConfig{}, nil).NewClientLimiter()
	for range 1000 {
		ok, _ := unlimited.AllowPublish(1 << 30)
		require.True(t, ok)
	}
}

func TestAllowSubscription(t *testing.T) {
	c := NewQuotas(QuotaConfig{MaxSubscriptions: 2}, nil).NewClientLimiter()
	require.True(t, c.AllowSubscription(0))
	require.True(t, c.AllowSubscription(1))
	require.False(t, c.AllowSubscription(2))
	require.False(t, c.AllowSubscription(3))
	require.True(t, NewQuotas(QuotaConfig{}, nil).AllowSubscription(1<<20))
}

func TestCheckTopic(t *testing.T) {
	q := NewQuotas(QuotaConfig{}, nil)
	levels := func(n int) string { return strings.Repeat("a/", n-1) + "a" }

	require.NoError(t, q.CheckTopic(levels(32)))
	require.ErrorIs(t, q.CheckTopic(levels(33)), ErrTopicTooDeep)
	require.ErrorIs(t, q.CheckTopic(strings.Repeat("/", 32)), ErrTopicTooDeep, "empty levels count")
	require.NoError(t, q.CheckTopic(strings.Repeat("x", 1024)))
	require.ErrorIs(t, q.CheckTopic(strings.Repeat("x", 1025)), ErrTopicTooLong)

	require.NoError(t, CheckTopic(levels(1000), 0, 0), "zero is no limit")
	require.NoError(t, NewQuotas(QuotaConfig{MaxTopicLevels: -1, MaxTopicLength: -1}, nil).CheckTopic(levels(5000)))
	require.ErrorIs(t, CheckTopic("a/b/c", 2, 0), ErrTopicTooDeep)
	require.ErrorIs(t, CheckTopic("abc", 0, 2), ErrTopicTooLong)
	require.ErrorContains(t, CheckTopic("abc", 0, 2), "3 bytes, at most 2")
}

func BenchmarkAllowPublish(b *testing.B) {
	q := NewQuotas(QuotaConfig{PublishRate: 1e12, PublishBurst: 1 << 30, ByteRate: 1e15, ByteBurst: 1 << 30}, nil)
	c := q.NewClientLimiter()
	b.ReportAllocs()
	for b.Loop() {
		if ok, _ := c.AllowPublish(256); !ok {
			b.Fatal("refused")
		}
	}
}
