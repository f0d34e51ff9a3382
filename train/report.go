package train

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/gradcomp/gradcomp/internal/outfile"
)

// WriteTable writes one row per result: the strategy, the final test accuracy, its
// difference in points from the uncompressed scheme (when one of the
// results is "none"), the bytes rank 0 sent per step and their ratio to
// none's (and, when a result exchanged hierarchically, the part of them
// that stayed in the node), and the mean step, exchange and exposed times
// in milliseconds. A run that diverged says so in a last column.
func WriteTable(w io.Writer, results []Result) error {
	base := baseline(results)
	inNode := slices.ContainsFunc(results, func(r Result) bool { return r.BytesInNodePerStep > 0 })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "scheme\tstrategy\ttest acc %\tΔ vs none\tbytes/step/rank\tvs none\t"
	if inNode {
		head += "in node\t"
	}
	fmt.Fprintln(tw, head+"step ms\texchange ms\texposed ms\t")
	for _, r := range results {
		delta, ratio := "-", "-"
		if base != nil {
			delta = fmt.Sprintf("%+.2f", 100*(r.FinalAccuracy-base.FinalAccuracy))
			if r.BytesPerStep > 0 {
				ratio = fmt.Sprintf("%.1f×", base.BytesPerStep/r.BytesPerStep)
			}
		}
		note := ""
		if r.Diverged > 0 {
			note = fmt.Sprintf("diverged at epoch %d", r.Diverged)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%.0f\t%s\t", r.Scheme, r.Strategy, 100*r.FinalAccuracy, delta, r.BytesPerStep, ratio)
		if inNode {
			fmt.Fprintf(tw, "%.0f\t", r.BytesInNodePerStep)
		}
		fmt.Fprintf(tw, "%.2f\t%.2f\t%.2f\t%s\n", ms(r.StepTime.Seconds()), ms(r.ExchangeTime.Seconds()), ms(r.ExposedTime.Seconds()), note)
	}
	return tw.Flush()
}

func ms(seconds float64) float64 { return 1e3 * seconds }

// baseline returns the result of the uncompressed scheme, or nil.
func baseline(results []Result) *Result {
	for i := range results {
		if results[i].Spec == "none" {
			return &results[i]
		}
	}
	return nil
}

// WriteJSON writes results as an indented JSON array of Result objects,
// curves included, followed by a newline.
func WriteJSON(w io.Writer, results []Result) error {
	return outfile.WriteJSONArray(w, results)
}

// WriteCSV writes the summary of results as CSV, one row per result, under
// a header of the JSON field names (times in nanoseconds; diverged 0 for a
// run that did not).
func WriteCSV(w io.Writer, results []Result) error {
	rows := [][]string{{"scheme", "spec", "error_feedback", "strategy", "ranks", "steps", "final_test_accuracy", "final_test_loss",
		"diverged", "bytes_per_step", "bytes_in_node_per_step", "step_ns", "exchange_ns", "exposed_ns"}}
	for _, r := range results {
		rows = append(rows, []string{r.Scheme, r.Spec, strconv.FormatBool(r.ErrorFeedback), r.Strategy, strconv.Itoa(r.Ranks),
			strconv.Itoa(r.Steps), float(r.FinalAccuracy), float(r.FinalLoss), strconv.Itoa(r.Diverged),
			float(r.BytesPerStep), float(r.BytesInNodePerStep), strconv.FormatInt(int64(r.StepTime), 10), strconv.FormatInt(int64(r.ExchangeTime), 10),
			strconv.FormatInt(int64(r.ExposedTime), 10)})
	}
	return writeCSV(w, rows)
}

// WriteCurvesCSV writes the per-epoch curves of results as CSV: scheme,
// epoch, train_loss, test_loss, test_accuracy, one row per scheme and epoch.
func WriteCurvesCSV(w io.Writer, results []Result) error {
	rows := [][]string{{"scheme", "epoch", "train_loss", "test_loss", "test_accuracy"}}
	for _, r := range results {
		for _, e := range r.Epochs {
			rows = append(rows, []string{r.Scheme, strconv.Itoa(e.Epoch), float(e.TrainLoss), float(e.TestLoss), float(e.TestAccuracy)})
		}
	}
	return writeCSV(w, rows)
}

// float formats v in the shortest form that reads back to the same float64.
func float(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func writeCSV(w io.Writer, rows [][]string) error {
	cw := csv.NewWriter(w)
	if err := cw.WriteAll(rows); err != nil {
		return err
	}
	return cw.Error()
}

// PlotCurves writes a PNG line plot of one per-epoch quantity (what picks it
// from an Epoch), one line per result, epoch on the x axis, with the legend
// in the top right corner if legendTop, else in the bottom right one.
func PlotCurves(w io.Writer, results []Result, title, ylabel string, legendTop bool, what func(Epoch) float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "epoch"
	p.Y.Label.Text = ylabel
	p.Legend.Top = legendTop
	p.Add(plotter.NewGrid())
	for i, r := range results {
		xys := make(plotter.XYs, len(r.Epochs))
		for j, e := range r.Epochs {
			xys[j] = plotter.XY{X: float64(e.Epoch), Y: what(e)}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("train: plotting %s: %w", r.Scheme, err)
		}
		line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(r.Scheme, line, points)
	}
	wt, err := p.WriterTo(16*vg.Centimeter, 11*vg.Centimeter, "png")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}

// Report file names under the output directory.
const (
	FileJSON     = "results.json"
	FileCSV      = "results.csv"
	FileCurves   = "curves.csv"
	FileAccuracy = "accuracy.png"
	FileLoss     = "loss.png"
)

// WriteReports writes every report of results into dir (created if
// missing): FileJSON, FileCSV, FileCurves, and the plots FileAccuracy (test
// accuracy in % per epoch) and FileLoss (test loss per epoch). It returns
// the paths written.
func WriteReports(dir string, results []Result) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{
		{FileJSON, func(w io.Writer) error { return WriteJSON(w, results) }},
		{FileCSV, func(w io.Writer) error { return WriteCSV(w, results) }},
		{FileCurves, func(w io.Writer) error { return WriteCurvesCSV(w, results) }},
		{FileAccuracy, func(w io.Writer) error {
			return PlotCurves(w, results, "Test accuracy", "accuracy (%)", false, func(e Epoch) float64 { return 100 * e.TestAccuracy })
		}},
		{FileLoss, func(w io.Writer) error {
			return PlotCurves(w, results, "Test loss", "cross-entropy", true, func(e Epoch) float64 { return e.TestLoss })
		}},
	} {
		path := filepath.Join(dir, f.name)
		if err := outfile.Write(path, f.write); err != nil {
			return paths, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// Title returns a one-line description of a run's settings for the head of
// a report.
func (c Config) Title(ranks int) string {
	widths := make([]string, len(c.Widths))
	for i, w := range c.Widths {
		widths[i] = strconv.Itoa(w)
	}
	return fmt.Sprintf("MLP %s, %d ranks × batch %d, %d epochs of %d digits (test %d), SGD lr %g momentum %g, seed %d",
		strings.Join(widths, "-"), ranks, c.Batch, c.Epochs, c.TrainSize, c.TestSize, c.LR, c.Momentum, c.Seed)
}
