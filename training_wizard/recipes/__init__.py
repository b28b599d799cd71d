"""Recipes: one file per algorithm, each a Spec whose `main()` builds objects from specs and runs them."""
