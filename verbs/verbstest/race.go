//go:build race

package verbstest

// raceEnabled scales long tests down under the race detector.
const raceEnabled = true
