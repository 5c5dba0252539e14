"""One module per tracker; each imports its library only when a run starts."""
