package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/auth"
)

// newAuth builds the auth hook from the config's auth section; nil (and
// no hook) when there is none. closers are the providers to close at exit.
// The engine keeps a session's owner: a different identity may not take
// it over.
func newAuth(c *authConfig, log *zerolog.Logger) (hook *auth.Hook, closers []func() error, err error) {
	if c == nil {
		return nil, nil, nil
	}
	defer func() {
		if err != nil {
			for _, f := range closers {
				_ = f()
			}
			closers = nil
		}
	}()
	chain := &auth.Chain{AllowAnonymous: c.Anonymous}
	if c.MTLS != nil {
		p, err := auth.NewMTLS(auth.MTLSOptions{Field: auth.CertField(c.MTLS.Field), RequireClientID: c.MTLS.RequireClientID})
		if err != nil {
			return nil, closers, fmt.Errorf("auth mtls: %w", err)
		}
		chain.Providers = append(chain.Providers, p)
	}
	if c.JWT != nil {
		o := auth.JWTOptions{Secret: []byte(c.JWT.Secret), Algorithms: c.JWT.Algorithms, Issuer: c.JWT.Issuer, Audience: c.JWT.Audience}
		if c.JWT.PublicKeys != "" {
			if o.PublicKeys, err = auth.LoadPublicKeys(c.JWT.PublicKeys); err != nil {
				return nil, closers, fmt.Errorf("auth jwt: %w", err)
			}
		}
		p, err := auth.NewJWT(o)
		if err != nil {
			return nil, closers, fmt.Errorf("auth jwt: %w", err)
		}
		chain.Providers = append(chain.Providers, p)
	}
	if c.HMAC != nil {
		o := auth.HMACOptions{ProductSecrets: map[string][]byte{}, DeviceSecrets: map[string][]byte{}, Skew: time.Duration(c.HMAC.Skew)}
		for k, v := range c.HMAC.Products {
			o.ProductSecrets[k] = []byte(v)
		}
		for k, v := range c.HMAC.Devices {
			o.DeviceSecrets[k] = []byte(v)
		}
		p, err := auth.NewHMAC(o)
		if err != nil {
			return nil, closers, fmt.Errorf("auth hmac: %w", err)
		}
		chain.Providers = append(chain.Providers, p)
	}
	if c.Static != nil {
		reload := time.Duration(c.Static.Reload)
		if reload == 0 {
			reload = 10 * time.Second
		}
		p, err := auth.NewStaticFile(c.Static.File, reload, *log)
		if err != nil {
			return nil, closers, fmt.Errorf("auth static: %w", err)
		}
		closers = append(closers, p.Close)
		chain.Providers = append(chain.Providers, p)
	}
	if len(chain.Providers) == 0 && !chain.AllowAnonymous {
		return nil, closers, errors.New("auth: no provider configured and anonymous access off: nobody could connect")
	}
	acl, err := auth.NewACL(c.ACL)
	if err != nil {
		return nil, closers, err
	}
	var quotas *auth.Quotas
	if c.Quotas != nil {
		quotas = auth.NewQuotas(*c.Quotas, time.Now)
	}
	return auth.NewHook(auth.HookOptions{Chain: chain, ACL: acl, Quotas: quotas, Logger: log}), closers, nil
}
