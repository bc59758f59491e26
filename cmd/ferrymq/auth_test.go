package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/ferrymq/ferrymq/auth"
)

func TestAuthHashPassword(t *testing.T) {
	r := mustCLI(t, "s3cret\n", "auth", "hash-password", "--cost", "4")
	hash := strings.TrimSuffix(r.out, "\n")
	require.NoError(t, bcrypt.CompareHashAndPassword([]byte(hash), []byte("s3cret")), "the trailing newline is not part of the password")
	cost, err := bcrypt.Cost([]byte(hash))
	require.NoError(t, err)
	require.Equal(t, 4, cost)

	r = mustCLI(t, "pw", "auth", "hash-password") // default cost, no newline
	cost, err = bcrypt.Cost([]byte(strings.TrimSpace(r.out)))
	require.NoError(t, err)
	require.Equal(t, bcrypt.DefaultCost, cost)

	// The hash works in a credentials file.
	users, err := auth.ParseCredentials([]byte("users:\n  - username: a\n    password_hash: " + hash + "\n"))
	require.NoError(t, err)
	require.Len(t, users, 1)

	requireOneLineError(t, cli(t, t.Context(), "", "auth", "hash-password"), "empty password")
	requireOneLineError(t, cli(t, t.Context(), "x", "auth", "hash-password", "--cost", "3"), "--cost must be between 4 and 31")
	r = cli(t, t.Context(), strings.Repeat("p", 73), "auth", "hash-password", "--cost", "4")
	requireOneLineError(t, r, "72 bytes")
	require.NotContains(t, r.err, strings.Repeat("p", 10))
}

func TestAuthSign(t *testing.T) {
	at := "2026-01-01T00:00:00.123Z"
	r := mustCLI(t, "", "auth", "sign", "--clientid", "sn-1", "--product", "meter", "--device", "m-1", "--secret", "sek", "--at", at)
	ts, err := time.Parse(time.RFC3339Nano, at)
	require.NoError(t, err)
	require.Equal(t, []string{"username meter:m-1:1767225600123", "password " + auth.SignHMAC([]byte("sek"), "sn-1", ts)}, r.lines())

	// The credentials pass the HMAC provider.
	h, err := auth.NewHMAC(auth.HMACOptions{ProductSecrets: map[string][]byte{"meter": []byte("sek")}})
	require.NoError(t, err)
	r = mustCLI(t, "", "auth", "sign", "--clientid", "sn-1", "--product", "meter", "--device", "m-1", "--secret", "sek", "--json")
	var creds map[string]string
	require.NoError(t, json.Unmarshal([]byte(r.out), &creds))
	require.Equal(t, "sn-1", creds["clientid"])
	id, err := h.Authenticate(&auth.Request{ClientID: "sn-1", Username: creds["username"], Password: []byte(creds["password"])})
	require.NoError(t, err)
	require.Equal(t, "meter:m-1", id.Username)

	requireOneLineError(t, cli(t, t.Context(), "", "auth", "sign", "--clientid", "c", "--product", "p", "--device", "d"), `required flag(s) "secret" not set`)
	requireOneLineError(t, cli(t, t.Context(), "", "auth", "sign", "--clientid", "c", "--product", "p:x", "--device", "d", "--secret", "s"), "--product and --device")
	requireOneLineError(t, cli(t, t.Context(), "", "auth", "sign", "--clientid", "c/#", "--product", "p", "--device", "d", "--secret", "s"), "forbidden character")
	requireOneLineError(t, cli(t, t.Context(), "", "auth", "sign", "--clientid", "c", "--product", "p", "--device", "d", "--secret", "s", "--at", "yesterday"), "--at")
}

// writeKeyPEM writes a private key as PEM and returns its path.
func writeKeyPEM(t testing.TB, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key.pem")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
	return path
}

