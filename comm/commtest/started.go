package commtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradcomp/gradcomp/comm"
)

// started is one collective of RunStarted: start issues it, check
// compares its result with what every rank can compute on its own.
type started struct {
	op    comm.Op
	start func(ctx context.Context) (comm.Request, error)
	check func() error
}

// RunStarted is Run's counterpart for the several-in-flight contract of a
// comm.Starter. For each of Lengths it starts InFlight() collectives of
// every kind the Starter has (all-gather, all-to-all, all-reduce of
// integers and of arbitrary floats, reduce-scatter) before waiting for
// any, and waits for them in an order that differs between ranks (rank r
// starts with the r-th, modulo the count), then checks every result as
// Run does. It also checks that a start beyond InFlight() returns a
// *comm.BusyError and starts nothing, and that a blocking call made while
// collectives are outstanding takes its place in their order. It is
// collective: call it on every rank at once with the same Options.
func RunStarted(ctx context.Context, c comm.Starter, o Options) error {
	if c.InFlight() < 2 {
		return fmt.Errorf("InFlight() = %d on rank %d, want at least 2", c.InFlight(), c.Rank())
	}
	for _, l := range Lengths {
		if err := startedRound(ctx, c, o, l); err != nil {
			return err
		}
	}
	return nil
}

// startedRound is RunStarted for one length.
func startedRound(ctx context.Context, c comm.Starter, o Options, l int) error {
	n, r := c.Size(), c.Rank()
	cases := startedCases(c, o, l)
	k := c.InFlight()
	reqs := make([]comm.Request, k)
	run := make([]started, k)
	for i := range k {
		run[i] = cases[i%len(cases)]
		if i >= len(cases) { // a second copy of a case needs buffers of its own
			run[i] = startedCases(c, o, l)[i%len(cases)]
		}
		q, err := run[i].start(ctx)
		if err != nil {
			return fmt.Errorf("start %d of %d (%v, length %d) on rank %d: %w", i+1, k, run[i].op, l, r, err)
		}
		reqs[i] = q
	}
	extra := startedCases(c, o, l)[0]
	var busy *comm.BusyError
	if q, err := extra.start(ctx); !errors.As(err, &busy) || busy.Started != k {
		if q != nil {
			return fmt.Errorf("start %d beyond InFlight() = %d on rank %d was accepted", k+1, k, r)
		}
		return fmt.Errorf("start %d beyond InFlight() = %d on rank %d: got %v, want a *comm.BusyError with Started %d", k+1, k, r, err, k)
	}
	for j := range k {
		i := (r + j) % k
		if err := reqs[i].Wait(ctx); err != nil {
			return fmt.Errorf("wait for start %d (%v, length %d) on rank %d: %w", i+1, run[i].op, l, r, err)
		}
		if err := run[i].check(); err != nil {
			return err
		}
	}
	for i := range k { // a second Wait returns the first's result
		if err := reqs[i].Wait(ctx); err != nil {
			return fmt.Errorf("second wait for start %d on rank %d: %w", i+1, r, err)
		}
	}
	// A blocking call between two starts: the three match in order.
	a, b := startedCases(c, o, l)[2], startedCases(c, o, l)[0]
	qa, err := a.start(ctx)
	if err != nil {
		return err
	}
	if err := allGather(ctx, c, o, l); err != nil {
		return fmt.Errorf("blocking AllGather between two starts on rank %d of %d: %w", r, n, err)
	}
	qb, err := b.start(ctx)
	if err != nil {
		return err
	}
	for _, x := range []struct {
		q comm.Request
		s started
	}{{qb, b}, {qa, a}} {
		if err := x.q.Wait(ctx); err != nil {
			return err
		}
		if err := x.s.check(); err != nil {
			return err
		}
	}
	return nil
}

// startedCases returns one started collective of each kind, with fresh
// buffers, for chunk length l.
func startedCases(c comm.Starter, o Options, l int) []started {
	n, r := c.Size(), c.Rank()
	var out []started

	gsrc := bytesOf(kindGather, r, 0, l)
	gdst := guarded(n * l)
	out = append(out, started{comm.OpAllGather,
		func(ctx context.Context) (comm.Request, error) { return c.StartAllGather(ctx, gdst, gsrc) },
		func() error {
			want := make([]byte, 0, n*l)
			for q := range n {
				want = append(want, bytesOf(kindGather, q, 0, l)...)
			}
			if err := diffBytes(comm.OpAllGather, fmt.Sprintf("started, len(src) %d", l), r, gdst, want); err != nil {
				return err
			}
			return checkGuard(comm.OpAllGather, r, gdst)
		}})

	asrc := make([]byte, 0, n*l)
	awant := make([]byte, 0, n*l)
	for q := range n {
		asrc = append(asrc, bytesOf(kindAllToAll, r, q, l)...)
		awant = append(awant, bytesOf(kindAllToAll, q, r, l)...)
	}
	adst := guarded(n * l)
	out = append(out, started{comm.OpAllToAll,
		func(ctx context.Context) (comm.Request, error) { return c.StartAllToAll(ctx, adst, asrc) },
		func() error {
			if err := diffBytes(comm.OpAllToAll, fmt.Sprintf("started, chunk %d", l), r, adst, awant); err != nil {
				return err
			}
			return checkGuard(comm.OpAllToAll, r, adst)
		}})

	for _, kind := range []uint64{kindInts, kindFloats} {
		buf := floatsOf(kind, r, l)
		out = append(out, started{comm.OpAllReduce,
			func(ctx context.Context) (comm.Request, error) { return c.StartAllReduce(ctx, buf) },
			func() error {
				want, abs := sums(kind, n, l)
				return checkSum(comm.OpAllReduce, kind, o, n, r, 0, buf, want, abs)
			}})
	}

	src := floatsOf(kindFloats, r, n*l)
	dst := floatsOf(kindGarbage, r, l)
	out = append(out, started{comm.OpReduceScatter,
		func(ctx context.Context) (comm.Request, error) { return c.StartReduceScatter(ctx, dst, src) },
		func() error {
			want, abs := sums(kindFloats, n, n*l)
			return checkSum(comm.OpReduceScatter, kindFloats, o, n, r, r*l, dst, want, abs)
		}})
	return out
}
