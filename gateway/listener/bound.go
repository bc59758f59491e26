package listener

import (
	"fmt"
	"net"
	"sync"
)

// bound is what the TCP and websocket listeners share: an ID and the
// configured address, the connections they track, and the net.Listener once
// Init has bound the address.
type bound struct {
	id, address string
	conns       *connSet

	mu sync.Mutex // guards ln (and fields the embedding listener says so of)
	ln net.Listener
}

func newBound(id, address string) bound {
	return bound{id: id, address: address, conns: newConnSet()}
}

// ID returns the listener's ID.
func (b *bound) ID() string { return b.id }

// Address returns the bound address once Init has succeeded, else the
// configured one.
func (b *bound) Address() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ln != nil {
		return b.ln.Addr().String()
	}
	return b.address
}

// Stats returns the listener's connection counts.
func (b *bound) Stats() Stats { return b.conns.stats() }

// bindLocked binds the address (once; not after Close) and returns the
// listener. b.mu must be held.
func (b *bound) bindLocked() (net.Listener, error) {
	if b.conns.isClosed() {
		return nil, ErrClosed
	}
	if b.ln != nil {
		return nil, ErrAlreadyOpen
	}
	ln, err := listen(b.address)
	if err != nil {
		return nil, fmt.Errorf("listener %s: %w", b.id, err)
	}
	b.ln = ln
	return ln, nil
}
