package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseHostList(t *testing.T) {
	cases := []struct {
		in   string
		want []host
		err  string
	}{
		{"a", []host{{"a", 1}}, ""},
		{"a:2,b,c:4", []host{{"a", 2}, {"b", 1}, {"c", 4}}, ""},
		{"a,a:3", []host{{"a", 4}}, ""},
		{"a:0", nil, "SLOTS 1 or more"},
		{"a:x", nil, "SLOTS 1 or more"},
		{"a,,b", nil, "empty host name"},
		{":3", nil, "no host name"},
	}
	for _, c := range cases {
		got, err := parseHostList(c.in)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
}

func TestParseHostfile(t *testing.T) {
	got, err := parseHostfile(strings.NewReader("# the cluster\nn1 slots=4\nn2:2 # two cores\n\nn3 slots=1 max_slots=8\nn1\n"), "hf")
	require.NoError(t, err)
	require.Equal(t, []host{{"n1", 5}, {"n2", 2}, {"n3", 1}}, got)
	for _, bad := range []struct{ in, err string }{
		{"n1 slots=0\n", "hf:1"},
		{"n1\nn2 cores=4\n", `hf:2: "n2 cores=4": unknown attribute "cores"`},
		{"n1 slots\n", "want slots=N"},
		{"# nothing\n", "no hosts"},
		{"a:x\n", "hf:1"},
	} {
		_, err := parseHostfile(strings.NewReader(bad.in), "hf")
		require.ErrorContains(t, err, bad.err, bad.in)
	}
}

func TestMapRanks(t *testing.T) {
	hs := []host{{"a", 2}, {"b", 3}}
	cases := []struct {
		n        int
		mapBy    string
		npernode int
		over     bool
		want     [][]int
		err      string
	}{
		{5, "slot", 0, false, [][]int{{0, 1}, {2, 3, 4}}, ""},
		{3, "slot", 0, false, [][]int{{0, 1}, {2}}, ""},
		{5, "node", 0, false, [][]int{{0, 2}, {1, 3, 4}}, ""},
		{6, "slot", 0, false, nil, "the hosts have 5 slots (--oversubscribe"},
		{7, "slot", 0, true, [][]int{{0, 1, 5, 6}, {2, 3, 4}}, ""},
		{7, "node", 0, true, [][]int{{0, 2, 5}, {1, 3, 4, 6}}, ""},
		{4, "", 2, false, [][]int{{0, 1}, {2, 3}}, ""},
		{5, "", 2, false, nil, "--npernode 2 on 2 hosts places 4"},
		{6, "", 3, false, nil, "a host has 2 slots"},
		{6, "", 3, true, [][]int{{0, 1, 2}, {3, 4, 5}}, ""},
		{2, "core", 0, false, nil, "want slot or node"},
	}
	for _, c := range cases {
		got, err := mapRanks(hs, c.n, c.mapBy, c.npernode, c.over)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, "%+v", c)
			continue
		}
		require.NoError(t, err, "%+v", c)
		require.Equal(t, c.want, got, "%+v", c)
	}
}
