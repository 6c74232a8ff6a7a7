// Command list-integration-tests prints the top-level tests of franz-go's
// pkg/kgo that talk to a broker: list-integration-tests <pkg/kgo dir>.
//
// kgo mixes unit tests and integration tests in one package and marks neither,
// so the only reliable sign is what a test reaches: every integration test gets
// its broker through the test helpers adm() or getSeedBrokers() (which read
// KGO_SEEDS). This walks the call graph of the *_test.go files from each
// TestXxx function and prints those that reach either helper. Methods are
// matched by name only, which can over-report but never misses a test.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: list-integration-tests <pkg/kgo dir>")
		os.Exit(2)
	}
	files, err := filepath.Glob(filepath.Join(os.Args[1], "*_test.go"))
	if err != nil || len(files) == 0 {
		fmt.Fprintf(os.Stderr, "no test files in %s\n", os.Args[1])
		os.Exit(1)
	}

	// Every function or method declared in a test file, by name, with the
	// names of the test-file functions its body refers to.
	refs := map[string]map[string]bool{}
	var tests []string
	fset := token.NewFileSet()
	for _, path := range files {
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "parse %s: %v\n", path, err)
			os.Exit(1)
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			name := fn.Name.Name
			if refs[name] == nil {
				refs[name] = map[string]bool{}
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.Ident:
					refs[name][x.Name] = true
				case *ast.SelectorExpr:
					refs[name][x.Sel.Name] = true
				}
				return true
			})
			if fn.Recv == nil && strings.HasPrefix(name, "Test") && name != "TestMain" {
				tests = append(tests, name)
			}
		}
	}
	// Package-level var initialisers that dial a broker would be missed, but
	// kgo's tests have none: the helpers create their clients lazily.

	memo := map[string]bool{}
	var reaches func(name string, seen map[string]bool) bool
	reaches = func(name string, seen map[string]bool) bool {
		if name == "adm" || name == "getSeedBrokers" {
			return true
		}
		if v, ok := memo[name]; ok {
			return v
		}
		if seen[name] {
			return false
		}
		seen[name] = true
		for callee := range refs[name] {
			if _, declared := refs[callee]; declared && reaches(callee, seen) {
				memo[name] = true
				return true
			}
		}
		return false
	}
	sort.Strings(tests)
	for _, test := range tests {
		if reaches(test, map[string]bool{}) {
			fmt.Println(test)
		}
	}
}
