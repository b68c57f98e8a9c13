// Package docscheck holds tests that keep README.md and docs/ honest: the code map names only identifiers and paths that exist, relative links and anchors resolve, and the README stays short and cites nothing outside the repository.
package docscheck
