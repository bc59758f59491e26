package engine

import (
	"crypto/tls"
	"time"
)

// Client is a connection as the hooks see it: who it is and where it came
// from. Its fields are set before the first hook sees it and never change.
type Client struct {
	id        string
	username  string
	listener  string
	remote    string
	protocol  byte
	clean     bool
	keepalive uint16
	since     int64 // unix nanoseconds of the CONNECT
	authState any
	tls       *tls.ConnectionState // kept only until the CONNACK
	cn        *conn
}

// ID returns the client ID (the one the engine assigned, if it did).
func (c *Client) ID() string { return c.id }

// Username returns the identity's username (Identity.Username).
func (c *Client) Username() string { return c.username }

// Listener names the listener the client came through.
func (c *Client) Listener() string { return c.listener }

// Remote is the client's address (PROXY protocol source if any).
func (c *Client) Remote() string { return c.remote }

// Protocol is 3 (MQTT 3.1), 4 (3.1.1) or 5.
func (c *Client) Protocol() byte { return c.protocol }

// Clean reports the CONNECT's clean session / clean start flag.
func (c *Client) Clean() bool { return c.clean }

// Keepalive is the keepalive in force, in seconds (0: none).
func (c *Client) Keepalive() uint16 { return c.keepalive }

// ConnectedAt is when the client's CONNECT arrived.
func (c *Client) ConnectedAt() time.Time { return time.Unix(0, c.since) }

// AuthState is Identity.State as the authenticator returned it.
func (c *Client) AuthState() any { return c.authState }

// TLS is the connection's TLS state during authentication; nil later and
// on plain connections.
func (c *Client) TLS() *tls.ConnectionState { return c.tls }

// NewClient builds the Client a connection authenticated as id would show
// the hooks, for tests of hooks without a network (a real connection's
// Client is made by the engine at CONNECT).
func NewClient(ci *ConnectInfo, id Identity) *Client {
	return &Client{id: ci.ClientID, username: id.Username, listener: ci.Listener, remote: ci.Remote,
		protocol: ci.Protocol, clean: ci.Clean, keepalive: ci.Keepalive, authState: id.State, tls: ci.TLS}
}
