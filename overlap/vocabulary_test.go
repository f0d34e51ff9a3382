package overlap

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/hosted"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// TestErrorVocabulary checks that errors keep their identity across
// package lines: what one package returns, a caller of the package above
// matches with errors.Is and errors.As, and errors of different meanings
// do not match each other.
func TestErrorVocabulary(t *testing.T) {
	ctx := context.Background()
	sizes := []int{300}

	t.Run("a peer's Close reaches the engine as comm.ErrClosed", func(t *testing.T) {
		comms := group(t, 2)
		engines := make([]*Engine, 2)
		mustNoErrors(t, "New", onRanks(comms, func(r int, c comm.Comm) (err error) {
			engines[r], err = New(ctx, c, sizes, Config{Spec: "int8", Decision: DecideCompressed, ErrorFeedback: true, Timeout: fakeTimeout})
			return err
		}))
		defer engines[0].Close()
		defer engines[1].Close()
		comms[1].Close()
		e := engines[0]
		if err := e.Step(); err != nil {
			t.Fatal(err)
		}
		if err := e.Ready(0, make([]float32, sizes[0])); err != nil {
			t.Fatal(err)
		}
		_, err := e.Wait(ctx)
		var se *StepError
		var ce *comm.ClosedError
		if !errors.Is(err, comm.ErrClosed) || !errors.As(err, &se) || !errors.As(err, &ce) || ce.Rank != 1 {
			t.Fatalf("Wait = %v; want a *StepError wrapping rank 1's *comm.ClosedError (comm.ErrClosed)", err)
		}
		err = e.Step()
		var be *BrokenError
		if !errors.As(err, &be) || !errors.Is(err, comm.ErrClosed) || errors.Is(err, ErrEngineClosed) {
			t.Errorf("Step after the failure = %v; want a *BrokenError whose cause is comm.ErrClosed", err)
		}
	})

	t.Run("a closed engine is ErrEngineClosed, not comm.ErrClosed", func(t *testing.T) {
		e := newEngines(t, 1, sizes, Config{Spec: "int8"})[0]
		e.Close()
		err := e.Step()
		var ue *UsageError
		if !errors.Is(err, ErrEngineClosed) || !errors.As(err, &ue) || errors.Is(err, comm.ErrClosed) {
			t.Errorf("Step after Close = %v; want a *UsageError matching ErrEngineClosed only", err)
		}
	})

	t.Run("a host's failure reaches the engine as *hosted.HostError", func(t *testing.T) {
		tr, err := hosted.New(0, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		world := group(t, 1)[0]
		host := make(chan error, 1)
		go func() {
			// Complete every post of the handshake, then fail the step's.
			tctx, cancel := context.WithTimeout(ctx, fakeTimeout)
			defer cancel()
			for {
				op, err := tr.Take(tctx)
				if err != nil {
					host <- err
					return
				}
				if op.Kind == comm.OpAllReduce {
					host <- tr.Complete(op.ID, 0, errors.New("the host's communicator failed"))
					return
				}
				n, err := hosted.Run(tctx, op, world)
				if err == nil {
					err = tr.Complete(op.ID, n, nil)
				}
				if err != nil {
					host <- err
					return
				}
			}
		}()
		e, err := New(ctx, tr.Host(), sizes, Config{Spec: "none", Timeout: fakeTimeout})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Step(); err != nil {
			t.Fatal(err)
		}
		if err := e.Ready(0, make([]float32, sizes[0])); err != nil {
			t.Fatal(err)
		}
		_, err = e.Wait(ctx)
		var he *hosted.HostError
		if !errors.As(err, &he) || errors.Is(err, comm.ErrClosed) {
			t.Errorf("Wait = %v; want the host's *hosted.HostError", err)
		}
		if herr := <-host; herr != nil {
			t.Errorf("the host's completion: %v", herr)
		}
	})

	t.Run("a payload of another spec is *compress.PayloadMismatchError, not *comm.MismatchError", func(t *testing.T) {
		p, err := compresstest.MustParse(t, "int8").Compress(nil, make([]float32, 100), compress.Key{})
		if err != nil {
			t.Fatal(err)
		}
		err = compresstest.MustParse(t, "int4").Decompress(make([]float32, 100), p)
		var pm *compress.PayloadMismatchError
		var cm *comm.MismatchError
		if !errors.As(err, &pm) || errors.As(err, &cm) {
			t.Errorf("Decompress of an int8 payload by int4 = %v; want a *compress.PayloadMismatchError", err)
		}
	})

	t.Run("a state of another spec is *StateError and changes nothing", func(t *testing.T) {
		a := newEngines(t, 1, sizes, Config{Spec: "int8", ErrorFeedback: true})[0]
		b := newEngines(t, 1, sizes, Config{Spec: "int4", ErrorFeedback: true})[0]
		var sa, before, after bytes.Buffer
		if err := a.Save(&sa); err != nil {
			t.Fatal(err)
		}
		if err := b.Save(&before); err != nil {
			t.Fatal(err)
		}
		err := b.Load(&sa)
		var st *StateError
		if !errors.As(err, &st) {
			t.Fatalf("Load of an int8 state into an int4 engine = %v; want a *StateError", err)
		}
		if err := b.Save(&after); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(before.Bytes(), after.Bytes()) {
			t.Error("a refused Load changed the engine's state")
		}
	})
}
