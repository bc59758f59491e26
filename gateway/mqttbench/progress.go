package mqttbench

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progress rewrites one status line on a writer every interval, the way
// `ferrymq bench core` does, and ends it with the overall figures.
type progress struct {
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// startProgress prints line(elapsed, false) every interval, and
// line(elapsed, true) once when stopped; with a nil w it prints nothing.
// line is only ever called from one goroutine.
func startProgress(w io.Writer, interval time.Duration, line func(el time.Duration, final bool) string) *progress {
	p := &progress{done: make(chan struct{})}
	if w == nil {
		return p
	}
	begin := time.Now()
	p.wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Fprintf(w, "\r%s ", line(time.Since(begin), false))
			case <-p.done:
				fmt.Fprintf(w, "\r%s \n", line(time.Since(begin), true))
				return
			}
		}
	})
	return p
}

// stop prints the final line and returns once the printer has ended. It
// may be called more than once.
func (p *progress) stop() {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}
