// Package codecheck holds a test that keeps production code readable: no function over 80 lines or of cyclomatic complexity over 20, in every package of the module but the test-support ones (internal/testkit, store/storetest).
package codecheck
