"""One-off investigations behind a model's terms (allocator, scratch, segments): tables, no target."""
