package eventloop

import "errors"

var (
	// ErrUnsupported is returned by New on a platform without epoll.
	ErrUnsupported = errors.New("eventloop: needs Linux epoll")
	// ErrClosed is returned by a Socket's methods after Close, and by Add
	// and Accept after the loop's Close.
	ErrClosed = errors.New("eventloop: closed")
	// ErrTooManyFDs is returned by Add for a descriptor at or above the
	// process's open-file limit at New (the table of sockets is that big).
	ErrTooManyFDs = errors.New("eventloop: descriptor above the open-file limit")
)
