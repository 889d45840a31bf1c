package main

import "testing"

func TestDemo(t *testing.T) {
	if err := run("loop://verbsdemo-test", 64<<10); err != nil {
		t.Fatal(err)
	}
}
