package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

var jwtSecret = []byte("jwt-shared-secret")

func newRSAKey(t testing.TB) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	return k
}

func newECKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

// signToken signs claims with key using method.
func signToken(t testing.TB, method jwt.SigningMethod, key any, claims jwt.Claims) []byte {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	require.NoError(t, err)
	return []byte(s)
}

func claimsFor(clientID string, exp time.Time) *Claims {
	return &Claims{
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(exp)},
		ClientID:         clientID,
	}
}

func TestJWT(t *testing.T) {
	now := time.Unix(1_767_225_600, 0)
	exp := now.Add(time.Hour)
	rsaKey, ecKey, otherRSA := newRSAKey(t), newECKey(t), newRSAKey(t)

	hs, err := NewJWT(JWTOptions{Secret: jwtSecret})
	require.NoError(t, err)
	pk, err := NewJWT(JWTOptions{PublicKeys: []crypto.PublicKey{&rsaKey.PublicKey, &ecKey.PublicKey}, Issuer: "ferry", Audience: "gw"})
	require.NoError(t, err)
	rsaOnly, err := NewJWT(JWTOptions{PublicKeys: []crypto.PublicKey{&rsaKey.PublicKey}})
	require.NoError(t, err)

	t.Run("HS256 with acl claim", func(t *testing.T) {
		c := claimsFor("dev-1", exp)
		c.ACL = &ACLClaim{Pub: []string{"devices/%c/up"}, Sub: []string{"devices/%c/down/#"}}
		id, err := hs.Authenticate(&Request{ClientID: "dev-1", Username: "whatever", Password: signToken(t, jwt.SigningMethodHS256, jwtSecret, c), Now: now})
		require.NoError(t, err)
		require.Equal(t, Identity{
			ClientID: "dev-1", Username: "dev-1", Provider: ProviderJWT, Expires: exp, // the client ID: no sub
			Publish: []string{"devices/%c/up"}, Subscribe: []string{"devices/%c/down/#"},
		}, id)
	})
	t.Run("username from sub, not from the CONNECT", func(t *testing.T) {
		// %u rules and grants must not follow a name the client chose.
		c := claimsFor("dev-1", exp)
		c.Subject = "fleet-7"
		id, err := hs.Authenticate(&Request{ClientID: "dev-1", Username: "admin", Password: signToken(t, jwt.SigningMethodHS256, jwtSecret, c), Now: now})
		require.NoError(t, err)
		require.Equal(t, "fleet-7", id.Username)
	})
	t.Run("RS256 and ES256 with sub, iss, aud", func(t *testing.T) {
		c := &Claims{RegisteredClaims: jwt.RegisteredClaims{
			Subject: "dev-2", Issuer: "ferry", Audience: jwt.ClaimStrings{"gw"}, ExpiresAt: jwt.NewNumericDate(exp),
		}}
		for _, tok := range [][]byte{
			signToken(t, jwt.SigningMethodRS256, rsaKey, c),
			signToken(t, jwt.SigningMethodES256, ecKey, c),
		} {
			id, err := pk.Authenticate(&Request{ClientID: "dev-2", Username: "admin", Password: tok, Now: now})
			require.NoError(t, err)
			require.Equal(t, "dev-2", id.ClientID)
			require.Equal(t, "dev-2", id.Username, "sub, never the unchecked MQTT username")
			require.Equal(t, exp, id.Expires)
		}
	})

	good := signToken(t, jwt.SigningMethodHS256, jwtSecret, claimsFor("dev-1", exp))
	noneToken, err := jwt.NewWithClaims(jwt.SigningMethodNone, claimsFor("dev-1", exp)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	// Key confusion: an HS256 token whose "secret" is the RSA public key.
	pubDER, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	require.NoError(t, err)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	confused := signToken(t, jwt.SigningMethodHS256, pubPEM, claimsFor("dev-1", exp))
	noExp := signToken(t, jwt.SigningMethodHS256, jwtSecret, &Claims{ClientID: "dev-1"})
	noClient := signToken(t, jwt.SigningMethodHS256, jwtSecret, claimsFor("", exp))
	wrongIss := claimsFor("dev-1", exp)
	wrongIss.Issuer, wrongIss.Audience = "evil", jwt.ClaimStrings{"gw"}
	badACL := claimsFor("dev-1", exp)
	badACL.ACL = &ACLClaim{Pub: []string{""}}

	for _, tc := range []struct {
		name string
		p    *JWT
		req  Request
		want error
	}{
		{"empty password", hs, Request{ClientID: "dev-1", Now: now}, ErrNotMine},
		{"not a token", hs, Request{ClientID: "dev-1", Password: []byte("hunter2"), Now: now}, ErrNotMine},
		{"two segments", hs, Request{ClientID: "dev-1", Password: []byte("a.b"), Now: now}, ErrNotMine},
		{"alg none", hs, Request{ClientID: "dev-1", Password: []byte(noneToken), Now: now}, jwt.ErrTokenSignatureInvalid},
		{"wrong secret", hs, Request{ClientID: "dev-1", Password: signToken(t, jwt.SigningMethodHS256, []byte("guess"), claimsFor("dev-1", exp)), Now: now}, jwt.ErrTokenSignatureInvalid},
		{"wrong RSA key", rsaOnly, Request{ClientID: "dev-1", Password: signToken(t, jwt.SigningMethodRS256, otherRSA, claimsFor("dev-1", exp)), Now: now}, jwt.ErrTokenSignatureInvalid},
		{"HS256 when only RS256", rsaOnly, Request{ClientID: "dev-1", Password: confused, Now: now}, jwt.ErrTokenSignatureInvalid},
		{"ES256 when only RS256", rsaOnly, Request{ClientID: "dev-1", Password: signToken(t, jwt.SigningMethodES256, ecKey, claimsFor("dev-1", exp)), Now: now}, jwt.ErrTokenSignatureInvalid},
		{"expired", hs, Request{ClientID: "dev-1", Password: good, Now: exp.Add(time.Second)}, jwt.ErrTokenExpired},
		{"no exp", hs, Request{ClientID: "dev-1", Password: noExp, Now: now}, jwt.ErrTokenRequiredClaimMissing},
		{"client id mismatch", hs, Request{ClientID: "dev-2", Password: good, Now: now}, ErrDenied},
		{"no client id claim", hs, Request{ClientID: "dev-1", Password: noClient, Now: now}, ErrDenied},
		{"wrong issuer", pk, Request{ClientID: "dev-1", Password: signToken(t, jwt.SigningMethodRS256, rsaKey, wrongIss), Now: now}, jwt.ErrTokenInvalidIssuer},
		{"missing audience", pk, Request{ClientID: "dev-1", Password: signToken(t, jwt.SigningMethodRS256, rsaKey, claimsFor("dev-1", exp)), Now: now}, jwt.ErrTokenRequiredClaimMissing},
		{"bad acl filter", hs, Request{ClientID: "dev-1", Password: signToken(t, jwt.SigningMethodHS256, jwtSecret, badACL), Now: now}, ErrDenied},
		{"too long", hs, Request{ClientID: "dev-1", Password: []byte("a." + strings.Repeat("b", MaxTokenBytes) + ".c"), Now: now}, ErrDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.p.Authenticate(&tc.req)
			require.ErrorIs(t, err, tc.want)
			if tc.want != ErrNotMine {
				require.ErrorIs(t, err, ErrDenied)
				require.NotContains(t, err.Error(), string(tc.req.Password), "a token never appears in an error")
			}
		})
	}
}

