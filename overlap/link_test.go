package overlap

import (
	"context"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// slowLink emulates a slow network in front of an in-process rank: every
// collective, once done, takes α + V/β more, V being the bytes the rank
// sends by the package's accounting. The delay is a sleep, so the link
// costs no CPU, as a NIC's transfer would not.
type slowLink struct {
	comm.Comm
	alpha       time.Duration
	bytesPerSec float64
}

func slowGroup(comms []comm.Comm, alpha time.Duration, bytesPerSec float64) []comm.Comm {
	out := make([]comm.Comm, len(comms))
	for r, c := range comms {
		out[r] = &slowLink{Comm: c, alpha: alpha, bytesPerSec: bytesPerSec}
	}
	return out
}

func (s *slowLink) delay(ctx context.Context, err error, bytes int64) error {
	if err != nil {
		return err
	}
	t := time.NewTimer(s.alpha + time.Duration(float64(bytes)/s.bytesPerSec*1e9))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slowLink) AllReduce(ctx context.Context, buf []float32) error {
	return s.delay(ctx, s.Comm.AllReduce(ctx, buf), allReduceVolume(s.Size(), 4*len(buf)))
}

func (s *slowLink) AllGather(ctx context.Context, dst, src []byte) error {
	return s.delay(ctx, s.Comm.AllGather(ctx, dst, src), allGatherVolume(s.Size(), len(src)))
}

func (s *slowLink) AllToAll(ctx context.Context, dst, src []byte) error {
	return s.delay(ctx, s.Comm.AllToAll(ctx, dst, src), allToAllVolume(s.Size(), len(src)))
}
