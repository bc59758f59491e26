package jetstream_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// TestCredentialsAndTLS: the engine authenticates with user and password
// or a token, and speaks TLS with a client certificate (mutual TLS) to a
// real nats-server configured for each; wrong credentials are refused
// with an error, not a hang.
func TestCredentialsAndTLS(t *testing.T) {
	open := func(url string, o jetstream.Options) error {
		o.URLs, o.Timeout = []string{url}, 2*time.Second
		e, err := jetstream.Open(t.Context(), o)
		if err != nil {
			return err
		}
		defer e.Close()
		_, err = e.Produce(t.Context(), &core.Message{Topic: "t", Body: []byte("x")})
		return err
	}
	userPass := natstest.RunServer(t, func(o *server.Options) { o.Username, o.Password = "ferrymq", "s3cret" })
	require.NoError(t, open(userPass.URL, jetstream.Options{User: "ferrymq", Password: "s3cret"}))
	require.Error(t, open(userPass.URL, jetstream.Options{User: "ferrymq", Password: "wrong"}))

	tok := natstest.RunServer(t, func(o *server.Options) { o.Authorization = "tok-123" })
	require.NoError(t, open(tok.URL, jetstream.Options{Token: "tok-123"}))
	require.Error(t, open(tok.URL, jetstream.Options{Token: "nope"}))

	dir := filepath.Join("..", "..", "testdata", "tls")
	serverTLS, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"),
		CaFile: filepath.Join(dir, "ca.pem"), Verify: true,
	})
	require.NoError(t, err)
	secure := natstest.RunServer(t, func(o *server.Options) { o.TLSConfig, o.TLS, o.TLSVerify = serverTLS, true, true })
	pem, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pem))
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem"))
	require.NoError(t, err)
	url := "tls://" + secure.Addr().String()
	require.NoError(t, open(url, jetstream.Options{TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}))
	require.Error(t, open(url, jetstream.Options{TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}), "no client certificate")
}
