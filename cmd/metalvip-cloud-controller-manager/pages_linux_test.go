package main

import "testing"

func TestPageOutExecutableLowersTheResidentFilePages(t *testing.T) {
	before := statusKB("RssFile:")
	if before <= 0 {
		t.Fatalf("RssFile: %d kB", before)
	}
	n, err := pageOutExecutable()
	if err != nil {
		t.Fatalf("pageOutExecutable: %v", err)
	}
	if n == 0 {
		t.Fatal("no read-only mapping of the executable found in /proc/self/maps")
	}
	after := statusKB("RssFile:")
	t.Logf("%d mappings; resident file pages %d kB before, %d kB after", n, before, after)
	if after >= before {
		t.Errorf("resident file pages %d kB after, %d kB before: nothing released", after, before)
	}
}
