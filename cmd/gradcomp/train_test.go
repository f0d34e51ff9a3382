package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTrainWritesReports(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "train")
	printed, file := gradcompJSON(t, dir, "train", "-ranks", "2", "-epochs", "2", "-train-size", "640", "-test-size", "200",
		"-configs", "none,topk:0.01+ef", "-out", dir, "-json", "-seed", "5")
	var saved []struct {
		Scheme        string  `json:"scheme"`
		Ranks         int     `json:"ranks"`
		Steps         int     `json:"steps"`
		BytesPerStep  float64 `json:"bytes_per_step"`
		FinalAccuracy float64 `json:"final_test_accuracy"`
		Epochs        []struct {
			Epoch        int     `json:"epoch"`
			TestAccuracy float64 `json:"test_accuracy"`
		} `json:"epochs"`
	}
	if err := json.Unmarshal(file, &saved); err != nil {
		t.Fatal(err)
	}
	if len(saved) != 2 || printed != 2 {
		t.Fatalf("%d results saved, %d printed; want 2", len(saved), printed)
	}
	for i, want := range []string{"none", "topk:0.01+ef"} {
		r := saved[i]
		if r.Scheme != want || r.Ranks != 2 || r.Steps != 2*640/(2*32) || len(r.Epochs) != 3 || r.BytesPerStep <= 0 {
			t.Errorf("result %d: %+v", i, r)
		}
		// Two short epochs are far above chance (0.1).
		if r.FinalAccuracy < 0.3 {
			t.Errorf("%s: final accuracy %.3f", r.Scheme, r.FinalAccuracy)
		}
	}
	if saved[1].BytesPerStep >= saved[0].BytesPerStep/4 {
		t.Errorf("top-k sent %.0f bytes per step, none %.0f", saved[1].BytesPerStep, saved[0].BytesPerStep)
	}
	for _, name := range []string{"results.csv", "curves.csv"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "topk:0.01+ef,") {
			t.Errorf("%s lacks the top-k rows:\n%s", name, b)
		}
	}
	checkPNGs(t, dir, "accuracy.png", "loss.png")
}

func TestTrainTable(t *testing.T) {
	code, stdout, stderr := gradcomp(t, "train", "-ranks", "2", "-epochs", "1", "-train-size", "256", "-test-size", "100",
		"-configs", "none", "-out", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if !strings.HasPrefix(stdout, "# MLP 64-256-128-10, 2 ranks") || !strings.Contains(stdout, "test acc %") {
		t.Errorf("stdout:\n%s", stdout)
	}
}

func TestTrainBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-configs", "topk:2"}, 1, "topk:2"},
		{[]string{"-configs", "none+ef"}, 1, "error feedback"},
		{[]string{"-ranks", "0"}, 1, "group size 0"},
		{[]string{"-epochs", "0"}, 1, "0 epochs"},
		{[]string{"-lr", "-1"}, 1, "learning rate"},
		{[]string{"stray"}, 2, "unexpected argument"},
		{[]string{"-nope"}, 2, "-nope"},
	} {
		code, _, stderr := gradcomp(t, append([]string{"train", "-out", t.TempDir()}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, stderr, tc.code, tc.msg)
		}
	}
}
