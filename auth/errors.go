package auth

import "errors"

// Errors returned while authenticating a connection.
var (
	// ErrNotMine is returned by a Provider when it does not recognise the
	// form of the credentials (say, a password that is not a JWT), so that a
	// Chain goes on to the next provider. It is never returned by a Chain.
	ErrNotMine = errors.New("auth: credentials not recognised")

	// ErrDenied is returned when a provider recognises the credentials and
	// refuses them, and by a Chain when no provider recognises them and
	// anonymous access is off. It is wrapped with a reason that never
	// contains a password, secret or token.
	ErrDenied = errors.New("auth: access denied")
)

// Errors returned while building a provider.
var (
	// ErrInvalidOptions is returned by the New… constructors when their
	// options are incomplete or inconsistent; every problem is joined.
	ErrInvalidOptions = errors.New("auth: invalid options")

	// ErrCredentialsFile is returned when a credentials table cannot be
	// decoded or fails validation (unknown keys, a duplicate user, a value
	// that is not a bcrypt hash…). The message names the entry, never its
	// hash.
	ErrCredentialsFile = errors.New("auth: invalid credentials file")

	// ErrKeyFile is returned when a PEM key file holds no usable key.
	ErrKeyFile = errors.New("auth: invalid key file")
)
