"""A vLLM-shaped package for the simulated engine: the files sparkctl's patch step targets."""

__version__ = "0.23.0+sparkctl.sim"
