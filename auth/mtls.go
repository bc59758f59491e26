package auth

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
)

// ProviderMTLS is the Name of an MTLS provider.
const ProviderMTLS = "mtls"

// CertField names the part of a client certificate that identifies it.
type CertField string

// Certificate fields an MTLS provider can read.
const (
	FieldCommonName CertField = "cn"    // the subject's common name (default)
	FieldDNS        CertField = "dns"   // a DNS subject alternative name
	FieldURI        CertField = "uri"   // a URI subject alternative name
	FieldEmail      CertField = "email" // an email subject alternative name
)

// MTLSOptions configures an MTLS provider.
type MTLSOptions struct {
	// Field is where the identity is read; empty means FieldCommonName.
	// For a SAN type the first name of that type is the identity.
	Field CertField
	// RequireClientID refuses a client whose client ID is not the
	// certificate's identity (for a SAN type: not one of its names of
	// that type).
	RequireClientID bool
}

func (o MTLSOptions) withDefaults() MTLSOptions {
	if o.Field == "" {
		o.Field = FieldCommonName
	}
	return o
}

func (o MTLSOptions) validate() error {
	switch o.Field {
	case FieldCommonName, FieldDNS, FieldURI, FieldEmail:
		return nil
	}
	return fmt.Errorf("%w: mtls: unknown certificate field %q", ErrInvalidOptions, o.Field)
}

// MTLS is a Provider of clients identified by a TLS client certificate
// that the TLS layer verified against the configured CAs. It never
// verifies certificates itself: an unverified certificate is not its
// business. MTLS is safe for concurrent use.
type MTLS struct {
	opts MTLSOptions
}

// NewMTLS returns an MTLS provider.
func NewMTLS(opts MTLSOptions) (*MTLS, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &MTLS{opts: opts}, nil
}

// Name returns "mtls".
func (m *MTLS) Name() string { return ProviderMTLS }

// names returns the leaf's names of the configured field.
func (m *MTLS) names(c *x509.Certificate) []string {
	switch m.opts.Field {
	case FieldDNS:
		return c.DNSNames
	case FieldURI:
		out := make([]string, len(c.URIs))
		for i, u := range c.URIs {
			out[i] = u.String()
		}
		return out
	case FieldEmail:
		return c.EmailAddresses
	}
	if c.Subject.CommonName == "" {
		return nil
	}
	return []string{c.Subject.CommonName}
}

// Authenticate recognises a request with a verified client certificate
// chain. The Identity's Username is the certificate's identity and its
// Expires the certificate's NotAfter.
func (m *MTLS) Authenticate(r *Request) (Identity, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return Identity{}, fmt.Errorf("%w: no verified client certificate", ErrNotMine)
	}
	leaf := r.TLS.VerifiedChains[0][0]
	names := m.names(leaf)
	if len(names) == 0 {
		return Identity{}, fmt.Errorf("%w: certificate has no %s name", ErrDenied, m.opts.Field)
	}
	name := names[0]
	if m.opts.RequireClientID {
		if !slices.Contains(names, r.ClientID) {
			return Identity{}, fmt.Errorf("%w: client id is not the certificate's %s", ErrDenied, m.opts.Field)
		}
		name = r.ClientID
	}
	if !validCertName(m.opts.Field, name) {
		return Identity{}, fmt.Errorf("%w: certificate %s holds a forbidden character", ErrDenied, m.opts.Field)
	}
	return Identity{ClientID: r.ClientID, Username: name, Provider: ProviderMTLS, Expires: leaf.NotAfter}, nil
}

// validCertName reports whether a certificate name may become an
// identity: ValidID, except that a URI keeps its '/' (a CA issued it, and
// a URI without one is rare). The ACL layer decides whether such a name
// can be substituted for %u.
func validCertName(f CertField, name string) bool {
	if f == FieldURI {
		return ValidID(strings.ReplaceAll(name, "/", ""))
	}
	return ValidID(name)
}
