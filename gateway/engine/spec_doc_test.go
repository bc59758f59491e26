package engine_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	tagRE   = regexp.MustCompile(`\[MQTT-[0-9.]+-[0-9]+\]`)
	labelRE = regexp.MustCompile(`\[MQTT-[0-9.]+-[0-9]+\]|§[0-9.]*[0-9]`)
	whereRE = regexp.MustCompile(`([a-z_]+\.go):([A-Za-z_][A-Za-z0-9_]*)`)
	testRE  = regexp.MustCompile(`\b(?:Test|Fuzz)[A-Za-z0-9_]+`)
)

// ruleRow is one row of a table of docs/conformance.md "Rules the engine
// enforces".
type ruleRow struct {
	spec, rule, where, test string
}

// conformanceTables reads the 3.1.1 and 5 tables of the section.
func conformanceTables(t *testing.T) []ruleRow {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "conformance.md"))
	require.NoError(t, err)
	doc := string(b)
	start := strings.Index(doc, "\n## Rules the engine enforces\n")
	require.GreaterOrEqual(t, start, 0, "docs/conformance.md has no section \"Rules the engine enforces\"")
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var rows []ruleRow
	spec := ""
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "### MQTT 3.1.1 rules"):
			spec = "3.1.1"
		case strings.HasPrefix(line, "### MQTT 5 rules"):
			spec = "5"
		case strings.HasPrefix(line, "### "):
			spec = ""
		case spec != "" && strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| rule "):
			cells := strings.Split(strings.Trim(line, "| "), " | ")
			require.Len(t, cells, 5, "a row of five cells: %q", line)
			rows = append(rows, ruleRow{spec: spec, rule: cells[0], where: cells[3], test: cells[4]})
		}
	}
	return rows
}

// TestConformanceTableIsHonest keeps docs/conformance.md's rule tables
// true to the code: every tag is in the engine's code, every
// file.go:function exists there, every test named exists in the
// repository, every rule credited to TestSpecRules is one of its rows for
// that spec, and every row of TestSpecRules is in its spec's table.
func TestConformanceTableIsHonest(t *testing.T) {
	rows := conformanceTables(t)
	require.NotEmpty(t, rows)

	// The engine's code (tests aside) and every test function of the
	// repository.
	code := map[string]string{}
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	var engineCode strings.Builder
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			b, err := os.ReadFile(n)
			require.NoError(t, err)
			code[n] = string(b)
			engineCode.Write(b)
		}
	}
	tests := map[string]bool{}
	funcRE := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]+)\(`)
	root := filepath.Join("..", "..")
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range funcRE.FindAllStringSubmatch(string(b), -1) {
				tests[m[1]] = true
			}
		}
		return nil
	}))

	// What TestSpecRules covers, per spec.
	covered := map[string]map[string]bool{"3.1.1": {}, "5": {}}
	for _, r := range specRules() {
		spec, _, _ := strings.Cut(r.what, " ")
		require.Contains(t, covered, spec, "row %q: its name starts with 3.1.1 or 5", r.what)
		labels := labelRE.FindAllString(r.rule, -1)
		require.NotEmpty(t, labels, "row %q names its rule", r.what)
		for _, l := range labels {
			covered[spec][l] = true
		}
	}

	listed := map[string]map[string]bool{"3.1.1": {}, "5": {}}
	for _, row := range rows {
		labels := labelRE.FindAllString(row.rule, -1)
		require.NotEmpty(t, labels, "%s row %q: a tag or a section", row.spec, row.rule)
		for _, tag := range tagRE.FindAllString(row.rule, -1) {
			require.Contains(t, engineCode.String(), tag, "%s: %s is in the table but not in gateway/engine's code", row.spec, tag)
		}
		wheres := whereRE.FindAllStringSubmatch(row.where, -1)
		require.NotEmpty(t, wheres, "%s %s: where (file.go:function)", row.spec, row.rule)
		for _, w := range wheres {
			src, ok := code[w[1]]
			require.True(t, ok, "%s %s: gateway/engine/%s does not exist", row.spec, row.rule, w[1])
			require.Regexp(t, `(?m)^func (\([^)]*\) )?`+w[2]+`\(`, src, "%s %s: no func %s in %s", row.spec, row.rule, w[2], w[1])
		}
		names := testRE.FindAllString(row.test, -1)
		require.NotEmpty(t, names, "%s %s: a test", row.spec, row.rule)
		for _, n := range names {
			require.True(t, tests[n], "%s %s: no func %s in the repository's tests", row.spec, row.rule, n)
			if n == "TestSpecRules" {
				for _, l := range labels {
					require.True(t, covered[row.spec][l], "%s %s: credited to TestSpecRules, which has no %s row for it", row.spec, row.rule, row.spec)
				}
			}
		}
		for _, l := range labels {
			listed[row.spec][l] = true
		}
	}
	// The counts the section states.
	doc, err := os.ReadFile(filepath.Join(root, "docs", "conformance.md"))
	require.NoError(t, err)
	m := regexp.MustCompile(`Counts: (\d+) rules for 3\.1\.1 and (\d+) for MQTT 5`).FindStringSubmatch(string(doc))
	require.NotNil(t, m, "the section states its counts")
	perSpec := map[string]int{}
	for _, row := range rows {
		perSpec[row.spec]++
	}
	require.Equal(t, m[1], strconv.Itoa(perSpec["3.1.1"]), "3.1.1 rules counted")
	require.Equal(t, m[2], strconv.Itoa(perSpec["5"]), "MQTT 5 rules counted")
	m = regexp.MustCompile("`TestSpecRules` has (\\d+) rows").FindStringSubmatch(string(doc))
	require.NotNil(t, m, "the section states TestSpecRules' rows")
	require.Equal(t, m[1], strconv.Itoa(len(specRules())), "TestSpecRules' rows counted")

	for spec, labels := range covered {
		for l := range labels {
			require.True(t, listed[spec][l], "TestSpecRules tests %s %s, which the %s table does not list", spec, l, spec)
		}
	}
}
