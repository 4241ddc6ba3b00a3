"""Jobs built from the layers below: compare (every method under one budget), scaling (from scratch), inspect."""
