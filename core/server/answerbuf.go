package server

import (
	"sync"
	"sync/atomic"
)

// answerBufCap is the capacity of the buffers pull answers are encoded
// into when they are large: a backlog's answers are up to
// store.cold_read_max_bytes of messages (256 KiB by default) each, one per
// read, and a replay that allocated each afresh made the collector run
// for every few answers (a third of the server's CPU in a profile of a
// 250 MB/s replay). Larger answers (a read of up to 4 MiB from the tail)
// are allocated as before.
const answerBufCap = 512 << 10

var answerBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, answerBufCap)
	return &b
}}

// answerBuf returns an empty buffer for an answer of up to n bytes: a
// pooled one when the answer is large enough to be worth it and fits.
// The writer gives it back (recycleAnswer) once the answer is written.
func answerBuf(n int) []byte {
	if n < bigPayload || n > answerBufCap {
		return make([]byte, 0, n)
	}
	return (*answerBufs.Get().(*[]byte))[:0]
}

// recycleAnswer takes back a buffer answerBuf gave (others are left to
// the collector). Nothing may use b afterwards.
func recycleAnswer(b []byte) {
	if cap(b) != answerBufCap {
		return
	}
	answersRecycled.Add(1)
	b = b[:0]
	answerBufs.Put(&b)
}

// answersRecycled counts the buffers taken back (tests).
var answersRecycled atomic.Int64
