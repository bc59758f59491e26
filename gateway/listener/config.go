package listener

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Defaults for a zero Config or WSConfig field.
const (
	// DefaultHandshakeTimeout is Config.HandshakeTimeout's default.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultPath is WSConfig.Path's default.
	DefaultPath = "/mqtt"
	// DefaultBufferSize is the default of WSConfig.ReadBufferSize and
	// WSConfig.WriteBufferSize. Small on purpose: the read buffer lives as
	// long as the connection, and MQTT packets are mostly small.
	DefaultBufferSize = 1024
	// DefaultMaxMessageSize is WSConfig.MaxMessageSize's default: a 1 MiB
	// MQTT payload plus room for its headers.
	DefaultMaxMessageSize = 1<<20 + 1<<10
)

// keepAlive is the TCP keep-alive period of every accepted connection. MQTT
// has its own keep-alive; this one only reaps peers that vanished without a
// FIN while the broker had nothing to send.
const keepAlive = 60 * time.Second

// Config configures a TCP listener, and the network side of a Websocket
// listener. A zero field means its default.
type Config struct {
	// ID names the listener to mochi; it must be unique within a server.
	ID string
	// Address is the host:port to bind; ":0" picks a free port, which
	// Address() reports after Init.
	Address string
	// TLS, when set, makes the listener speak TLS ("tls" or "wss").
	// LoadTLS builds one from PEM files.
	TLS *tls.Config
	// HandshakeTimeout bounds the TLS handshake, and for websockets the
	// HTTP upgrade request too; default 10 s.
	HandshakeTimeout time.Duration
	// Log receives one line per event; the zero Logger discards.
	Log zerolog.Logger
}

func (c Config) withDefaults() Config {
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return c
}

func (c Config) validate() []error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, fmt.Errorf("%w: empty ID", ErrInvalidConfig))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: negative HandshakeTimeout %v", ErrInvalidConfig, c.HandshakeTimeout))
	}
	return errs
}

// WSConfig configures a Websocket listener. A zero field means its default.
type WSConfig struct {
	Config
	// Path is the only URL path that upgrades to MQTT; others get 404.
	// Default "/mqtt".
	Path string
	// ReadBufferSize and WriteBufferSize size the websocket I/O buffers in
	// bytes; default 1024 each. The write buffer is pooled and held only
	// while a message is written, so an idle connection keeps only the read
	// buffer.
	ReadBufferSize, WriteBufferSize int
	// MaxMessageSize bounds one websocket message in bytes; a larger one
	// ends the connection. Default 1 MiB + 1 KiB.
	MaxMessageSize int64
}

func (c WSConfig) withDefaults() WSConfig {
	c.Config = c.Config.withDefaults()
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.ReadBufferSize == 0 {
		c.ReadBufferSize = DefaultBufferSize
	}
	if c.WriteBufferSize == 0 {
		c.WriteBufferSize = DefaultBufferSize
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	return c
}

func (c WSConfig) validate() error {
	errs := c.Config.validate()
	if !strings.HasPrefix(c.Path, "/") {
		errs = append(errs, fmt.Errorf("%w: Path %q does not start with /", ErrInvalidConfig, c.Path))
	}
	if c.ReadBufferSize < 0 || c.WriteBufferSize < 0 {
		errs = append(errs, fmt.Errorf("%w: negative buffer size", ErrInvalidConfig))
	}
	if c.MaxMessageSize < 0 {
		errs = append(errs, fmt.Errorf("%w: negative MaxMessageSize %d", ErrInvalidConfig, c.MaxMessageSize))
	}
	return errors.Join(errs...)
}

// Stats counts a listener's connections. All counts start at zero when the
// listener is made.
type Stats struct {
	// Accepted is the number of connections accepted.
	Accepted uint64
	// Active is the number of connections open now, including those still
	// in the TLS handshake or the HTTP upgrade.
	Active int
	// HandshakeFailures is the number of TLS handshakes that failed or
	// timed out.
	HandshakeFailures uint64
}