func TestAuthJWT(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ecDER, err := x509.MarshalECPrivateKey(ecKey)
	require.NoError(t, err)
	pkcs8, err := x509.MarshalPKCS8PrivateKey(rsaKey)
	require.NoError(t, err)

	verify := func(t *testing.T, opts auth.JWTOptions, token string) auth.Identity {
		t.Helper()
		p, err := auth.NewJWT(opts)
		require.NoError(t, err)
		id, err := p.Authenticate(&auth.Request{ClientID: "sn-1", Password: []byte(strings.TrimSpace(token))})
		require.NoError(t, err)
		return id
	}

	r := mustCLI(t, "", "auth", "jwt", "--clientid", "sn-1", "--secret", "sek", "--ttl", "2h",
		"--pub", "devices/%c/up", "--pub", "a,b", "--sub", "devices/%c/down/#", "--iss", "ferry", "--aud", "gw")
	id := verify(t, auth.JWTOptions{Secret: []byte("sek"), Issuer: "ferry", Audience: "gw"}, r.out)
	require.Equal(t, []string{"devices/%c/up", "a,b"}, id.Publish)
	require.Equal(t, []string{"devices/%c/down/#"}, id.Subscribe)
	require.WithinDuration(t, time.Now().Add(2*time.Hour), id.Expires, time.Minute)

	for _, tc := range []struct {
		name, typ string
		der       []byte
		pub       crypto.PublicKey
		alg       string
	}{
		{"RS256 PKCS8", "PRIVATE KEY", pkcs8, &rsaKey.PublicKey, auth.AlgRS256},
		{"RS256 PKCS1", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey), &rsaKey.PublicKey, auth.AlgRS256},
		{"ES256 SEC1", "EC PRIVATE KEY", ecDER, &ecKey.PublicKey, auth.AlgES256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeKeyPEM(t, tc.typ, tc.der)
			r := mustCLI(t, "", "auth", "jwt", "--clientid", "sn-1", "--key", path, "--alg", tc.alg)
			verify(t, auth.JWTOptions{PublicKeys: []crypto.PublicKey{tc.pub}}, r.out)
		})
	}

	// The repository's test client key is a PKCS #8 P-256 key.
	r = mustCLI(t, "", "auth", "jwt", "--clientid", "sn-1", "--key", "../../testdata/tls/client-key.pem")
	keys, err := auth.LoadPublicKeys("../../testdata/tls/client.pem")
	require.NoError(t, err)
	verify(t, auth.JWTOptions{PublicKeys: keys}, r.out)

	ecPath := writeKeyPEM(t, "EC PRIVATE KEY", ecDER)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--clientid", "sn-1"}, "at least one of the flags in the group [secret key] is required"},
		{[]string{"--clientid", "sn-1", "--secret", "s", "--key", ecPath}, "none of the others can be"},
		{[]string{"--clientid", "sn-1", "--secret", "s", "--alg", "RS256"}, "--secret signs HS256, not RS256"},
		{[]string{"--clientid", "sn-1", "--key", ecPath, "--alg", "RS256"}, "signs ES256, not RS256"},
		{[]string{"--clientid", "sn-1", "--key", filepath.Join(t.TempDir(), "none.pem")}, "no such file"},
		{[]string{"--clientid", "sn-1", "--secret", "s", "--ttl", "0s"}, "--ttl must be positive"},
		{[]string{"--clientid", "a/+", "--secret", "s"}, "forbidden character"},
	} {
		r := cli(t, t.Context(), "", append([]string{"auth", "jwt"}, tc.args...)...)
		requireOneLineError(t, r, tc.want)
		require.NotContains(t, r.err, "sek")
	}
}

func TestAuthCommandsHaveExamples(t *testing.T) {
	cmd := newAuthCmd()
	require.NotEmpty(t, cmd.Example)
	for _, c := range cmd.Commands() {
		require.NotEmpty(t, c.Example, c.Name())
		require.NotEmpty(t, c.Short, c.Name())
	}
	r := mustCLI(t, "", "auth", "--help")
	require.Contains(t, r.out, "hash-password")
	requireOneLineError(t, cli(t, t.Context(), "", "auth", "frobnicate"), `unknown command "frobnicate" for "ferrymq auth"`)
}
