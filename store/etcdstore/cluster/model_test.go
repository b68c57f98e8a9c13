package cluster

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The model: a FIFO semaphore of n slots over tickets numbered in the
// order the store created them (their create revisions, the store's FIFO
// order: docs/leases.md). Operations, each with the times that bound it:
//
//	enqueue r  [job started, its child started (or the job exited)]: r is
//	           the next ticket; it waits at the back of the queue
//	admit r    [job started, its child started]: r is at the head of the
//	           queue and a slot is free; it holds one
//	release r  [its child ended, never]: r gives its slot back (the store
//	           may learn it late: a lost lease expires after the child is
//	           dead, which is the point)
//	leave r    [job started, never]: a ticket whose job ran no child goes,
//	           from the queue or its slot (cancelled, timed out, lost)
//
// A history is legal if the operations can be ordered, each at an instant
// inside its bounds, so that the semaphore allows every step: no ticket is
// admitted past a waiting one created before it, nor while n others hold.
type semKind int

const (
	opEnqueue semKind = iota
	opAdmit
	opRelease
	opLeave
)

func (k semKind) String() string {
	return [...]string{"enqueue", "admit", "release", "leave"}[k]
}

type semOp struct {
	kind semKind
	rank int
	job  string
}

type semState struct {
	next  int   // the rank of the next enqueue
	queue []int // waiting, in FIFO order
	held  []int
}

func semModel(slots int) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return semState{} },
		Step: func(state, input, _ any) (bool, any) {
			s, op := state.(semState), input.(semOp)
			switch op.kind {
			case opEnqueue:
				if op.rank != s.next {
					return false, s
				}
				return true, semState{s.next + 1, append(slices.Clip(s.queue), op.rank), s.held}
			case opAdmit:
				if len(s.queue) == 0 || s.queue[0] != op.rank || len(s.held) >= slots {
					return false, s
				}
				return true, semState{s.next, s.queue[1:], append(slices.Clip(s.held), op.rank)}
			case opRelease:
				i := slices.Index(s.held, op.rank)
				if i < 0 {
					return false, s
				}
				return true, semState{s.next, s.queue, slices.Delete(slices.Clone(s.held), i, i+1)}
			case opLeave:
				if i := slices.Index(s.queue, op.rank); i >= 0 {
					return true, semState{s.next, slices.Delete(slices.Clone(s.queue), i, i+1), s.held}
				}
				if i := slices.Index(s.held, op.rank); i >= 0 {
					return true, semState{s.next, s.queue, slices.Delete(slices.Clone(s.held), i, i+1)}
				}
				return false, s
			}
			return false, s
		},
		Equal: func(a, b any) bool {
			x, y := a.(semState), b.(semState)
			return x.next == y.next && slices.Equal(x.queue, y.queue) && slices.Equal(x.held, y.held)
		},
		DescribeOperation: func(input, _ any) string {
			op := input.(semOp)
			return fmt.Sprintf("%s %d (%s)", op.kind, op.rank, op.job)
		},
		DescribeState: func(state any) string {
			s := state.(semState)
			return fmt.Sprintf("next %d, waiting %v, held %v", s.next, s.queue, s.held)
		},
	}
}

const never = math.MaxInt64

// checkFIFO checks ops against the model; on an illegal history it
// describes the longest legal prefix porcupine found.
func checkFIFO(ops []porcupine.Operation, slots int, timeout time.Duration) (porcupine.CheckResult, string) {
	m := semModel(slots)
	res, info := porcupine.CheckOperationsVerbose(m, ops, timeout)
	if res != porcupine.Illegal {
		return res, ""
	}
	var b strings.Builder
	placed := map[semOp]bool{}
	for _, part := range info.PartialLinearizationsOperations() {
		longest := []porcupine.Operation{}
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
		fmt.Fprintf(&b, "longest legal order found (%d of %d operations), its last steps:\n", len(longest), len(ops))
		st := m.Init()
		for i, op := range longest {
			placed[op.Input.(semOp)] = true
			_, st = m.Step(st, op.Input, op.Output)
			if i >= len(longest)-12 {
				fmt.Fprintf(&b, "  %-28s -> %s\n", m.DescribeOperation(op.Input, op.Output), m.DescribeState(st))
			}
		}
		break
	}
	b.WriteString("the first operations it could not place after those:\n")
	left := slices.Clone(ops)
	slices.SortFunc(left, func(x, y porcupine.Operation) int { return cmp.Compare(x.Call, y.Call) })
	n := 0
	for _, op := range left {
		if placed[op.Input.(semOp)] || n >= 12 {
			continue
		}
		n++
		ret := "never"
		if op.Return != never {
			ret = time.Unix(0, op.Return).Format("15:04:05.000000")
		}
		fmt.Fprintf(&b, "  %-28s [%s, %s]\n", m.DescribeOperation(op.Input, op.Output), time.Unix(0, op.Call).Format("15:04:05.000000"), ret)
	}
	return res, b.String()
}

