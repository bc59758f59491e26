package auth

import (
	"errors"
	"fmt"
)

// ProviderAnonymous is the Identity.Provider of a client let in by a
// Chain's AllowAnonymous.
const ProviderAnonymous = "anonymous"

// Chain tries its providers in order; the first that does not return
// ErrNotMine decides. A Chain is itself a Provider named "chain" and is
// safe for concurrent use once built; do not change its fields afterwards.
type Chain struct {
	Providers []Provider
	// AllowAnonymous admits a client that presents neither username nor
	// password when no provider recognises it. A client that presents
	// credentials nobody recognises is always refused.
	AllowAnonymous bool
}

// Name returns "chain".
func (c *Chain) Name() string { return "chain" }

// Authenticate authenticates r with the first provider that recognises
// its credentials. It never returns ErrNotMine: a refusal wraps ErrDenied
// (or is a provider's own error). The client ID and username must pass
// ValidID. In the returned Identity, an empty ClientID, Username or
// Provider is filled in from the request and the deciding provider.
func (c *Chain) Authenticate(r *Request) (Identity, error) {
	if !ValidID(r.ClientID) {
		return Identity{}, fmt.Errorf("%w: client id holds a forbidden character", ErrDenied)
	}
	if !ValidID(r.Username) {
		return Identity{}, fmt.Errorf("%w: username holds a forbidden character", ErrDenied)
	}
	req := *r
	req.Now = r.now()
	for _, p := range c.Providers {
		id, err := p.Authenticate(&req)
		if errors.Is(err, ErrNotMine) {
			continue
		}
		if err != nil {
			return Identity{}, fmt.Errorf("%s: %w", p.Name(), err)
		}
		if id.ClientID == "" {
			id.ClientID = req.ClientID
		}
		if id.Username == "" {
			id.Username = req.Username
		}
		if id.Provider == "" {
			id.Provider = p.Name()
		}
		if !id.Expires.IsZero() && !req.Now.Before(id.Expires) {
			return Identity{}, fmt.Errorf("%s: %w: credential expired", p.Name(), ErrDenied)
		}
		return id, nil
	}
	if c.AllowAnonymous && req.Username == "" && len(req.Password) == 0 {
		return Identity{ClientID: req.ClientID, Provider: ProviderAnonymous}, nil
	}
	return Identity{}, fmt.Errorf("%w: no provider recognised the credentials", ErrDenied)
}
