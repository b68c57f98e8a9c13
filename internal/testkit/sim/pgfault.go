package sim

// A lost COMMIT answer on PostgreSQL (fault "pg-lost-answer"): the server
// runs a step's COMMIT and answers, and the connection is cut before the
// answer reaches the store (pgtest.Proxy), as when a server restarts or a
// network drops at that moment. The store cannot tell whether its step
// took effect, so it runs the step again on a new connection, and each
// rule must find what the lost one did (store/policy): an enqueue its
// ticket, a release its tombstone, a reap the tickets it removed, a
// holder's "lost" release its event, logged once. The answers reach the
// callers, so the model holds every call to them as on the other stores:
// a step done twice (a slot freed twice, an event counted twice, a ticket
// admitted twice) or given up (a release left to the lease, a caller told
// "unavailable", S12) is a violation.
const loseCommitP = 0.02

// loseCommit makes the next COMMIT lose its answer, now and then in the
// random phase of a run on PostgreSQL with the fault.
func (s *sim) loseCommit() {
	p, ok := s.be.(*Postgres)
	if !ok || p.db.LoseNextCommit == nil {
		return
	}
	s.stats.LostAnswers = p.db.Lost() // one armed last in the random phase is lost in the quiescent one
	if !s.quiet && s.cfg.Faults.Has(PgLostAnswer) && s.pgRng.Float64() < loseCommitP {
		p.db.LoseNextCommit()
		s.tracef("the answer of the next COMMIT will be lost (%d so far)", p.db.Lost())
	}
}
