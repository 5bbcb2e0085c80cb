"""Every command's options, from CLI flags, exportkit.toml or the Python API's keyword arguments, built by
the same functions for both faces (one module per command, plus what they share): parsed once, at the boundary."""
