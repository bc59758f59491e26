package engine

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	ltls "github.com/lesismal/llib/std/crypto/tls"

	"github.com/ferrymq/ferrymq/gateway/eventloop"
)

// TLS on the event loop is lesismal/llib's fork of crypto/tls, whose
// connections decrypt what they are given (AppendAndRead) instead of
// reading a blocking socket: the handshake and every record are processed
// in the connection's turn, and an idle TLS connection holds no goroutine.
// The listener's crypto/tls.Config is translated once (llibConfig); the
// connection state handed to authentication is translated back.
//
// Memory: llib keeps part of the handshake state after the handshake. The
// hybrid post-quantum key exchange (X25519MLKEM768) that a Go 1.26 client
// offers first keeps most of it, so the default curve preference is
// X25519, then P-256 (measured: 13 KB per idle TLS connection with the
// default preference, 10.4 KB with this one; docs/gateway.md). Its buffers
// come from llib's NativeAllocator (exact sizes, left to the collector):
// nbio's pool handed out buffers of at least 1 KiB, often grown far past
// what a small record needs, and an idle connection kept its last one.

// tlsTransport is TLS over a socket.
type tlsTransport struct {
	tcp *tcpTransport
	tc  *ltls.Conn
}

func newTLSTransport(t *tcpTransport, cfg *ltls.Config) *tlsTransport {
	return &tlsTransport{tcp: t, tc: ltls.NewConn(noDeadlines{t.sock}, cfg, false, true, &ltls.NativeAllocator{})}
}

// noDeadlines is the socket as llib sees it: a net.Conn without
// deadlines. llib, as crypto/tls, sets a write deadline of now after its
// close_notify ("any later write fails"); the engine's own timers (the
// wheel) bound writes and the lingering close (conn.linger).
type noDeadlines struct{ *eventloop.Socket }

func (noDeadlines) SetDeadline(time.Time) error      { return nil }
func (noDeadlines) SetReadDeadline(time.Time) error  { return nil }
func (noDeadlines) SetWriteDeadline(time.Time) error { return nil }

// decode decrypts raw (ciphertext, ours to overwrite: the plaintext is
// written into its buffer, never longer than what was read).
func (t *tlsTransport) decode(raw []byte) ([]byte, error) {
	buf := raw[:cap(raw)]
	off := 0
	in := raw
	for {
		_, n, err := t.tc.AppendAndRead(in, buf[off:])
		in = nil
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		if n == 0 {
			break
		}
		off += n
		if off == len(buf) {
			// More plaintext than room (cannot happen: records only shrink),
			// kept safe anyway.
			nb := make([]byte, 2*len(buf))
			copy(nb, buf)
			buf = nb
		}
	}
	t.tc.ResetOrFreeBuffer()
	return buf[:off], nil
}

func (t *tlsTransport) write(b []byte) error {
	_, err := t.tc.Write(b)
	return err
}

func (t *tlsTransport) closeWrite() {
	_ = t.tc.CloseWrite() // close_notify
	t.tcp.closeWrite()
}

func (t *tlsTransport) close() { _ = t.tc.Close() }

// tlsState translates the connection state (asked once, at CONNECT: not
// kept, an idle connection must not carry it).
func (t *tlsTransport) tlsState() *tls.ConnectionState {
	st := t.tc.ConnectionState()
	if !st.HandshakeComplete {
		return nil
	}
	return &tls.ConnectionState{
		Version: st.Version, HandshakeComplete: true, DidResume: st.DidResume, CipherSuite: st.CipherSuite,
		NegotiatedProtocol: st.NegotiatedProtocol, ServerName: st.ServerName,
		PeerCertificates: st.PeerCertificates, VerifiedChains: st.VerifiedChains,
	}
}

// errTLSConfig is returned by New for a TLS configuration the event loop's
// TLS cannot serve.
var errTLSConfig = errors.New("engine: unsupported TLS configuration")

// llibConfig translates a server crypto/tls.Config. Static certificates,
// client authentication (mTLS), versions, cipher suites, curves and ALPN
// carry over; callbacks (GetCertificate, GetConfigForClient,
// VerifyConnection) have no translation and are refused.
func llibConfig(c *tls.Config) (*ltls.Config, error) {
	if c.GetCertificate != nil || c.GetConfigForClient != nil || c.VerifyConnection != nil || c.VerifyPeerCertificate != nil {
		return nil, fmt.Errorf("%w: certificate or verification callbacks", errTLSConfig)
	}
	if len(c.Certificates) == 0 {
		return nil, fmt.Errorf("%w: no certificate", errTLSConfig)
	}
	out := &ltls.Config{
		ClientAuth: ltls.ClientAuthType(c.ClientAuth), ClientCAs: c.ClientCAs,
		MinVersion: c.MinVersion, MaxVersion: c.MaxVersion, CipherSuites: c.CipherSuites,
		NextProtos: c.NextProtos, SessionTicketsDisabled: c.SessionTicketsDisabled,
	}
	if out.MinVersion == 0 {
		out.MinVersion = ltls.VersionTLS12
	}
	for _, cert := range c.Certificates {
		out.Certificates = append(out.Certificates, ltls.Certificate{Certificate: cert.Certificate, PrivateKey: cert.PrivateKey,
			OCSPStaple: cert.OCSPStaple, SignedCertificateTimestamps: cert.SignedCertificateTimestamps, Leaf: cert.Leaf})
	}
	if len(c.CurvePreferences) > 0 {
		for _, id := range c.CurvePreferences {
			out.CurvePreferences = append(out.CurvePreferences, ltls.CurveID(id))
		}
	} else {
		out.CurvePreferences = []ltls.CurveID{ltls.X25519, ltls.CurveP256}
	}
	return out, nil
}
