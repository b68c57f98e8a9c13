package docscheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/txtar"
)

// maxREADME is the most README.md may weigh, in bytes: the rest belongs
// in docs/.
const maxREADME = 25000

// moduleRoot walks up from the test's directory to the one holding go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}

// docFiles lists README.md and docs/*.md, relative to the module root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

func read(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goNames is what the module's Go sources declare.
type goNames struct {
	// members maps a package name to its top-level declarations, and a
	// type name to its methods and struct fields. Packages (or types) of
	// the same name in different directories share one entry.
	members map[string]map[string]bool
	// byDir maps a package's directory (slash-separated, relative to the
	// module root) to its top-level declarations.
	byDir map[string]map[string]bool
	// all is every name above: packages, declarations, methods, fields.
	all map[string]bool
	// files is the base name of every file in the module.
	files map[string]bool
}

func (g *goNames) add(set map[string]map[string]bool, owner, name string) {
	if set[owner] == nil {
		set[owner] = map[string]bool{}
	}
	set[owner][name] = true
	g.all[name] = true
}

// collectGoNames parses every .go file under root (tests included; testdata,
// vendor and hidden directories skipped; build tags ignored, so every
// variant of a file counts) and records package names, top-level funcs,
// types, vars and consts, methods by receiver type name, and struct fields
// by type name.
func collectGoNames(t *testing.T, root string) *goNames {
	t.Helper()
	g := &goNames{
		members: map[string]map[string]bool{},
		byDir:   map[string]map[string]bool{},
		all:     map[string]bool{},
		files:   map[string]bool{},
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		g.files[name] = true
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(rel)
		pkg := f.Name.Name
		g.all[pkg] = true
		decl := func(n string) {
			g.add(g.members, pkg, n)
			g.add(g.byDir, dir, n)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil || len(d.Recv.List) == 0 {
					decl(d.Name.Name)
					continue
				}
				if recv := recvName(d.Recv.List[0].Type); recv != "" {
					g.add(g.members, recv, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						decl(s.Name.Name)
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, f := range st.Fields.List {
								for _, n := range f.Names {
									g.add(g.members, s.Name.Name, n.Name)
								}
								if len(f.Names) == 0 { // embedded: named by its type
									if n := recvName(f.Type); n != "" {
										g.add(g.members, s.Name.Name, n)
									}
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							decl(n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// recvName is the type name of a receiver or embedded field: T, *T, T[P],
// pkg.T.
func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}

var (
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	// An identifier, or dotted identifiers: Name, pkg.Name, recv.method,
	// pkg.Type.Method, optionally behind a '*'.
	identRef = regexp.MustCompile(`^\*?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
	// A path: at least one slash, or a file name with an extension.
	pathRef = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+/?$`)
	fileRef = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.(go|md|txtar|sh|yaml|yml|conf)$`)
	// A package path followed by a name: gate/holder.Run, internal/proc.Judge.Dead.
	pkgPathRef = regexp.MustCompile(`^([a-z0-9_-]+(?:/[a-z0-9_-]+)+)\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)$`)
)

// checkMapRef says what is wrong with one backquoted span of docs/map.md,
// or "" when it names something that exists or is not a code reference.
//
// The rules, kept simple:
//   - a span with a slash (`store/boltstore`, `store/boltstore/ops.go`): a
//     path that exists relative to the module root; or else
//     `dir/pkg.Name` or `dir/pkg.Type.Member`: the directory holds a
//     package that declares Name (or Type, with Member as a method or field);
//   - a file name (`root.go`, `hostile_text.txtar`): some file in the
//     module has that name;
//   - `Name`: some package, declaration, method or field has that name;
//   - `a.B`: a is a package that declares B, or a type with a method or
//     field B;
//   - `a.B.C`: package a declares type B, which has a method or field C;
//   - anything else (flags, commands, text with spaces or '*') is not
//     checked. A word in backquotes that is not a code identifier belongs
//     in quotes instead.
func checkMapRef(root string, g *goNames, ref string) string {
	if pathRef.MatchString(ref) {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(ref))); err == nil {
			return ""
		}
		m := pkgPathRef.FindStringSubmatch(ref)
		if m == nil || fileRef.MatchString(path.Base(ref)) {
			return "no such path in the repository"
		}
		decls := g.byDir[m[1]]
		if decls == nil {
			return fmt.Sprintf("no Go package in directory %s", m[1])
		}
		parts := strings.Split(m[2], ".")
		if !decls[parts[0]] {
			return fmt.Sprintf("package %s declares no %s", m[1], parts[0])
		}
		if len(parts) == 2 && !g.members[parts[0]][parts[1]] {
			return fmt.Sprintf("type %s has no method or field %s", parts[0], parts[1])
		}
		return ""
	}
	if fileRef.MatchString(ref) {
		if !g.files[ref] {
			return "no file of that name in the repository"
		}
		return ""
	}
	if !identRef.MatchString(ref) {
		return ""
	}
	parts := strings.Split(strings.TrimPrefix(ref, "*"), ".")
	switch len(parts) {
	case 1:
		if !g.all[parts[0]] {
			return "no package, declaration, method or field of that name"
		}
	case 2:
		if !g.members[parts[0]][parts[1]] {
			return fmt.Sprintf("no package or type %s with a member %s", parts[0], parts[1])
		}
	case 3:
		if !g.members[parts[0]][parts[1]] || !g.members[parts[1]][parts[2]] {
			return fmt.Sprintf("no package %s with a type %s that has a method or field %s", parts[0], parts[1], parts[2])
		}
	default:
		return "too many dots to be a Go identifier"
	}
	return ""
}

// TestMapNamesExist: every code identifier and path docs/map.md names in
// backquotes exists in the repository.
func TestMapNamesExist(t *testing.T) {
	root := moduleRoot(t)
	g := collectGoNames(t, root)
	text := stripFenced(read(t, root, "docs/map.md"))
	checked := 0
	for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
		ref := strings.TrimSpace(m[1])
		if why := checkMapRef(root, g, ref); why != "" {
			t.Errorf("docs/map.md names `%s`: %s", ref, why)
		}
		checked++
	}
	if checked < 20 {
		t.Errorf("docs/map.md: only %d names in backquotes; is the map still there?", checked)
	}
}

// TestMapCheckCatchesFakes: the rules above refuse names that do not exist.
func TestMapCheckCatchesFakes(t *testing.T) {
	root := moduleRoot(t)
	g := collectGoNames(t, root)
	for _, fake := range []string{"txn.nosuch", "nosuchpkg.Name", "store.NoSuch", "gate/holder.NoSuch", "store/nosuch.go", "nosuch_file.go", "noSuchIdentifierAnywhere", "store.Ticket.NoSuch"} {
		if checkMapRef(root, g, fake) == "" {
			t.Errorf("`%s` passes the map check", fake)
		}
	}
	for _, real := range []string{"step.settle", "policy.PlanSettle", "gate/holder.Run", "store/boltstore", "store/boltstore/txn.go", "txn.go", "--limit", "slotctl run"} {
		if why := checkMapRef(root, g, real); why != "" {
			t.Errorf("`%s` fails the map check: %s", real, why)
		}
	}
}

var (
	fence      = regexp.MustCompile("(?m)^ *(```|~~~)")
	inlineCode = regexp.MustCompile("`[^`\n]*`")
	mdLink     = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// stripFenced blanks the lines of fenced code blocks.
func stripFenced(text string) string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if fence.MatchString(l) {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// anchors are the ids GitHub gives a file's headings: the text lowercased,
// everything but letters, digits, spaces, '-' and '_' dropped, spaces made
// '-', and "-1", "-2" added to repeats.
func anchors(text string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, l := range strings.Split(stripFenced(text), "\n") {
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		id := slug(m[1])
		if n := seen[id]; n > 0 {
			ids[fmt.Sprintf("%s-%d", id, n)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && isLetterOrDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isLetterOrDigit(r rune) bool {
	return strings.ContainsRune("éèàçöüäß", r) // the non-ASCII letters a heading here might use
}

// TestRelativeLinksResolve: every relative link in README.md and docs/*.md
// names an existing file and, for a #anchor into a Markdown file (or the
// same file), an existing heading. Links inside code (fenced blocks,
// backquotes) are not links and are skipped.
func TestRelativeLinksResolve(t *testing.T) {
	root := moduleRoot(t)
	for _, file := range docFiles(t, root) {
		text := read(t, root, file)
		body := inlineCode.ReplaceAllString(stripFenced(text), "")
		for _, m := range mdLink.FindAllStringSubmatch(body, -1) {
			link := m[1]
			if scheme.MatchString(link) || strings.HasPrefix(link, "//") {
				continue
			}
			target, anchor, _ := strings.Cut(link, "#")
			path := file
			if target != "" {
				path = filepath.ToSlash(filepath.Join(filepath.Dir(file), target))
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(path))); err != nil {
					t.Errorf("%s: link %q: no file %s", file, link, path)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if !anchors(read(t, root, path))[anchor] {
				t.Errorf("%s: link %q: %s has no heading with the id %q", file, link, path, anchor)
			}
		}
	}
}

// TestSlug pins the anchor rules on headings of this repository's kind.
func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Who holds what: `slotctl ls`":                         "who-holds-what-slotctl-ls",
		"Jobserver: builds share one `-j`":                     "jobserver-builds-share-one--j",
		"Newer runs first: supersede, replace, bounded queues": "newer-runs-first-supersede-replace-bounded-queues",
		"The attack suite, and what remains":                   "the-attack-suite-and-what-remains",
		"A stalled leader can end live leases (etcd's bug)":    "a-stalled-leader-can-end-live-leases-etcds-bug",
		"2.1 item_10 Newer runs first":                         "21-item_10-newer-runs-first",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestREADMEShortAndSelfContained: README.md stays under maxREADME bytes,
// and neither it nor docs/*.md cites a text outside the repository (a
// specification, its section signs, a shared directory) or an issue number.
func TestREADMEShortAndSelfContained(t *testing.T) {
	root := moduleRoot(t)
	if n := len(read(t, root, "README.md")); n > maxREADME {
		t.Errorf("README.md is %d bytes, more than %d: move detail to docs/", n, maxREADME)
	}
	forbidden := []string{"SPEC", "§", "../shared", "LEASES.md", "DESIGN.md"}
	issue := regexp.MustCompile(`(?i)\bissues? \d+`)
	for _, file := range docFiles(t, root) {
		for i, line := range strings.Split(read(t, root, file), "\n") {
			for _, f := range forbidden {
				if strings.Contains(line, f) {
					t.Errorf("%s:%d cites %q: say it in the repository's own words", file, i+1, f)
				}
			}
			if m := issue.FindString(line); m != "" {
				t.Errorf("%s:%d cites %q: state what is true now", file, i+1, m)
			}
		}
	}
	if !slices.Contains(docFiles(t, root), "docs/map.md") {
		t.Error("docs/map.md is gone")
	}
}

// recipeScripts pairs each test script that runs documented recipes with
// the document they come from: every line of its recipe files (a file of
// the archive whose name ends in .sh; a helper of the test starts with a
// "#" comment and is not a recipe) reads,
// with "$@" for the job, word for word in the document, the job being
// "make test".
var recipeScripts = []struct{ script, doc string }{
	{"cmd/internal/cli/testdata/script/run_per_branch.txtar", "docs/newer-runs.md"},
}

// TestRecipesAsTested: the recipes the scripts run are the docs' own, so a
// recipe edited in the docs cannot drift from the one the test proves.
func TestRecipesAsTested(t *testing.T) {
	root := moduleRoot(t)
	for _, r := range recipeScripts {
		ar := txtar.Parse([]byte(read(t, root, r.script)))
		doc := read(t, root, r.doc)
		n := 0
		for _, f := range ar.Files {
			if !strings.HasSuffix(f.Name, ".sh") || strings.HasPrefix(string(f.Data), "#") {
				continue
			}
			for _, line := range strings.Split(strings.TrimSpace(string(f.Data)), "\n") {
				want := strings.ReplaceAll(line, `"$@"`, "make test")
				if !strings.Contains(doc, "    "+want+"\n") {
					t.Errorf("%s: %s's line %q is not in %s as a code line", r.script, f.Name, want, r.doc)
				}
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s: no recipe files", r.script)
		}
	}
}
