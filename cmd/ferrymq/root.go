package main

import (
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "ferrymq",
		Short:         "MQTT/IoT edge gateway bridged to a durable commit-log queue",
		SilenceUsage:  true,
		SilenceErrors: false,
		// Runnable with no arguments: an unknown command is then one error
		// line ("Error: unknown command …"), not cobra's two.
		Args: cobra.NoArgs,
		RunE: helpRunE,
	}
	root.AddCommand(newServeCmd(), newVersionCmd(),
		newProduceCmd(), newConsumeCmd(), newTopicCmd(), newGroupCmd(), newMsgCmd(), newTraceCmd(), newBenchCmd(),
		newAuthCmd(), newAlarmCmd(), newNodesCmd(), newRPCCmd(), newDeviceCmd(), newShadowCmd())
	return root
}

// newLogger returns the process logger: JSON lines on w, or a console
// format for people when pretty is set.
func newLogger(w io.Writer, pretty bool, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Logger{}, err
	}
	if pretty {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

var stderr io.Writer = os.Stderr

var getenv = os.Getenv
