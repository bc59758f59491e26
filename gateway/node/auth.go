package node

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/auth"
)

// newAuth builds the auth hook from c; closers are the providers to close
// once the node has stopped. (The engine keeps a session's owner: a
// different identity may not take it over.)
func newAuth(c *AuthOptions, log *zerolog.Logger) (hook *auth.Hook, closers []func() error, err error) {
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
		p, err := auth.NewMTLS(*c.MTLS)
		if err != nil {
			return nil, closers, fmt.Errorf("auth mtls: %w", err)
		}
		chain.Providers = append(chain.Providers, p)
	}
	if c.JWT != nil {
		o := c.JWT.Options
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
		p, err := auth.NewHMAC(*c.HMAC)
		if err != nil {
			return nil, closers, fmt.Errorf("auth hmac: %w", err)
		}
		chain.Providers = append(chain.Providers, p)
	}
	if c.Static != nil {
		p, err := auth.NewStaticFile(c.Static.File, cmp.Or(c.Static.Reload, DefaultStaticReload), *log)
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
