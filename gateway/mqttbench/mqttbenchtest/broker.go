// Package mqttbenchtest runs an in-process MQTT broker (ferrymq's engine,
// everyone allowed unless told otherwise) on loopback ports for tests of
// MQTT clients and load tools.
package mqttbenchtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Broker is a running in-process broker.
type Broker struct {
	Engine *engine.Engine
	// Addr is the MQTT over TCP address, tcp://127.0.0.1:port.
	Addr string
	// WSAddr is the MQTT over websocket address, ws://127.0.0.1:port/mqtt.
	WSAddr string
	// TLSAddr is the MQTT over TLS address, tls://127.0.0.1:port, served
	// with a self-signed certificate for 127.0.0.1 and localhost.
	TLSAddr string
	// CAFile is that certificate in a PEM file; Roots holds it.
	CAFile string
	Roots  *x509.CertPool
}

// Options adjust a test broker.
type Options struct {
	// Auth decides who may connect; default: all.
	Auth engine.Authenticator
	// ACL decides topics; default: every topic for everyone.
	ACL engine.Authorizer
	// Uplink sees every publish; default: delivered as published.
	Uplink engine.Uplink
}

// Start starts a broker with one TCP, one websocket and one TLS listener
// on free loopback ports; t's cleanup shuts it down.
func Start(t testing.TB, o Options) *Broker {
	t.Helper()
	cert, certPEM := selfSigned(t)
	e, err := engine.New(engine.Options{
		Listeners: []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}, {Type: "ws", Addr: "127.0.0.1:0"},
			{Name: "tls", Type: "tcp", Addr: "127.0.0.1:0", TLS: &tls.Config{Certificates: []tls.Certificate{cert}}}},
		Hooks:            engine.Hooks{Auth: o.Auth, ACL: o.ACL, Uplink: o.Uplink},
		MaxPendingWrites: 1024,
	})
	require.NoError(t, err)
	require.NoError(t, e.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Shutdown(ctx))
	})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, certPEM, 0o600))
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(certPEM))
	return &Broker{Engine: e, Addr: "tcp://" + e.Addr("tcp").String(), WSAddr: "ws://" + e.Addr("ws").String() + "/mqtt",
		TLSAddr: "tls://" + e.Addr("tls").String(), CAFile: caFile, Roots: roots}
}

// selfSigned makes an ECDSA P-256 certificate for 127.0.0.1 and
// localhost, valid for a day, and returns it with its PEM.
func selfSigned(t testing.TB) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "mqttbenchtest"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
