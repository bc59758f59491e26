package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/bcrypt"

	"github.com/ferrymq/ferrymq/auth"
)

func newAuthCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Make device credentials: password hashes, HMAC signatures, JWTs",
		Example: `  echo -n 's3cret' | ferrymq auth hash-password
  ferrymq auth sign --clientid sn-1 --product meter --device m-1 --secret "$METER_SECRET"
  ferrymq auth jwt --clientid sn-1 --key signer.pem --ttl 24h --pub 'devices/%c/up'`,
		Args: cobra.NoArgs,
		RunE: helpRunE,
	}
	cmd.AddCommand(newAuthHashPasswordCmd(), newAuthSignCmd(), newAuthJWTCmd())
	return cmd
}

// maxPasswordBytes bounds what hash-password reads; bcrypt uses at most
// 72 bytes anyway.
const maxPasswordBytes = 1 << 10

type authHashPasswordOptions struct {
	cost int
}

func (o *authHashPasswordOptions) AddFlags(cmd *cobra.Command) {
	cmd.Flags().IntVar(&o.cost, "cost", bcrypt.DefaultCost, fmt.Sprintf("bcrypt cost, %d to %d (each step doubles the work)", bcrypt.MinCost, bcrypt.MaxCost))
}

func newAuthHashPasswordCmd() *cobra.Command {
	o := &authHashPasswordOptions{}
	cmd := &cobra.Command{
		Use:   "hash-password",
		Short: "Read a password on stdin and print its bcrypt hash for a credentials file",
		Long: `Read a password on stdin (one trailing newline is dropped) and print its
bcrypt hash, the password_hash of a users entry in a credentials file.`,
		Example: `  echo -n 's3cret' | ferrymq auth hash-password
  ferrymq auth hash-password --cost 12 < password.txt`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *authHashPasswordOptions) run(cmd *cobra.Command, _ []string) error {
	if o.cost < bcrypt.MinCost || o.cost > bcrypt.MaxCost {
		return fmt.Errorf("--cost must be between %d and %d, got %d", bcrypt.MinCost, bcrypt.MaxCost, o.cost)
	}
	data, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxPasswordBytes+1))
	if err != nil {
		return fmt.Errorf("read password: %w", err)
	}
	if len(data) > maxPasswordBytes {
		return fmt.Errorf("password longer than %d bytes", maxPasswordBytes)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	if pw == "" {
		return errors.New("empty password on stdin")
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(pw), o.cost)
	if err != nil {
		return fmt.Errorf("hash password: %w", err) // bcrypt: password length exceeds 72 bytes
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", hash)
	return err
}

type authSignOptions struct {
	clientID, product, device, secret, at string
	json                                  bool
}

func (o *authSignOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.clientID, "clientid", "", "client ID the device connects with (required)")
	f.StringVar(&o.product, "product", "", "product name (required)")
	f.StringVar(&o.device, "device", "", "device name (required)")
	f.StringVar(&o.secret, "secret", "", "the product's or the device's secret (required)")
	f.StringVar(&o.at, "at", "", "sign for this RFC 3339 time instead of now")
	f.BoolVar(&o.json, "json", false, "print clientid, username and password as JSON")
	for _, name := range []string{"clientid", "product", "device", "secret"} {
		_ = cmd.MarkFlagRequired(name)
	}
}

