package engine

import (
	"fmt"
	"sync"

	"github.com/lesismal/nbio/logging"
	"github.com/rs/zerolog"
)

// nbio logs through one package-level logger. The first engine's logger
// gets its warnings and errors (its start/stop chatter is dropped); a
// process runs one engine, tests run several in turn.
var nbioLogOnce sync.Once

func quietNBIO(l zerolog.Logger) {
	nbioLogOnce.Do(func() { logging.SetLogger(nbioLogger{l.With().Str("component", "nbio").Logger()}) })
}

type nbioLogger struct{ l zerolog.Logger }

func (n nbioLogger) SetLevel(int)            {}
func (n nbioLogger) Debug(string, ...any)    {}
func (n nbioLogger) Info(string, ...any)     {}
func (n nbioLogger) Warn(f string, v ...any) { n.l.Warn().Msg(fmt.Sprintf(f, v...)) }
func (n nbioLogger) Error(f string, v ...any) {
	n.l.Error().Msg(fmt.Sprintf(f, v...))
}
