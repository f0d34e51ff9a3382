package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestLinks fails for every relative Markdown link in README.md or
// docs/*.md, [text](path#anchor), whose file does not exist or whose
// anchor the target document does not define. Links in fenced blocks and
// code spans are not links; http(s) and mailto links are not checked. A
// document defines an anchor for each heading, made as GitHub makes it
// (lower case; letters, digits, spaces, '-' and '_' kept, the rest
// dropped; spaces to '-'; "-1", "-2", … after repeats), and for each
// <a id="…"> or <a name="…">.
func TestLinks(t *testing.T) {
	root := repoRoot(t)
	anchors := map[string]map[string]bool{}
	for _, doc := range documents(t, root) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		anchors[doc] = headingAnchors(string(text))
	}
	for _, doc := range documents(t, root) {
		rel, _ := filepath.Rel(root, doc)
		for _, l := range links(t, doc) {
			target, frag, _ := strings.Cut(l.target, "#")
			file := doc
			if target != "" {
				file = filepath.Join(filepath.Dir(doc), filepath.FromSlash(target))
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s:%d: link %s: no file %s", rel, l.line, l.target, target)
				continue
			}
			if frag == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			a, ok := anchors[file]
			if !ok {
				text, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				a = headingAnchors(string(text))
				anchors[file] = a
			}
			if !a[frag] {
				t.Errorf("%s:%d: link %s: %s has no heading or anchor %q", rel, l.line, l.target, target, frag)
			}
		}
	}
}

type link struct {
	line   int
	target string
}

var (
	markdownLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	htmlAnchor   = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	heading      = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	inlineCode   = regexp.MustCompile("`[^`]*`")
)

// links returns the relative links of doc outside fenced blocks and code
// spans.
func links(t *testing.T, doc string) []link {
	t.Helper()
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	var out []link
	for i, l := range proseLines(string(text)) {
		for _, m := range markdownLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(l, ""), -1) {
			t := m[1]
			if strings.HasPrefix(t, "http://") || strings.HasPrefix(t, "https://") || strings.HasPrefix(t, "mailto:") {
				continue
			}
			out = append(out, link{line: i + 1, target: t})
		}
	}
	return out
}

// proseLines is text's lines with those of fenced blocks blank.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	open := ""
	for i, l := range lines {
		m := fence.FindStringSubmatch(l)
		switch {
		case open == "" && m != nil:
			open = m[1]
			lines[i] = ""
		case open != "":
			if m != nil && strings.HasPrefix(m[1], open) && m[2] == "" {
				open = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

// headingAnchors returns the anchors a Markdown text defines.
func headingAnchors(text string) map[string]bool {
	a := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			a[m[1]] = true
		}
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n, ok := seen[s]; ok {
			seen[s] = n + 1
			s += "-" + strconv.Itoa(n+1)
		} else {
			seen[s] = 0
		}
		a[s] = true
	}
	return a
}

// slug makes a heading's anchor as GitHub does.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
