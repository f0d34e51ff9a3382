package overlap

import (
	"testing"

	"github.com/gradcomp/gradcomp/comm"
)

func TestRamp(t *testing.T) {
	for spec, want := range map[string]string{
		"topk:0.01":           "10@topk:0.25,10@topk:0.0625,10@topk:0.015625",
		"topk:0.25":           "",
		"topk:0.2:sampled":    "10@topk:0.25:sampled",
		"randomk:0.05:seed=7": "10@randomk:0.25:seed=7,10@randomk:0.0625:seed=7",
		"int2:bucket=64":      "10@int8:bucket=64,10@int4:bucket=64",
		"int4:round=nearest":  "10@int8:round=nearest",
		"sign":                "10@int8,10@int4,10@int2",
		"int8":                "",
		"none":                "",
	} {
		phases, err := Ramp(spec, 10)
		if err != nil {
			t.Fatalf("Ramp(%s): %v", spec, err)
		}
		if got := FormatSchedule(phases); got != want {
			t.Errorf("Ramp(%s) = %q, want %q", spec, got, want)
		}
	}
	for _, bad := range []struct {
		spec  string
		steps int
	}{{"topk:0.01", 0}, {"topk:2", 10}, {"int9", 10}} {
		if _, err := Ramp(bad.spec, bad.steps); err == nil {
			t.Errorf("Ramp(%s, %d): no error", bad.spec, bad.steps)
		}
	}
	// Every ramp is a schedule the engine takes with its target.
	for _, spec := range []string{"topk:0.01", "randomk:0.05", "int2", "int4", "sign"} {
		phases, _ := Ramp(spec, 2)
		errs := onRanks(group(t, 2), func(r int, c comm.Comm) error {
			e, err := New(t.Context(), c, []int{100}, Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Schedule: phases})
			if err == nil {
				e.Close()
			}
			return err
		})
		mustNoErrors(t, spec, errs)
	}
}
