package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
)

// ProviderJWT is the Name of a JWT provider.
const ProviderJWT = "jwt"

// Algorithms a JWT provider can accept.
const (
	AlgHS256 = "HS256"
	AlgRS256 = "RS256"
	AlgES256 = "ES256"
)

// Bounds on what a JWT provider reads.
const (
	// MaxTokenBytes is the longest password the JWT provider parses.
	MaxTokenBytes = 8 << 10
	// MaxACLFilters bounds the filters of a token's acl claim, each list.
	MaxACLFilters = 64
)

// JWTOptions configures a JWT provider.
type JWTOptions struct {
	// Secret is the HS256 shared secret; empty disables HS256.
	Secret []byte
	// PublicKeys are the RSA (RS256) and ECDSA P-256 (ES256) keys that may
	// sign tokens; see LoadPublicKeys.
	PublicKeys []crypto.PublicKey
	// Algorithms are the accepted algorithms. Empty means every algorithm
	// a key was given for. "none" is never accepted.
	Algorithms []string
	// Issuer and Audience, when set, must match the iss and aud claims.
	Issuer, Audience string
	// Leeway tolerates clock skew on exp, nbf and iat.
	Leeway time.Duration
}

func (o JWTOptions) withDefaults() JWTOptions {
	if len(o.Algorithms) == 0 {
		if len(o.Secret) > 0 {
			o.Algorithms = append(o.Algorithms, AlgHS256)
		}
		if slices.ContainsFunc(o.PublicKeys, isRSA) {
			o.Algorithms = append(o.Algorithms, AlgRS256)
		}
		if slices.ContainsFunc(o.PublicKeys, isP256) {
			o.Algorithms = append(o.Algorithms, AlgES256)
		}
	}
	return o
}

func (o JWTOptions) validate() error {
	var errs []error
	if len(o.Algorithms) == 0 {
		errs = append(errs, errors.New("no secret or public key"))
	}
	for _, alg := range o.Algorithms {
		switch alg {
		case AlgHS256:
			if len(o.Secret) == 0 {
				errs = append(errs, errors.New("HS256 without a secret"))
			}
		case AlgRS256:
			if !slices.ContainsFunc(o.PublicKeys, isRSA) {
				errs = append(errs, errors.New("RS256 without an RSA public key"))
			}
		case AlgES256:
			if !slices.ContainsFunc(o.PublicKeys, isP256) {
				errs = append(errs, errors.New("ES256 without an ECDSA P-256 public key"))
			}
		default:
			errs = append(errs, fmt.Errorf("unsupported algorithm %q", alg))
		}
	}
	for i, k := range o.PublicKeys {
		if !isRSA(k) && !isP256(k) {
			errs = append(errs, fmt.Errorf("public key %d: %T is neither RSA nor ECDSA P-256", i, k))
		}
	}
	if o.Leeway < 0 {
		errs = append(errs, fmt.Errorf("negative leeway %v", o.Leeway))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: jwt: %w", ErrInvalidOptions, errors.Join(errs...))
	}
	return nil
}

func isRSA(k crypto.PublicKey) bool { _, ok := k.(*rsa.PublicKey); return ok }

func isP256(k crypto.PublicKey) bool {
	e, ok := k.(*ecdsa.PublicKey)
	return ok && e.Curve == elliptic.P256()
}

// JWT is a Provider of clients whose password is a JSON Web Token. The
// username is not checked, nor used: the Identity's Username is the
// token's sub, else its client ID. The token must carry exp, and a
// clientid claim (or, failing that, sub) equal to the client ID; an
// optional acl {pub: [...], sub: [...]} claim grants topic filters. JWT
// is safe for concurrent use.
type JWT struct {
	opts JWTOptions
	rsa  jwt.VerificationKeySet
	ec   jwt.VerificationKeySet
}

// NewJWT returns a JWT provider.
func NewJWT(opts JWTOptions) (*JWT, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	j := &JWT{opts: opts}
	j.opts.Secret = append([]byte(nil), opts.Secret...)
	j.opts.Algorithms = slices.Clone(opts.Algorithms)
	for _, k := range opts.PublicKeys {
		if isRSA(k) {
			j.rsa.Keys = append(j.rsa.Keys, k)
		} else {
			j.ec.Keys = append(j.ec.Keys, k)
		}
	}
	return j, nil
}

// Name returns "jwt".
func (j *JWT) Name() string { return ProviderJWT }

// ACLClaim is the acl claim of a token: extra topic filters the bearer may
// publish and subscribe to.
type ACLClaim struct {
	Pub []string `json:"pub,omitempty"`
	Sub []string `json:"sub,omitempty"`
}

// Claims are the claims a JWT provider reads.
type Claims struct {
	jwt.RegisteredClaims
	ClientID string    `json:"clientid,omitempty"`
	ACL      *ACLClaim `json:"acl,omitempty"`
}

