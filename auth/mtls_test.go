package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// newCertChain returns a leaf certificate signed by a fresh CA, as a
// verified chain [leaf, ca].
func newCertChain(t testing.TB, tmpl *x509.Certificate) []*x509.Certificate {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl.SerialNumber = big.NewInt(2)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour).Truncate(time.Second)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return []*x509.Certificate{leaf, ca}
}

func TestMTLS(t *testing.T) {
	spiffe, err := url.Parse("spiffe://ferry/dev-3")
	require.NoError(t, err)
	chain := newCertChain(t, &x509.Certificate{
		Subject:        pkix.Name{CommonName: "dev-1"},
		DNSNames:       []string{"dev-2.example", "alt.example"},
		EmailAddresses: []string{"dev@example.com"},
		URIs:           []*url.URL{spiffe},
	})
	verified := &tls.ConnectionState{PeerCertificates: chain, VerifiedChains: [][]*x509.Certificate{chain}}
	newMTLS := func(opts MTLSOptions) *MTLS {
		m, err := NewMTLS(opts)
		require.NoError(t, err)
		return m
	}

	for _, tc := range []struct {
		name     string
		opts     MTLSOptions
		clientID string
		want     string
	}{
		{"cn", MTLSOptions{}, "anything", "dev-1"},
		{"cn bound", MTLSOptions{RequireClientID: true}, "dev-1", "dev-1"},
		{"dns", MTLSOptions{Field: FieldDNS}, "x", "dev-2.example"},
		{"dns bound to second name", MTLSOptions{Field: FieldDNS, RequireClientID: true}, "alt.example", "alt.example"},
		{"email", MTLSOptions{Field: FieldEmail}, "x", "dev@example.com"},
		{"uri", MTLSOptions{Field: FieldURI}, "x", "spiffe://ferry/dev-3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := newMTLS(tc.opts).Authenticate(&Request{ClientID: tc.clientID, TLS: verified})
			require.NoError(t, err)
			require.Equal(t, Identity{ClientID: tc.clientID, Username: tc.want, Provider: ProviderMTLS, Expires: chain[0].NotAfter}, id)
		})
	}

	m := newMTLS(MTLSOptions{RequireClientID: true})
	_, err = m.Authenticate(&Request{ClientID: "dev-9", TLS: verified})
	require.ErrorIs(t, err, ErrDenied, "client id must equal the certificate's CN")
	_, err = m.Authenticate(&Request{ClientID: "dev-1"})
	require.ErrorIs(t, err, ErrNotMine, "plain TCP")
	_, err = m.Authenticate(&Request{ClientID: "dev-1", TLS: &tls.ConnectionState{PeerCertificates: chain}})
	require.ErrorIs(t, err, ErrNotMine, "a presented but unverified certificate is not trusted")

	noCN := newCertChain(t, &x509.Certificate{})
	_, err = newMTLS(MTLSOptions{}).Authenticate(&Request{ClientID: "c", TLS: &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{noCN}}})
	require.ErrorIs(t, err, ErrDenied)

	wild := newCertChain(t, &x509.Certificate{Subject: pkix.Name{CommonName: "dev/#"}})
	_, err = newMTLS(MTLSOptions{}).Authenticate(&Request{ClientID: "c", TLS: &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{wild}}})
	require.ErrorIs(t, err, ErrDenied)

	_, err = NewMTLS(MTLSOptions{Field: "serial"})
	require.ErrorIs(t, err, ErrInvalidOptions)
}

// TestChainProviders runs the real providers together, as the gateway
// will: a certificate, a token, an HMAC signature and a password each find
// their provider.
func TestChainProviders(t *testing.T) {
	now := time.Now()
	chain := newCertChain(t, &x509.Certificate{Subject: pkix.Name{CommonName: "cert-dev"}})
	m, err := NewMTLS(MTLSOptions{RequireClientID: true})
	require.NoError(t, err)
	j, err := NewJWT(JWTOptions{Secret: jwtSecret})
	require.NoError(t, err)
	h := newTestHMAC(t, HMACOptions{})
	s, _ := newStatic(t, credentialsYAML(User{Username: "alice", PasswordHash: hashPassword(t, "pw")}), zerolog.Nop())
	c := &Chain{Providers: []Provider{m, j, h, s}}

	for _, tc := range []struct {
		req  *Request
		want string
	}{
		{&Request{ClientID: "cert-dev", TLS: &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{chain}}}, ProviderMTLS},
		{&Request{ClientID: "jwt-dev", Password: signToken(t, jwt.SigningMethodHS256, jwtSecret, claimsFor("jwt-dev", now.Add(time.Hour)))}, ProviderJWT},
		{hmacRequest(productSecret, "hmac-dev", "meter", "m-1", now, time.Time{}), ProviderHMAC},
		{&Request{ClientID: "pw-dev", Username: "alice", Password: []byte("pw")}, ProviderStatic},
	} {
		id, err := c.Authenticate(tc.req)
		require.NoError(t, err)
		require.Equal(t, tc.want, id.Provider)
	}
	_, err = c.Authenticate(&Request{ClientID: "x", Username: "mallory", Password: []byte("pw")})
	require.ErrorIs(t, err, ErrDenied)
}
