package cli

import (
	"io"
	"os"
	"sync"
	"time"
)

// jobStreams are the descriptors a job gets for slotctl's streams: the
// files themselves, or pipes that slotctl copies through when a stream is
// not a file (a test's buffer).
type jobStreams struct {
	child  []*os.File // stdin, stdout, stderr, for the job
	closes []*os.File // the job's ends of the pipes, closed here once it has them
	mine   []*os.File // slotctl's ends, closed if the job does not start
}

func (s *jobStreams) closeChild() {
	for _, f := range s.closes {
		f.Close()
	}
}

func (s *jobStreams) abandon() {
	for _, f := range s.mine {
		f.Close()
	}
}

// copyWait bounds the wait for a pipe's last bytes: a process of the job
// that was given up on may hold its end open.
const copyWait = time.Second

// jobFiles makes the job's streams; copied waits for what the job wrote
// through pipes to be passed on.
func jobFiles(streams *IOStreams) (*jobStreams, func(), error) {
	s := &jobStreams{}
	var wg sync.WaitGroup
	switch in := streams.In.(type) {
	case *os.File:
		s.child = append(s.child, in)
	case nil:
		null, err := os.Open(os.DevNull)
		if err != nil {
			return nil, nil, err
		}
		s.child, s.closes = append(s.child, null), append(s.closes, null)
	default:
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		s.child, s.closes, s.mine = append(s.child, r), append(s.closes, r), append(s.mine, w)
		go func() {
			_, _ = io.Copy(w, in)
			w.Close()
		}()
	}
	for _, out := range []io.Writer{streams.Out, streams.ErrOut} {
		if f, ok := out.(*os.File); ok {
			s.child = append(s.child, f)
			continue
		}
		if out == nil {
			out = io.Discard
		}
		r, w, err := os.Pipe()
		if err != nil {
			s.closeChild()
			s.abandon()
			return nil, nil, err
		}
		s.child, s.closes, s.mine = append(s.child, w), append(s.closes, w), append(s.mine, r)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(out, r)
			r.Close()
		}()
	}
	copied := func() {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(copyWait):
		}
	}
	return s, copied, nil
}
