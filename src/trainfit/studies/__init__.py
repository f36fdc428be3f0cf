"""Studies built on the engines: comparisons, sweeps and fit advice (no torch; they call trainfit.engines)."""
