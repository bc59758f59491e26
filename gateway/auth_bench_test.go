package gateway_test

import (
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

func connectWith(id, user, pass string) []byte {
	return packet(0x10, str("MQTT"), []byte{4, 0xC2, 0, 60}, str(id), str(user), str(pass))
}

// BenchmarkConnectAuth: one CONNECT → CONNACK → close after another, with
// no auth, with HMAC credentials (a signature check per connect), with the
// static file (bcrypt once per device, then the verified-credential cache).
//
//	go test -run '^$' -bench ConnectAuth -benchtime 3000x ./gateway/
func BenchmarkConnectAuth(b *testing.B) {
	secret := []byte("product-secret")
	hmacP, err := auth.NewHMAC(auth.HMACOptions{ProductSecrets: map[string][]byte{"fleet": secret}})
	require.NoError(b, err)
	for _, tc := range []struct {
		name string
		hook *auth.Hook
		cred func(i int) (id, user, pass string)
	}{
		{"none", nil, func(i int) (string, string, string) { return "c" + strconv.Itoa(i), "u", "p" }},
		{"hmac", auth.NewHook(auth.HookOptions{Chain: &auth.Chain{Providers: []auth.Provider{hmacP}}}),
			func(i int) (string, string, string) {
				id, now := "car-"+strconv.Itoa(i), time.Now()
				return id, auth.HMACUsername("fleet", id, now), auth.SignHMAC(secret, id, now)
			}},
	} {
		b.Run("auth="+tc.name, func(b *testing.B) {
			env := gatewaytest.Start(b, gatewaytest.Options{Auth: tc.hook})
			ack := make([]byte, 4)
			i := 0
			for b.Loop() {
				id, user, pass := tc.cred(i)
				i++
				c, err := net.Dial("tcp", env.TCP)
				require.NoError(b, err)
				_, err = c.Write(connectWith(id, user, pass))
				require.NoError(b, err)
				_, err = io.ReadFull(c, ack)
				require.NoError(b, err)
				require.Equal(b, byte(0), ack[3], "CONNACK")
				_ = c.Close()
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "connects/s")
		})
	}
}
