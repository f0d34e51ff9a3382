package netbench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/gradcomp/gradcomp/internal/outfile"
)

// WriteJSON writes results as an indented JSON array of Result objects,
// followed by a newline.
func WriteJSON(w io.Writer, results []Result) error {
	return outfile.WriteJSONArray(w, results)
}

// ReadJSON reads what WriteJSON wrote. Unknown fields are an error, so a
// file from another tool is not mistaken for results.
func ReadJSON(r io.Reader) ([]Result, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var results []Result
	if err := dec.Decode(&results); err != nil {
		return nil, fmt.Errorf("netbench: reading results: %w", err)
	}
	return results, nil
}

// Merge returns old without the results of the runs that fresh repeats,
// followed by fresh: a new run of a link on the same layout (ranks and
// nodes) replaces that run's rows, and rows of other layouts stay. Rows
// written before Result.Nodes existed (0) are replaced by any run of
// their link and rank count.
func Merge(old, fresh []Result) []Result {
	runs := map[runKey]bool{}
	for _, r := range fresh {
		runs[r.run()] = true
		runs[runKey{r.Link, r.Ranks, 0}] = true
	}
	kept := slices.DeleteFunc(slices.Clone(old), func(r Result) bool { return runs[r.run()] })
	return append(kept, fresh...)
}

// runKey identifies the run a result belongs to: its link and layout.
type runKey struct {
	link         string
	ranks, nodes int
}

// run returns r's runKey.
func (r Result) run() runKey { return runKey{r.Link, r.Ranks, r.Nodes} }

// WriteTable writes results as aligned text, one block per run (link and
// layout) in order of first appearance, each under a header naming the
// link, its probed rate, the layout and the gradient.
func WriteTable(w io.Writer, results []Result) error {
	var runs []runKey
	for _, r := range results {
		if !slices.Contains(runs, r.run()) {
			runs = append(runs, r.run())
		}
	}
	for i, run := range runs {
		if i > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		if err := writeBlock(w, slices.DeleteFunc(slices.Clone(results), func(r Result) bool { return r.run() != run })); err != nil {
			return err
		}
	}
	return nil
}

// writeBlock writes the rows of one link.
func writeBlock(w io.Writer, rows []Result) error {
	h := rows[0]
	rate := "not probed"
	if h.LinkGbps > 0 {
		rate = fmt.Sprintf("probed %.3g Gbit/s per rank", h.LinkGbps)
	}
	layout := fmt.Sprintf("%d ranks", h.Ranks)
	across := ""
	if h.Nodes > 1 {
		layout = fmt.Sprintf("%d nodes × %d ranks", h.Nodes, h.Ranks/h.Nodes)
		if h.Ranks == h.Nodes {
			layout = fmt.Sprintf("%d nodes × 1 rank", h.Nodes)
		}
		across = "; across MB = bytes the node's interfaces sent per rank per run"
	}
	if _, err := fmt.Fprintf(w, "# link %s (%s), %s, %d fp32 (%.1f MB), median of %d runs; speedup = dense s (the dense runs paired with the case's) / seconds; stage times summed over buckets%s\n",
		h.Link, rate, layout, h.Size, float64(h.Bytes)/1e6, len(h.Runs), across); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "strategy\tcodec\tdecision\tseconds\tdense s\tspeedup\tsent MB\t"
	if h.Nodes > 1 {
		head += "across MB\t"
	}
	fmt.Fprintln(tw, head+"compressed\tcompress s\texchange s\tdecompress s\trel err\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%.4f\t%.2f×\t%.2f\t", r.Strategy, r.Codec, r.Decision, r.Seconds, r.DenseSeconds, r.Speedup, float64(r.BytesSent)/1e6)
		if h.Nodes > 1 {
			fmt.Fprintf(tw, "%.2f\t", r.CrossNodeBytes/1e6)
		}
		fmt.Fprintf(tw, "%d/%d\t%.4f\t%.4f\t%.4f\t%s\t\n", r.Compressed, r.Buckets,
			r.CompressSeconds, r.ExchangeSeconds, r.DecompressSeconds, strconv.FormatFloat(r.RelErr, 'g', 3, 64))
	}
	return tw.Flush()
}
