// Package auth authenticates MQTT clients (devices) and decides what they
// may do. It is a library with no dependency on the MQTT server: the
// gateway turns a CONNECT packet and its TLS state into a Request and asks
// a Chain for an Identity.
//
// # Providers
//
// A Provider recognises one form of credentials:
//
//	provider   recognises                              checks
//	static     username listed in a credentials file   bcrypt password, optional client-ID binding
//	hmac       username "<product>:<device>:<ms>"      HMAC-SHA256 signature, clock skew, replay
//	jwt        password shaped like a compact JWS      signature, alg, exp, iss, aud, client ID
//	mtls       a verified TLS client certificate       CN or a SAN, optionally equal to the client ID
//
// A provider returns ErrNotMine when the credentials are not of its form
// and an error wrapping ErrDenied, with a reason, when it refuses them.
//
// # Chain
//
// A Chain tries its providers in order; the first that does not answer
// ErrNotMine decides, so the order matters only when two providers
// recognise the same request (put mtls first to let a certificate win
// over a password). Client IDs and usernames must pass ValidID: no '+',
// '#', '/', NUL or invalid UTF-8, so that substituting them into ACL
// filters through %c or %u cannot widen a client's rights
// (CVE-2017-7650). When no provider recognises the request, a client with
// neither username nor password is admitted only with AllowAnonymous;
// everyone else is refused. An Identity whose Expires has passed is
// refused.
//
// # HMAC credentials
//
// A device holding a product secret (or a device secret, which wins)
// connects with
//
//	client id  any ValidID string, e.g. the device's serial
//	username   <product>:<device>:<unix milliseconds>   e.g. "meter:m-17:1767225600000"
//	password   base64(HMAC-SHA256(secret, <client id> + <unix milliseconds>))
//
// with the milliseconds in canonical decimal (no sign, no leading zero) in
// both places. Product and device names are ValidID strings without ':'.
// The signature binds the password to the client ID and time: a timestamp
// more than HMACOptions.Skew (default 5 min) from the server's clock is
// refused, and so is a (client ID, timestamp) pair already accepted within
// that window. The replay memory is per process and bounded: after a
// restart, or once more than ReplayEntries signatures are live, a replay
// inside the window may pass. Under a product secret any holder of the
// secret can sign as any device of the product; use device secrets to
// tell devices apart. SignHMAC and HMACUsername, and `ferrymq auth sign`,
// produce credentials.
//
// # JWT claims
//
// The password is the token; the MQTT username is neither checked nor
// used. The identity's username (%u in ACL rules and grants, and the owner
// of the client's session) is the token's sub, or its client ID when sub
// is absent. Accepted algorithms are HS256 (shared secret), RS256 and
// ES256 (public keys from a PEM file); "none" and any algorithm not
// configured are refused before a key is chosen, which prevents
// key-confusion attacks (an HS256 token "signed" with an RSA public key).
// Claims:
//
//	exp       required; becomes Identity.Expires
//	clientid  must equal the client ID (sub is used when clientid is absent)
//	acl       optional {"pub": [filters], "sub": [filters]}: extra filters
//	          granted to this client, which may use %c and %u
//	iss, aud  checked when JWTOptions.Issuer / Audience are set
//
// # Caching
//
// bcrypt costs tens of milliseconds on purpose. The static provider caches
// successful verifications, keyed by username and an HMAC-SHA-256 of the
// password under a random per-process key, and remembers the bcrypt hash
// each entry was verified against: an entry counts only while the user
// still has that hash, the cache is dropped whenever the file is reloaded,
// and it is bounded (CacheEntries). Failures are never cached, so a wrong
// password always costs a full bcrypt; rate-limit connection attempts.
// The cache lives only in memory.
//
// # The gateway hook
//
// Hook (hook.go) is all of the above as the MQTT engine's Authenticator,
// Authorizer and Limiter (engine.go). It keeps state only for live
// connections: an authenticated client's username is its Identity's
// Username, which the engine keeps with the session while it is offline,
// so a client ID whose session exists may be taken only by that identity,
// with or without a clean start. Publishes to $SYS and into the internal $ferrymq/
// namespace are refused like an ACL refusal (MQTT 5: PUBACK/PUBREC 0x87).
//
// # Secrets
//
// Passwords, secrets, tokens and hashes are never logged or put in an
// error; errors name the user, device or the failed check.
//
// # Concurrency
//
// Every provider and the Chain are safe for concurrent use. StaticFile
// owns one goroutine, started by NewStaticFile and stopped by Close.
// Nothing is written to disk, so a crash loses only the caches.
package auth
