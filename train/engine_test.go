package train

import (
	"context"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm/inproc"
)

// TestEngineSchemes trains the default schemes briefly through the overlap
// engine: each runs, the compressed ones send fewer bytes than none, and
// error feedback keeps top-k close to none where plain top-k lags.
func TestEngineSchemes(t *testing.T) {
	c := smallConfig()
	c.Epochs = 2
	schemes, err := ParseSchemes(DefaultSchemes + ",sign+ef@allgather,topk:0.01+ef+mc+ramp=5+guard=30,int4+ef+auto,powersgd:2+ef")
	if err != nil {
		t.Fatal(err)
	}
	// Three ranks: with two, the engine's auto strategy for the quantizers
	// is the all-gather, not SRA.
	group, err := inproc.NewGroup(3)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(group)
	results, err := Compare(context.Background(), group, c, schemes, EngineExchanger, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(schemes) {
		t.Fatalf("%d results for %d schemes", len(results), len(schemes))
	}
	wantStrategy := map[string]string{"none": "dense", "topk:0.01+ef": "sparse-gather", "topk:0.01": "sparse-gather",
		"int4+ef": "sra", "sign+ef": "sra", "sign+ef@allgather": "allgather", "topk:0.01+ef+mc+ramp=5+guard=30": "sparse-gather", "int4+ef+auto": "sra",
		"powersgd:2+ef": "low-rank"}
	none := results[0]
	for _, r := range results {
		t.Logf("%-18s %-13s accuracy %.3f, %6.0f bytes/step", r.Scheme, r.Strategy, r.FinalAccuracy, r.BytesPerStep)
		if r.Diverged > 0 || r.Steps != none.Steps {
			t.Errorf("%s: diverged %d, %d steps", r.Scheme, r.Diverged, r.Steps)
		}
		if want := wantStrategy[r.Scheme]; r.Strategy != want {
			t.Errorf("%s: strategy %s, want %s", r.Scheme, r.Strategy, want)
		}
		if r.Spec != "none" && !strings.HasSuffix(r.Scheme, "+auto") && r.BytesPerStep >= none.BytesPerStep/2 {
			t.Errorf("%s sent %.0f bytes per step, none %.0f", r.Scheme, r.BytesPerStep, none.BytesPerStep)
		}
	}
	// Chance is 0.1; none reaches about 0.65 here.
	if none.FinalAccuracy < 0.4 {
		t.Errorf("none: accuracy %.3f", none.FinalAccuracy)
	}
}