// looksLikeJWT reports whether p has the compact JWS form: three
// base64url segments, the first two non-empty (an unsigned "alg: none"
// token has an empty third, and is recognised to be refused).
func looksLikeJWT(p []byte) bool {
	segs := 0
	segLen := 0
	for _, c := range p {
		switch {
		case c == '.':
			if segLen == 0 && segs < 2 {
				return false
			}
			segs++
			segLen = 0
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '=':
			segLen++
		default:
			return false
		}
	}
	return segs == 2
}

// Authenticate recognises a password that looks like a JWT and verifies
// its signature, algorithm, exp, iss, aud and client ID.
func (j *JWT) Authenticate(r *Request) (Identity, error) {
	if !looksLikeJWT(r.Password) {
		return Identity{}, ErrNotMine
	}
	if len(r.Password) > MaxTokenBytes {
		return Identity{}, fmt.Errorf("%w: token longer than %d bytes", ErrDenied, MaxTokenBytes)
	}
	now := r.now()
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(j.opts.Algorithms),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(func() time.Time { return now }),
		jwt.WithLeeway(j.opts.Leeway),
	}
	if j.opts.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(j.opts.Issuer))
	}
	if j.opts.Audience != "" {
		opts = append(opts, jwt.WithAudience(j.opts.Audience))
	}
	var c Claims
	if _, err := jwt.ParseWithClaims(string(r.Password), &c, j.key, opts...); err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrDenied, err)
	}
	cid := c.ClientID
	if cid == "" {
		cid = c.Subject
	}
	if cid == "" {
		return Identity{}, fmt.Errorf("%w: token has no clientid or sub claim", ErrDenied)
	}
	if cid != r.ClientID {
		return Identity{}, fmt.Errorf("%w: token issued for another client id", ErrDenied)
	}
	// The MQTT username is not checked, so it must not name the identity
	// (it would become %u in ACL rules and grants, and the owner of the
	// client's session): the token's sub does, else the client ID it binds.
	name := c.Subject
	if name == "" {
		name = cid
	}
	id := Identity{ClientID: r.ClientID, Username: name, Provider: ProviderJWT, Expires: c.ExpiresAt.Time}
	if c.ACL != nil {
		if err := checkFilters(c.ACL.Pub); err != nil {
			return Identity{}, fmt.Errorf("%w: acl.pub: %w", ErrDenied, err)
		}
		if err := checkFilters(c.ACL.Sub); err != nil {
			return Identity{}, fmt.Errorf("%w: acl.sub: %w", ErrDenied, err)
		}
		id.Publish, id.Subscribe = slices.Clone(c.ACL.Pub), slices.Clone(c.ACL.Sub)
	}
	return id, nil
}

// key is the jwt.Keyfunc: the keys of the token's algorithm family. The
// parser has already refused algorithms outside j.opts.Algorithms.
func (j *JWT) key(t *jwt.Token) (any, error) {
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		if len(j.opts.Secret) == 0 {
			return nil, errors.New("no HS256 secret")
		}
		return j.opts.Secret, nil
	case *jwt.SigningMethodRSA:
		return j.rsa, nil
	case *jwt.SigningMethodECDSA:
		return j.ec, nil
	}
	return nil, fmt.Errorf("unexpected algorithm %s", t.Method.Alg())
}

// checkFilters checks the topic filters of an acl claim are plausible;
// the ACL layer validates them fully.
func checkFilters(fs []string) error {
	if len(fs) > MaxACLFilters {
		return fmt.Errorf("more than %d filters", MaxACLFilters)
	}
	for _, f := range fs {
		if f == "" || !utf8.ValidString(f) || strings.ContainsRune(f, 0) {
			return fmt.Errorf("invalid filter %q", f)
		}
	}
	return nil
}

// ParsePublicKeys returns the public keys in PEM data: PKIX "PUBLIC KEY",
// PKCS #1 "RSA PUBLIC KEY" and "CERTIFICATE" blocks; other blocks are
// skipped. An error wraps ErrKeyFile.
func ParsePublicKeys(data []byte) ([]crypto.PublicKey, error) {
	var keys []crypto.PublicKey
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		var (
			k   crypto.PublicKey
			err error
		)
		switch b.Type {
		case "PUBLIC KEY":
			k, err = x509.ParsePKIXPublicKey(b.Bytes)
		case "RSA PUBLIC KEY":
			k, err = x509.ParsePKCS1PublicKey(b.Bytes)
		case "CERTIFICATE":
			var c *x509.Certificate
			if c, err = x509.ParseCertificate(b.Bytes); err == nil {
				k = c.PublicKey
			}
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s block %d: %w", ErrKeyFile, b.Type, len(keys), err)
		}
		if !isRSA(k) && !isP256(k) {
			return nil, fmt.Errorf("%w: key %d: %T is neither RSA nor ECDSA P-256", ErrKeyFile, len(keys), k)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no public key", ErrKeyFile)
	}
	return keys, nil
}

// LoadPublicKeys reads ParsePublicKeys from a file.
func LoadPublicKeys(path string) ([]crypto.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("public keys: %w", err)
	}
	keys, err := ParsePublicKeys(data)
	if err != nil {
		return nil, fmt.Errorf("public keys %s: %w", path, err)
	}
	return keys, nil
}