func TestNewJWTOptions(t *testing.T) {
	ec := newECKey(t)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		opts JWTOptions
		want string
	}{
		{"nothing", JWTOptions{}, "no secret or public key"},
		{"none", JWTOptions{Secret: jwtSecret, Algorithms: []string{"none"}}, `unsupported algorithm "none"`},
		{"HS256 without secret", JWTOptions{PublicKeys: []crypto.PublicKey{&ec.PublicKey}, Algorithms: []string{AlgHS256}}, "HS256 without a secret"},
		{"RS256 without key", JWTOptions{PublicKeys: []crypto.PublicKey{&ec.PublicKey}, Algorithms: []string{AlgRS256}}, "RS256 without"},
		{"P-384", JWTOptions{Secret: jwtSecret, PublicKeys: []crypto.PublicKey{&p384.PublicKey}}, "neither RSA nor ECDSA P-256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewJWT(tc.opts)
			require.ErrorIs(t, err, ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), string(jwtSecret))
		})
	}
}

func TestLoadPublicKeys(t *testing.T) {
	rsaKey, ecKey := newRSAKey(t), newECKey(t)
	ecDER, err := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	require.NoError(t, err)
	data := append(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&rsaKey.PublicKey)}),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER})...)
	path := filepath.Join(t.TempDir(), "keys.pem")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	keys, err := LoadPublicKeys(path)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.True(t, rsaKey.PublicKey.Equal(keys[0]))
	require.True(t, ecKey.PublicKey.Equal(keys[1]))

	// The repository's test certificates hold P-256 keys.
	keys, err = LoadPublicKeys("../testdata/tls/client.pem")
	require.NoError(t, err)
	require.Len(t, keys, 1)

	_, err = ParsePublicKeys([]byte("no pem here"))
	require.ErrorIs(t, err, ErrKeyFile)
	_, err = ParsePublicKeys(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("junk")}))
	require.ErrorIs(t, err, ErrKeyFile)
	_, err = LoadPublicKeys(filepath.Join(t.TempDir(), "missing.pem"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
