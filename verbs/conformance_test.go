package verbs_test

import (
	"testing"

	"github.com/rvma/rvma/verbs/verbstest"
)

func TestConformanceLoop(t *testing.T) { verbstest.Run(t, verbstest.Loop()) }

func TestConformanceUDP(t *testing.T) { verbstest.Run(t, verbstest.UDP()) }

func TestConformanceUDPLargestMTU(t *testing.T) { verbstest.Run(t, verbstest.UDPLargest()) }

func TestConformanceSHM(t *testing.T) { verbstest.Run(t, verbstest.SHM()) }

func TestConformanceSHMAlloc(t *testing.T) { verbstest.Run(t, verbstest.SHMAlloc()) }

func TestConformanceSHMPackets(t *testing.T) { verbstest.Run(t, verbstest.SHMPackets()) }