// history turns the jobs and the store's tickets into operations.
func (js *jobs) history(tickets []storedTicket) ([]porcupine.Operation, error) {
	byPid := map[int]*job{}
	for _, j := range js.all() {
		byPid[j.cmd.Process.Pid] = j
	}
	var ops []porcupine.Operation
	var errs []string
	add := func(kind semKind, rank int, j *job, call, ret int64, client int) {
		ops = append(ops, porcupine.Operation{ClientId: client, Input: semOp{kind, rank, j.name}, Call: call, Return: ret})
	}
	for rank, st := range tickets {
		j := byPid[st.pid]
		if j == nil {
			errs = append(errs, fmt.Sprintf("ticket %s (rank %d) written by pid %d, no job of this test", st.id, rank, st.pid))
			continue
		}
		client := slices.Index(js.list, j)
		start := j.start.UnixNano()
		if st.id == j.ticket && !j.childStart.IsZero() {
			add(opEnqueue, rank, j, start, j.childStart.UnixNano(), client)
			add(opAdmit, rank, j, start, j.childStart.UnixNano(), client)
			add(opRelease, rank, j, j.childEnd.UnixNano(), never, client)
			continue
		}
		add(opEnqueue, rank, j, start, j.exit.UnixNano(), client)
		add(opLeave, rank, j, start, never, client)
	}
	// A child that ran on a ticket the store never had is an admission
	// from nowhere.
	ids := map[string]bool{}
	for _, st := range tickets {
		ids[st.id] = true
	}
	for _, j := range js.all() {
		if !j.childStart.IsZero() && !ids[j.ticket] {
			errs = append(errs, fmt.Sprintf("%s's child ran on ticket %q, which the store never had", j.name, j.ticket))
		}
	}
	if errs != nil {
		return ops, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return ops, nil
}

// The model refuses what it must: a third holder of two slots, and a
// ticket admitted past an older waiting one (so a check that passes is
// not one that cannot fail). These run without a cluster.
func TestModelRefusesOverlapAndQueueJumping(t *testing.T) {
	op := func(kind semKind, rank int, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: semOp{kind, rank, fmt.Sprint("j", rank)}, Call: call, Return: ret}
	}
	job := func(rank int, start, childStart, childEnd int64) []porcupine.Operation {
		return []porcupine.Operation{op(opEnqueue, rank, start, childStart), op(opAdmit, rank, start, childStart), op(opRelease, rank, childEnd, never)}
	}
	cases := []struct {
		name  string
		slots int
		ops   [][]porcupine.Operation
		want  porcupine.CheckResult
	}{
		{"two holders of two slots, a third after one ended", 2,
			[][]porcupine.Operation{job(0, 0, 10, 100), job(1, 1, 11, 50), job(2, 2, 60, 70)}, porcupine.Ok},
		{"three children at once in two slots", 2,
			[][]porcupine.Operation{job(0, 0, 10, 100), job(1, 1, 11, 50), job(2, 2, 40, 70)}, porcupine.Illegal},
		{"the later ticket ran first, the older one waited behind it", 1,
			[][]porcupine.Operation{job(0, 0, 100, 110), job(1, 5, 10, 20)}, porcupine.Illegal},
		{"the older one left (cancelled): the later one may go", 1,
			[][]porcupine.Operation{{op(opEnqueue, 0, 0, 3), op(opLeave, 0, 0, never)}, job(1, 5, 10, 20)}, porcupine.Ok},
		{"a held slot given away before its child ended", 1,
			[][]porcupine.Operation{job(0, 0, 10, 100), job(1, 1, 99, 120)}, porcupine.Illegal},
	}
	for _, c := range cases {
		var ops []porcupine.Operation
		for _, o := range c.ops {
			ops = append(ops, o...)
		}
		got, info := checkFIFO(ops, c.slots, 10*time.Second)
		if got != c.want {
			t.Errorf("%s: porcupine says %s, want %s\n%s", c.name, got, c.want, info)
		} else if got == porcupine.Illegal {
			t.Logf("%s: illegal, as it must be:\n%s", c.name, info)
		}
	}
}
