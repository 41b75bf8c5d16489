"""Results: collect result.json files, aggregate per effective setting x task, text and grids."""
