// Package testkit holds, in its subpackages, what only the tests use: the
// deterministic simulation (sim), the attack cast (attacktest), loopback
// and PostgreSQL servers for tests (loopback, pgtest), the guard that
// kills what a test started (testguard), the long-suite switch (longtest),
// real disk faults (diskfault), the documentation checks (docscheck) and
// the check of function size (codecheck).
// Nothing here is linked into a released binary.
package testkit
