//go:build !unix

package engine

import "github.com/lesismal/nbio"

// awaitPollers: the race it guards against is nbio's epoll poller's.
func (e *Engine) awaitPollers() error { return nil }

func (e *Engine) probed(*nbio.Conn) bool { return false }
