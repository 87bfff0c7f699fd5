"""`make bench`: side-by-side figures, as ratios measured in one run."""
