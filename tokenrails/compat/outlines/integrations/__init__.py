"""outlines 0.0.x's ``outlines.integrations``: helpers that adapt other libraries' objects."""