func newAuthSignCmd() *cobra.Command {
	o := &authSignOptions{}
	cmd := &cobra.Command{
		Use:   "sign",
		Short: "Print the username and password of a device for the HMAC provider",
		Long: `Print the MQTT username and password a device presents to the HMAC
provider:

  username  <product>:<device>:<unix milliseconds>
  password  base64(HMAC-SHA256(secret, <client id> + <unix milliseconds>))

They are valid within the server's allowed clock skew (5 minutes by
default) of the signing time, once.`,
		Example: `  ferrymq auth sign --clientid sn-1 --product meter --device m-1 --secret "$METER_SECRET"
  ferrymq auth sign --clientid sn-1 --product meter --device m-1 --secret "$S" --at 2026-01-01T00:00:00Z --json`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *authSignOptions) run(cmd *cobra.Command, _ []string) error {
	at := time.Now()
	if o.at != "" {
		t, err := time.Parse(time.RFC3339Nano, o.at)
		if err != nil {
			return fmt.Errorf("--at: want an RFC 3339 time, got %q", o.at)
		}
		at = t
	}
	if !auth.ValidID(o.clientID) {
		return fmt.Errorf("--clientid %q holds a forbidden character (+ # / or NUL)", o.clientID)
	}
	username := auth.HMACUsername(o.product, o.device, at)
	if _, _, _, err := auth.ParseHMACUsername(username); err != nil {
		return errors.New("--product and --device must be non-empty without ':', '+', '#', '/' or NUL")
	}
	password := auth.SignHMAC([]byte(o.secret), o.clientID, at)
	if o.json {
		return writeJSON(cmd.OutOrStdout(), map[string]string{"clientid": o.clientID, "username": username, "password": password})
	}
	_, err := fmt.Fprintf(cmd.OutOrStdout(), "username %s\npassword %s\n", username, password)
	return err
}

type authJWTOptions struct {
	clientID, secret, key, alg, iss, aud string
	ttl                                  time.Duration
	pub, sub                             []string
}

func (o *authJWTOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.clientID, "clientid", "", "client ID the token is for, its clientid claim (required)")
	f.StringVar(&o.secret, "secret", "", "HS256 shared secret")
	f.StringVar(&o.key, "key", "", "PEM private key file (RSA for RS256, ECDSA P-256 for ES256)")
	f.StringVar(&o.alg, "alg", "", "HS256, RS256 or ES256 (default: from --secret or the key)")
	f.DurationVar(&o.ttl, "ttl", time.Hour, "how long the token is valid (its exp claim)")
	f.StringArrayVar(&o.pub, "pub", nil, "topic filter the token lets the client publish to (repeatable; %c and %u allowed)")
	f.StringArrayVar(&o.sub, "sub", nil, "topic filter the token lets the client subscribe to (repeatable)")
	f.StringVar(&o.iss, "iss", "", "issuer claim")
	f.StringVar(&o.aud, "aud", "", "audience claim")
	_ = cmd.MarkFlagRequired("clientid")
	cmd.MarkFlagsMutuallyExclusive("secret", "key")
	cmd.MarkFlagsOneRequired("secret", "key")
}

func newAuthJWTCmd() *cobra.Command {
	o := &authJWTOptions{}
	cmd := &cobra.Command{
		Use:   "jwt",
		Short: "Print a JWT a device presents as its password to the JWT provider",
		Example: `  ferrymq auth jwt --clientid sn-1 --secret "$JWT_SECRET"
  ferrymq auth jwt --clientid sn-1 --key signer.pem --ttl 24h --pub 'devices/%c/up' --sub 'devices/%c/down/#'`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.AddFlags(cmd)
	return cmd
}

func (o *authJWTOptions) run(cmd *cobra.Command, _ []string) error {
	if o.ttl <= 0 {
		return fmt.Errorf("--ttl must be positive, got %v", o.ttl)
	}
	if !auth.ValidID(o.clientID) || o.clientID == "" {
		return fmt.Errorf("--clientid %q is empty or holds a forbidden character (+ # / or NUL)", o.clientID)
	}
	method, key, err := o.signer()
	if err != nil {
		return err
	}
	now := time.Now()
	c := auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    o.iss,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(o.ttl)),
		},
		ClientID: o.clientID,
	}
	if o.aud != "" {
		c.Audience = jwt.ClaimStrings{o.aud}
	}
	if len(o.pub)+len(o.sub) > 0 {
		c.ACL = &auth.ACLClaim{Pub: o.pub, Sub: o.sub}
	}
	tok, err := jwt.NewWithClaims(method, c).SignedString(key)
	if err != nil {
		return fmt.Errorf("sign token: %w", err)
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), tok)
	return err
}

// signer returns the signing method and key from --secret or --key and
// --alg.
func (o *authJWTOptions) signer() (jwt.SigningMethod, any, error) {
	if o.secret != "" {
		if o.alg != "" && o.alg != auth.AlgHS256 {
			return nil, nil, fmt.Errorf("--secret signs HS256, not %s", o.alg)
		}
		return jwt.SigningMethodHS256, []byte(o.secret), nil
	}
	key, err := loadPrivateKey(o.key)
	if err != nil {
		return nil, nil, err
	}
	var want string
	switch k := key.(type) {
	case *rsa.PrivateKey:
		want = auth.AlgRS256
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, nil, fmt.Errorf("--key %s: ES256 needs a P-256 key", o.key)
		}
		want = auth.AlgES256
	default:
		return nil, nil, fmt.Errorf("--key %s: %T is neither RSA nor ECDSA", o.key, key)
	}
	if o.alg != "" && o.alg != want {
		return nil, nil, fmt.Errorf("--key %s signs %s, not %s", o.key, want, o.alg)
	}
	return jwt.GetSigningMethod(want), key, nil
}

// loadPrivateKey reads the first private key of a PEM file: PKCS #8
// "PRIVATE KEY", PKCS #1 "RSA PRIVATE KEY" or SEC 1 "EC PRIVATE KEY".
func loadPrivateKey(path string) (any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--key: %w", err)
	}
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, fmt.Errorf("--key %s: no private key", path)
		}
		var k any
		switch b.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(b.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("--key %s: %s: %w", path, b.Type, err)
		}
		return k, nil
	}
}
