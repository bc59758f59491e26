package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set with -ldflags "-X main.version=…" in release builds.
var version = "dev"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version",
		Example: "  ferrymq version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "ferrymq", buildVersion())
			return err
		},
	}
}

// buildVersion is the release version, or dev plus the VCS revision.
func buildVersion() string {
	v := version
	if info, ok := debug.ReadBuildInfo(); ok && v == "dev" {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v = "dev-" + s.Value[:12]
			}
		}
	}
	return v
}
