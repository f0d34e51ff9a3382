package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressDelay is how long a run goes before a progress bar appears: short
// runs print nothing but their results.
const progressDelay = 3 * time.Second

// progress shows a run's progress as a bar on a terminal, once the run has
// lasted progressDelay. On anything but a terminal (a CI log, a file, a
// pipe) it shows nothing.
type progress struct {
	w     io.Writer
	label string
	start time.Time
	bar   *progressbar.ProgressBar
}

// newProgress returns a progress bar labelled label, writing to w.
func newProgress(w io.Writer, label string) *progress {
	return &progress{w: w, label: label, start: time.Now()}
}

// update is a progress callback (bench.Config.Progress, train.Compare):
// done of total units of work are finished.
func (p *progress) update(done, total int) {
	if p.bar == nil {
		if time.Since(p.start) < progressDelay {
			return
		}
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetVisibility(isTerminal(p.w)),
			progressbar.OptionSetDescription(p.label),
			progressbar.OptionShowCount(),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionClearOnFinish(),
		)
	}
	p.bar.Set(done)
}

// finish removes the bar, if one was shown.
func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
