"""Console page tests from the pages branch: Dead letters, Schedules, Workflows, Start a run."""
