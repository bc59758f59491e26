package auth

import (
	"crypto/tls"
	"strings"
	"time"
	"unicode/utf8"
)

// Request is what a connecting client presents: the fields of its MQTT
// CONNECT packet and of its TLS connection.
type Request struct {
	ClientID string
	Username string
	Password []byte
	// TLS is the state of the client's TLS connection, nil for plain TCP.
	TLS *tls.ConnectionState
	// Remote is the client's address, for logs only.
	Remote string
	// Now is the time of the attempt; zero means time.Now(). Tests set it.
	Now time.Time
}

// now returns r.Now, or the wall clock when it is zero.
func (r *Request) now() time.Time {
	if r.Now.IsZero() {
		return time.Now()
	}
	return r.Now
}

// Identity is an authenticated client.
type Identity struct {
	ClientID string
	// Username is the name the ACL layer substitutes for %u: the MQTT
	// username, or the name a provider derives from the credential (the
	// HMAC provider's "<product>:<device>", the mTLS provider's
	// certificate name).
	Username string
	// Provider is the Name of the provider that authenticated the client.
	Provider string
	// Expires is when the credential stops being valid (a JWT's exp, a
	// certificate's NotAfter); zero means never.
	Expires time.Time
	// Publish and Subscribe are extra ACL topic filters granted by the
	// credential itself (a JWT's acl claim). They may use %c (client ID)
	// and %u (username).
	Publish, Subscribe []string
}

// Provider authenticates the credentials of one form.
//
// Authenticate returns ErrNotMine (bare or wrapped) when it does not
// recognise the form of the credentials, and an error wrapping ErrDenied,
// with a reason that holds no secret, when it recognises them and refuses.
// Any other error also refuses the client. Implementations are safe for
// concurrent use.
type Provider interface {
	Name() string
	Authenticate(r *Request) (Identity, error)
}

// ValidID reports whether s may be used as a client ID or username: valid
// UTF-8 without the MQTT wildcards '+' and '#', the topic separator '/' or
// NUL. Such characters would let a client substituted into an ACL filter
// through %c or %u widen its own rights (CVE-2017-7650). The empty string
// is valid; callers needing a non-empty ID check that themselves.
func ValidID(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsAny(s, "+#/\x00")
}
