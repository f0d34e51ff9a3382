package doccheck

import (
	"fmt"
	"testing"
)

// TestReferences pins what TestGoIdentifiers takes for a reference.
func TestReferences(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"`kernels.DevicePtr` and `comm.Stream`", "[1 kernels.DevicePtr 1 comm.Stream]"},
		{"`overlap.Config.NodeSpec`, `compress.Parse(spec)`", "[1 overlap.Config.NodeSpec 1 compress.Parse]"},
		{"`comm/inproc.NewNodeGroup`", "[1 comm/inproc.NewNodeGroup]"},
		{"`gradcomp.torch.State`, `torch.distributed.all_reduce`, `gradcomp._host.TorchHost`", "[]"},
		{"`overlap/core.go`, `compress.test`, `lm.py`, `gc_engine_create`, `x-y.Z`", "[]"},
		{"`e.Step()`, `nccl.h`", "[1 e.Step]"}, // e is no package: resolve drops it
		{"a `` `kernels.X` `` span", "[1 kernels.X]"},
		{"an unclosed ` backtick, kernels.X", "[]"},
		{"```sh\ngo test ./compress -bench 'Codec/int8/n=64M'\noverlap.New\n```\n", "[]"},
		{"```go\ne, err := overlap.New(ctx, c, sizes, overlap.Config{})\n```\n`gpu.Ptr`", "[2 overlap.New 2 overlap.Config 4 gpu.Ptr]"},
		{"two\n`lines\nkernels.Y`", "[2 kernels.Y]"},
	} {
		var got []string
		for _, r := range references(c.text) {
			got = append(got, fmt.Sprint(r.line), r.text)
		}
		if s := fmt.Sprint(got); s != c.want {
			t.Errorf("references(%q) = %s, want %s", c.text, s, c.want)
		}
	}
}
