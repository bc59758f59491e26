package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

type benchTableOptions struct {
	markdown bool
}

func (o *benchTableOptions) AddFlags(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&o.markdown, "markdown", false, "print a Markdown table")
}

// newBenchTableCmd joins result rows printed by `bench core --json` (one
// JSON object a line, from files or stdin) into one table.
func newBenchTableCmd() *cobra.Command {
	o := &benchTableOptions{}
	cmd := &cobra.Command{
		Use:     "table [FILE...]",
		Short:   "Print rows from `bench core --json` (files, or stdin) as one table",
		Example: `  ferrymq bench table results.jsonl --markdown`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var rows []benchResult
			read := func(name string, r io.Reader) error {
				sc := bufio.NewScanner(r)
				for n := 1; sc.Scan(); n++ {
					line := strings.TrimSpace(sc.Text())
					if line == "" {
						continue
					}
					var row benchResult
					if err := json.Unmarshal([]byte(line), &row); err != nil {
						return fmt.Errorf("%s:%d: %w", name, n, err)
					}
					rows = append(rows, row)
				}
				return sc.Err()
			}
			if len(args) == 0 {
				if err := read("stdin", cmd.InOrStdin()); err != nil {
					return err
				}
			}
			for _, name := range args {
				f, err := os.Open(name)
				if err != nil {
					return err
				}
				err = read(name, f)
				_ = f.Close()
				if err != nil {
					return err
				}
			}
			return writeBenchTable(cmd.OutOrStdout(), rows, o.markdown)
		},
	}
	o.AddFlags(cmd)
	return cmd
}
