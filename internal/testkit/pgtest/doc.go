// Package pgtest gives each test a fresh, empty PostgreSQL database, on a
// server that the test binary starts for itself (or on the one named by
// SLOTCTL_PG_URL) and that never outlives it.
package pgtest
