"""The paper's experiment configs, appended to the base config with +paper=<name> (docs/paper_recipe.md)."""
