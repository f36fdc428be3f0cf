"""Developer tools: checks on the code itself, not measurements of it."""
