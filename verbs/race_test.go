//go:build race

package verbs_test

const raceEnabledVerbs = true
