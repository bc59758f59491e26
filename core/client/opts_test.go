package client_test

import (
	"time"

	"github.com/ferrymq/ferrymq/core/server"
)

// serverOpts compresses the server's timeouts so bad-client tests end fast.
func serverOpts() server.Options {
	return server.Options{HandshakeTimeout: 300 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, MaxInflight: 64}
}
