package ncclcomm_test

import (
	"errors"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/commtest"
	"github.com/gradcomp/gradcomp/comm/ncclcomm"
	"github.com/gradcomp/gradcomp/comm/staged"
	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// TestStagedSplit: host comms staged over 4 DeviceComms laid out as 2
// nodes × 2 ranks split (comm.Splitter) into node and cross-node comms of
// the right ranks, each of which passes the Comm conformance suite, and
// each of which reports its place.
func TestStagedSplit(t *testing.T) {
	comms := group(t, 4)
	var mem ncclmock.Memory
	topos, err := comm.NodeTopologies([]int{0, 0, 1, 1})
	if err != nil {
		t.Fatal(err)
	}
	each(t, comms, "split and run", func(r int, c *ncclcomm.Comm) error {
		s := staged.New(c, &mem, 0, topos[r])
		defer s.Close()
		node, cross, err := s.Split(t.Context())
		if err != nil {
			return err
		}
		defer node.Close()
		defer cross.Close()
		if node.Size() != 2 || node.Rank() != topos[r].LocalRank || cross.Size() != 2 || cross.Rank() != topos[r].Node {
			return errors.New("split comms have the wrong ranks")
		}
		if err := commtest.Run(t.Context(), node, commtest.Options{RankOrder: true}); err != nil {
			return err
		}
		return commtest.Run(t.Context(), cross, commtest.Options{RankOrder: true})
	})
}

// TestStagedPoisoned: a staged collective whose peer never comes ends
// with the DeviceComm's abort within its timeout, and every later call
// on the staged comm is a *comm.PoisonedError naming that failure.
func TestStagedPoisoned(t *testing.T) {
	comms := group(t, 2, nccl.WithTimeout(100*time.Millisecond))
	var mem ncclmock.Memory
	s := staged.New(comms[0], &mem, 0, comm.Topology{})
	defer s.Close()
	err := s.AllReduce(t.Context(), make([]float32, 3))
	if !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("AllReduce without the peer: %v; want the DeviceComm's abort", err)
	}
	var pe *comm.PoisonedError
	if err := s.Barrier(t.Context()); !errors.As(err, &pe) {
		t.Fatalf("Barrier after the failure: %v; want a *comm.PoisonedError", err)
	}
	if _, _, err := s.Split(t.Context()); err == nil {
		t.Fatal("Split without a topology succeeded")
	}
}
