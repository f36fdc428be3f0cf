"""The planner (issue 5): search parallel layouts for the fastest plan that fits, and write launch configs."""
