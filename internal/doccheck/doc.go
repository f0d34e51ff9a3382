// Package doccheck holds tests of the repository's documentation against
// the repository: every Go identifier that README.md or docs/*.md names is
// declared in the module (TestGoIdentifiers), and every relative link
// reaches a file and a heading that exist (TestLinks). The tests' doc
// comments state the rules. The package has no code of its own.
package doccheck
