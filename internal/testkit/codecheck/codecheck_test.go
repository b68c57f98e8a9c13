package codecheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The limits on a production function.
const (
	maxLines = 80 // from the func keyword to the closing brace, both counted
	maxCyclo = 20 // see cyclo
)

// testSupport are the module's packages that only tests import: suites,
// not shipped code. Everything under them is exempt.
var testSupport = []string{"internal/testkit", "store/storetest"}

// moduleRoot is the module's root: go test runs a test in its package's
// directory, three levels below it.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root: %v", err)
	}
	return root
}

// productionFiles are the module's Go files that ship, relative to root
// with slashes: every .go file but tests, whatever its build constraints,
// outside testSupport, testdata, directories the go command ignores (".",
// "_" prefixes) and nested modules.
func productionFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && skipDir(p, rel, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

func skipDir(p, rel, name string) bool {
	if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || slices.Contains(testSupport, rel) {
		return true
	}
	_, err := os.Stat(filepath.Join(p, "go.mod")) // another module
	return err == nil
}

// An offender is a function over one of the limits.
type offender struct {
	pos          token.Position
	name         string
	lines, cyclo int
}

func (o offender) String() string {
	return fmt.Sprintf("%s:%d %s lines=%d cyclo=%d", o.pos.Filename, o.pos.Line, o.name, o.lines, o.cyclo)
}

// offenders parses the Go source src (named file) and returns its functions
// over maxLines or maxCyclo. A function is a declared func or method, or a
// func literal outside any (in a package-level var); a func literal inside
// a function is part of it, its lines and its branches.
func offenders(file string, src any) ([]offender, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []offender
	check := func(name string, fn ast.Node) {
		start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
		o := offender{pos: start, name: name, lines: end.Line - start.Line + 1, cyclo: cyclo(fn)}
		if o.lines > maxLines || o.cyclo > maxCyclo {
			out = append(out, o)
		}
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok {
			if fd.Body != nil {
				check(funcName(fd), fd)
			}
			continue
		}
		ast.Inspect(d, func(n ast.Node) bool {
			if fl, ok := n.(*ast.FuncLit); ok {
				check("func literal", fl)
				return false
			}
			return true
		})
	}
	return out, nil
}

// funcName is fd's name, with its receiver's type for a method:
// "(*Store).open", "ticketColumns.row".
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	star := ""
	if s, ok := typ.(*ast.StarExpr); ok {
		star, typ = "*", s.X
	}
	switch x := typ.(type) { // a generic receiver: its type's name alone
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	name := fmt.Sprint(typ)
	if id, ok := typ.(*ast.Ident); ok {
		name = id.Name
	}
	if star != "" {
		return "(" + star + name + ")." + fd.Name.Name
	}
	return name + "." + fd.Name.Name
}

// cyclo is fn's cyclomatic complexity, counted as gocyclo counts it: 1,
// plus one for each if, for and range; each case of a switch or type
// switch and each case of a select, but not their default (a type switch
// case is a branch on the type as an expression switch's is on the value,
// and a select case one on which channel is ready); and each && and ||.
// Func literals within fn count as part of it.
func cyclo(fn ast.Node) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// TestFunctionSize: no production function is over maxLines lines or
// maxCyclo of cyclomatic complexity. Split such a function by what its
// parts do, not by its line count.
func TestFunctionSize(t *testing.T) {
	root := moduleRoot(t)
	files, err := productionFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	// The walk itself must reach the code, or every check below passes.
	for _, want := range []string{"store/boltstore/fastdecode.go", "cmd/internal/cli/ls.go", "cmd/slotctl/main.go"} {
		if !slices.Contains(files, want) {
			t.Fatalf("the walk of %s missed %s (%d files)", root, want, len(files))
		}
	}
	for _, f := range files {
		for _, dir := range testSupport {
			if strings.HasPrefix(f, dir+"/") {
				t.Fatalf("the walk reached %s, in the test-support package %s", f, dir)
			}
		}
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		bad, err := offenders(f, src)
		if err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		for _, o := range bad {
			t.Errorf("%v (at most %d lines and cyclomatic complexity %d)", o, maxLines, maxCyclo)
		}
	}
}

// TestOffendersCatches: the check reports a function of maxLines+1 lines
// and one of complexity maxCyclo+1, and neither of those just at the
// limits; and counts branches as cyclo says.
func TestOffendersCatches(t *testing.T) {
	var src strings.Builder
	src.WriteString("package p\n\n")
	long := func(name string, lines int) { // lines from func to }, both counted
		fmt.Fprintf(&src, "func %s() {\n%s}\n\n", name, strings.Repeat("\t_ = 0\n", lines-2))
	}
	branchy := func(name string, c int) {
		fmt.Fprintf(&src, "func %s(x int) {\n", name)
		for i := range c - 1 {
			fmt.Fprintf(&src, "\tif x == %d {\n\t\treturn\n\t}\n", i)
		}
		src.WriteString("}\n\n")
	}
	long("tooLong", maxLines+1)
	long("longest", maxLines)
	branchy("tooBranchy", maxCyclo+1)
	branchy("branchiest", maxCyclo)
	src.WriteString(`type T struct{}

// 1, +2 type switch cases, +2 select cases, +1 range, +1 if, +1 &&,
// +1 ||, +1 for, +1 if in the func literal: 11.
func (*T) mixed(v any, c chan int, xs []int) {
	switch v.(type) {
	case int:
	case string, bool:
	default:
	}
	select {
	case <-c:
	case c <- 1:
	default:
	}
	for _, x := range xs {
		if x > 0 && x < 9 || x == 20 {
			return
		}
	}
	for {
		break
	}
	f := func() {
		if v == nil {
			return
		}
	}
	f()
}

var lit = func(x int) bool {
` + strings.Repeat("\tif x == 0 {\n\t\treturn true\n\t}\n", maxCyclo) + `	return false
}
`)
	got, err := offenders("p.go", src.String())
	if err != nil {
		t.Fatalf("%v in\n%s", err, src.String())
	}
	var names []string
	for _, o := range got {
		names = append(names, o.String())
	}
	at := func(prefix string) string { return fmt.Sprintf("p.go:%d", lineOf(t, src.String(), prefix)) }
	want := []string{
		fmt.Sprintf("%s tooLong lines=%d cyclo=1", at("func tooLong"), maxLines+1),
		fmt.Sprintf("%s tooBranchy lines=%d cyclo=%d", at("func tooBranchy"), 3*maxCyclo+2, maxCyclo+1),
		fmt.Sprintf("%s func literal lines=%d cyclo=%d", at("var lit"), 3*maxCyclo+3, maxCyclo+1),
	}
	if !slices.Equal(names, want) {
		t.Errorf("offenders reported\n%s\nwant\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}

	// The rule for each kind of branch, on a function under the limits.
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src.String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(f.Decls, func(d ast.Decl) bool {
		fd, ok := d.(*ast.FuncDecl)
		return ok && fd.Name.Name == "mixed"
	})
	if i < 0 {
		t.Fatal("no func mixed")
	}
	fd := f.Decls[i].(*ast.FuncDecl)
	if name := funcName(fd); name != "(*T).mixed" {
		t.Errorf("funcName = %q, want (*T).mixed", name)
	}
	if c := cyclo(fd); c != 11 {
		t.Errorf("cyclo(mixed) = %d, want 11", c)
	}
}

// lineOf is the line of src where prefix starts a line.
func lineOf(t *testing.T, src, prefix string) int {
	t.Helper()
	for i, l := range strings.Split(src, "\n") {
		if strings.HasPrefix(l, prefix) {
			return i + 1
		}
	}
	t.Fatalf("no line %q", prefix)
	return 0
}
